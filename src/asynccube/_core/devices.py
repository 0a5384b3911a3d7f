"""Finding devices and making the server for a device string."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .errors import InvalidArgument
from .host.server import HostServer
from .server import ComputeServer

if TYPE_CHECKING:
    from .settings import Settings

__all__ = ["GpuProbe", "make_server", "parse_device", "probe_gpus"]

_DEVICE = re.compile(r"^(host|cuda)(?::(\d+))?$")


@dataclass(frozen=True, slots=True)
class GpuProbe:
    """What a look for GPUs found.

    Attributes:
        usable: True if at least one CUDA device can be used.
        reason: Why no GPU is used (empty when usable).
        devices: ``"cuda:N  <name>"`` for each device found.
    """

    usable: bool
    reason: str
    devices: list[str] = field(default_factory=list)


def parse_device(device: str) -> tuple[str, int]:
    """``"cuda:1"`` -> ("cuda", 1); ``"host"`` -> ("host", 0)."""
    match = _DEVICE.match(device.strip().lower()) if isinstance(device, str) else None
    if match is None:
        raise InvalidArgument(f"unknown device {device!r}; use 'host', 'cuda' or 'cuda:N'")
    return match.group(1), int(match.group(2) or 0)


def probe_gpus() -> GpuProbe:
    """Look for CUDA devices (blocking: call it off the event loop). Never raises."""
    try:
        from .cuda.driver import list_devices
    except ImportError as exc:
        return GpuProbe(False, f"the CUDA server is not available: {exc}")
    try:
        devices = list_devices()
    except Exception as exc:
        return GpuProbe(False, f"no usable CUDA driver: {exc}")
    if not devices:
        return GpuProbe(False, "the CUDA driver found no GPU")
    return GpuProbe(True, "", devices)


async def make_server(device: str | None) -> ComputeServer:
    """The server for ``device`` (None: the first usable GPU, else the host)."""
    from .settings import load_settings

    loop = asyncio.get_running_loop()
    settings = await loop.run_in_executor(None, load_settings)
    if device is None:
        probe = await loop.run_in_executor(None, probe_gpus)
        device = "cuda:0" if probe.usable else "host"
    kind, index = parse_device(device)
    if kind == "host":
        return HostServer(**settings.host_server_options())
    return await _make_cuda(index, settings)


async def _make_cuda(index: int, settings: Settings) -> ComputeServer:
    from .cuda.server import open_cuda_server

    server: ComputeServer = await open_cuda_server(index, settings)
    return server
