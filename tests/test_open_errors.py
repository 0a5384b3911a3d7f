"""Every failure to open a device is a DeviceError saying what is missing and what to
do (issue 10, finding 2)."""

from __future__ import annotations

import asyncio

import pytest

import asynccube as ac
from asynccube._core.cuda import server as cuda_server
from asynccube._core.errors import CudaDriverError
from asynccube._core.runtime import devices

pytestmark = pytest.mark.asyncio


@pytest.mark.skipif(devices.probe_gpus().usable, reason="a GPU is usable here")
async def test_cuda_without_a_driver_is_a_device_error() -> None:
    with pytest.raises(ac.DeviceError, match="cannot open cuda:0") as info:
        async with ac.open_client("cuda:0"):
            pass  # pragma: no cover
    message = str(info.value)
    assert "open_client('host')" in message and "python -m asynccube info" in message
    assert info.value.__cause__ is None and info.value.__suppress_context__


async def test_a_missing_cuda_module_is_a_device_error(monkeypatch: pytest.MonkeyPatch) -> None:
    async def broken(*args: object) -> None:
        raise ImportError("No module named 'cuda.bindings'")

    monkeypatch.setattr(cuda_server, "open_cuda_server", broken)
    monkeypatch.setattr(devices, "probe_gpus", lambda: devices.GpuProbe(False, "no driver"))
    with pytest.raises(ac.DeviceError, match=r"no driver.*ImportError.*open_client\('host'\)"):
        await ac.connect("cuda")


async def test_a_gpu_index_not_present_names_the_gpus_found(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def invalid(*args: object) -> None:
        raise CudaDriverError(101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal")

    found = devices.GpuProbe(True, "", ["cuda:0  NVIDIA H100"])
    monkeypatch.setattr(cuda_server, "open_cuda_server", invalid)
    monkeypatch.setattr(devices, "probe_gpus", lambda: found)
    with pytest.raises(ac.DeviceError, match=r"no GPU cuda:3 \(found: cuda:0  NVIDIA H100\)"):
        await ac.connect("cuda:3")


_IMPORT_THREAD = """
import asyncio, sys, threading
import asynccube as ac

assert "asynccube._core.cuda.server" not in sys.modules
seen = {}

class Spy:
    def find_spec(self, name, path=None, target=None):
        if name in ("asynccube._core.cuda.server", "asynccube._core.cuda.driver"):
            seen.setdefault(name, threading.current_thread() is threading.main_thread())
        return None

sys.meta_path.insert(0, Spy())

async def main():
    for dry in (False, True):
        try:
            async with ac.open_client("cuda:0", dry_run=dry):
                pass
        except ac.AsyncCubeError:
            pass  # no GPU here: what matters is where the modules were imported

asyncio.run(main())
print(sorted(seen.items()))
"""


async def test_the_cuda_modules_are_imported_off_the_loop() -> None:
    """Opening the first CUDA client (or a dry run sized like one) imports the CUDA
    server's modules, tens of milliseconds with cuda-bindings, in a worker thread: the
    loop keeps serving meanwhile (a fresh interpreter, so nothing is imported yet)."""
    import subprocess
    import sys

    command = [sys.executable, "-c", _IMPORT_THREAD]
    done = await asyncio.to_thread(
        subprocess.run, command, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    seen = done.stdout.strip().splitlines()[-1]
    assert "'asynccube._core.cuda.driver', False" in seen, seen
    assert "'asynccube._core.cuda.server', False" in seen, seen
