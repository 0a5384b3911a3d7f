"""The pytest plugin's half that needs asynccube (its light half, loaded into every
pytest run, is :mod:`_asynccube_pytest.plugin`; it imports this module only for a test
that uses asynccube's fixtures or markers).

* :func:`device_list`: the devices ``asynccube_device`` runs a test on.
* :func:`gpu_probe`: whether a GPU is usable (the skip of GPU-marked tests); the CUDA
  server's modules imported then, where one is.
* :func:`open_checked`: the client of ``asynccube_client``: opened on the running loop,
  checked and closed after the test (errors nobody awaited are raised by ``close()``;
  bytes still in use fail the test).
"""

from __future__ import annotations

import functools
import gc
import importlib
from collections.abc import AsyncIterator

import pytest

from ..client.client import ComputeClient
from ..errors import InvalidArgument
from ..runtime.devices import GpuProbe, parse_device, probe_gpus
from ..runtime.open import connect

__all__ = ["device_list", "gpu_probe", "open_checked"]


@functools.cache
def gpu_probe() -> GpuProbe:
    """What a look for GPUs found (once per process, at collection). Where one is
    usable, the CUDA server's modules are imported now, before any test's loop runs: a
    process's first ``open_client`` on a GPU imports them in a worker thread, which
    holds the GIL while each module runs (2-6 ms a module on a 2-core host), and the
    loop-lag probe would charge that once-only wait to whichever GPU test came first."""
    probe = probe_gpus()
    if probe.usable:
        try:
            importlib.import_module("asynccube._core.cuda.server")
        except ImportError:  # the test's own open then says what is missing
            pass
    return probe


def device_list(named: str | None) -> list[str]:
    """The devices of ``--asynccube-devices`` (each checked), else the host and each
    usable GPU (``cuda:0`` where none is: its tests are then skipped, with the reason)."""
    if named:
        devices = [d.strip() for d in named.split(",") if d.strip()]
        for device in devices:
            try:
                parse_device(device)
            except InvalidArgument as exc:
                raise pytest.UsageError(f"--asynccube-devices: {exc}") from None
        return devices
    gpus = [entry.split()[0] for entry in gpu_probe().devices] or ["cuda:0"]
    return ["host", *gpus]


async def open_checked(device: str) -> AsyncIterator[ComputeClient]:
    """A client on ``device`` and the running loop, checked and closed after."""
    client = await connect(device)
    try:
        yield client
    finally:
        if not client.closed:
            await _check_and_close(client)


async def _check_and_close(client: ComputeClient) -> None:
    """Close (raising errors nobody awaited), failing on bytes still in use."""
    usage = None
    for _ in range(3):  # an event loop may keep the last callback it ran for one more step
        gc.collect()
        await client.sync()
        usage = await client.memory_usage()
        if not usage.bytes_in_use:
            break
    assert usage is not None
    await client.close()
    if usage.bytes_in_use:
        pytest.fail(
            f"asynccube_client: {usage.bytes_in_use} bytes still in use after the test "
            f"({usage.number_allocs} allocations): a handle outlived the test; drop every "
            "handle (del, or let it go out of scope) before the test ends"
        )
