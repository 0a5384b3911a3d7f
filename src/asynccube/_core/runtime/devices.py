"""Finding devices and making the server for a device string."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING

from ..channel.backend import run_blocking
from ..errors import AsyncCubeError, CudaDriverError, DeviceError, InvalidArgument
from ..host.dry import DryRunServer
from ..host.server import HostServer
from ..server.protocol import ComputeServer

if TYPE_CHECKING:
    from ..config.config import AsyncCubeConfig, ConfigOverrides
    from ..server.settings import Settings

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
        raise InvalidArgument(
            f"unknown device {device!r}; use 'host', 'cuda' or 'cuda:N' "
            "(`python -m asynccube info` lists the devices found)"
        )
    kind, index = match.group(1), int(match.group(2) or 0)
    if kind == "host" and index != 0:
        raise InvalidArgument(
            f"unknown device {device!r}: there is one host device, 'host' (or 'host:0'); "
            "use 'host', or 'cuda:N' for GPU N"
        )
    return kind, index


def probe_gpus() -> GpuProbe:
    """Look for CUDA devices (blocking: call it off the event loop). Never raises."""
    try:
        from ..cuda.driver import list_devices
    except ImportError as exc:
        return GpuProbe(False, f"the CUDA server is not available: {exc}")
    try:
        devices = list_devices()
    except Exception as exc:
        return GpuProbe(False, f"no usable CUDA driver: {exc}")
    if not devices:
        return GpuProbe(False, "the CUDA driver found no GPU")
    return GpuProbe(True, "", devices)


async def make_server(
    device: str | None,
    config: ConfigOverrides | AsyncCubeConfig | None = None,
    *,
    dry_run: bool = False,
) -> ComputeServer:
    """The server for ``device`` (None: the first usable GPU, else the host), configured
    from the file, the environment, then ``config`` (validated like the file); with
    ``dry_run``, a :class:`DryRunServer` standing for that device."""
    from ..server.settings import load_settings

    if device is not None:
        parse_device(device)  # a bad device string fails before any blocking work
    settings = await run_blocking(load_settings, None, config)
    if device is None:
        probe = await run_blocking(probe_gpus)
        device = "cuda:0" if probe.usable else "host"
    kind, index = parse_device(device)
    if dry_run:
        return await _make_dry(kind, index, settings)
    if kind == "host":
        return HostServer(**settings.host_server_options())
    return await _make_cuda(index, settings)


async def _make_dry(kind: str, index: int, settings: Settings) -> ComputeServer:
    """A dry run's server: the host's, or sized like GPU ``index`` (its properties,
    alignment and memory; nothing is opened on it)."""
    if kind == "host":
        return DryRunServer(**settings.host_server_options())
    try:
        driver = await run_blocking(_cuda_driver)  # importing it takes tens of ms
        target = await run_blocking(driver.device_properties, index)
    except AsyncCubeError as exc:
        if not isinstance(exc, CudaDriverError) or exc.name != "CUDA_ERROR_INVALID_DEVICE":
            raise
        failure: BaseException = exc
    except Exception as exc:  # no driver library, no cuda-bindings, driver too old, ...
        failure = exc
    else:
        options = settings.host_server_options()
        options["memory"] = settings.pool_layout(target.max_allocation)
        return DryRunServer(target=target, alignment=driver.ALIGNMENT, **options)
    probe = await run_blocking(probe_gpus)
    raise cannot_open(index, probe, failure) from None


async def _make_cuda(index: int, settings: Settings) -> ComputeServer:
    """The CUDA server for GPU ``index``; any failure to open it is a DeviceError."""
    try:
        cuda = await run_blocking(_cuda_server)  # importing it takes tens of ms
        server: ComputeServer = await cuda.open_cuda_server(index, settings)
        return server
    except AsyncCubeError as exc:
        if not isinstance(exc, CudaDriverError) or exc.name != "CUDA_ERROR_INVALID_DEVICE":
            raise
        failure: BaseException = exc
    except Exception as exc:  # no driver library, no cuda-bindings, driver too old, ...
        failure = exc
    probe = await run_blocking(probe_gpus)
    raise cannot_open(index, probe, failure) from None


def _cuda_server() -> ModuleType:
    """The CUDA server's module, imported in a worker thread (cuda-bindings and the
    server's modules take tens of milliseconds to import: not on the loop)."""
    from ..cuda import server

    return server


def _cuda_driver() -> ModuleType:
    """The CUDA driver's module (as :func:`_cuda_server`)."""
    from ..cuda import driver

    return driver


def cannot_open(index: int, probe: GpuProbe, failure: BaseException) -> DeviceError:
    """The DeviceError for GPU ``index`` failing to open: what is missing, what to do."""
    if probe.usable:
        found = "; ".join(probe.devices)
        what = f"there is no GPU cuda:{index} (found: {found})"
        todo = "use one of those, or 'host'"
    else:
        what = probe.reason or "the CUDA driver could not be used"
        todo = (
            "install the NVIDIA driver on a machine with an NVIDIA GPU, or use the numpy "
            "host server: open_client('host') (the default device when no GPU is usable)"
        )
    cause = "" if str(failure) in what else f" (cause: {type(failure).__name__}: {failure})"
    error = DeviceError(
        f"cannot open cuda:{index}: {what.rstrip('. ')}{cause}; {todo}. "
        "`python -m asynccube info` shows the devices found"
    )
    error.__suppress_context__ = True
    return error
