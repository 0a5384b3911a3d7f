"""A sticky device error: the client becomes unhealthy, nothing hangs, and once it is
closed a new client either works or (where the driver keeps refusing the device for the
rest of the process, as NVIDIA documents for sticky errors) raises a DeviceError that says
to restart the process.

The scenario runs in a child process: a sticky error may leave the process's CUDA
context unusable, and the rest of the suite must not depend on how the driver recovers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.cuda, pytest.mark.device_fault]

SCENARIO = r"""
import asyncio, json, sys
import numpy as np
import asynccube as ac
from tests.kernels import ADD, add_bindings, blocks
from tests.test_cuda_server import SPIN, spin_bindings

CRASH = ac.Kernel("crash", cuda=ac.CudaSource(
    'extern "C" __global__ void crash(int* p) { *(volatile int*)0x10 = 1; p[0] = 2; }',
    entry="crash", block=(1, 1, 1)))
out = {}

async def expect_device_error(name, call):
    try:
        await asyncio.wait_for(call(), 10)
        out[name] = "no error"
    except ac.DeviceError as exc:
        out[name] = str(exc)
    except BaseException as exc:
        out[name] = f"{type(exc).__name__}: {exc}"

async def main():
    client = await ac.connect("cuda:0")
    h = client.create(np.zeros(4, np.int32))
    client.execute(SPIN, ac.CubeCount(1), spin_bindings(0.0))
    await client.sync()
    client.execute(CRASH, ac.CubeCount(1), ac.Bindings().with_buffer(h))
    pending = client.read([h])
    await expect_device_error("read_after_crash", lambda: pending)
    await expect_device_error("sync_after", client.sync)
    await expect_device_error("sync_again", client.sync)
    try:
        await asyncio.wait_for(client.close(), 10)
        out["close"] = "ok"
    except ac.AsyncCubeError as exc:
        out["close"] = f"raised {type(exc).__name__}"
    except TimeoutError:
        out["close"] = "HUNG"
    try:
        async with ac.open_client("cuda:0") as fresh:
            a = np.arange(1000, dtype=np.float32)
            ha, hb, o = fresh.create(a), fresh.create(a), fresh.empty(4000)
            fresh.execute(ADD, blocks(1000), add_bindings(ha, hb, o, 1000))
            (raw,) = await asyncio.wait_for(fresh.read([o]), 10)
            out["new_client"] = bool(np.array_equal(np.frombuffer(raw, np.float32), 2 * a))
    except BaseException as exc:
        out["new_client"] = f"{type(exc).__name__}: {exc}"

asyncio.run(main())
print("RESULT " + json.dumps(out))
"""


def test_sticky_error_fails_everything_then_a_new_client_works() -> None:
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(root), str(root / "src"), env.get("PYTHONPATH", "")])
    )
    proc = subprocess.run(
        [sys.executable, "-c", SCENARIO],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, f"scenario died (rc={proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    out = json.loads(lines[-1][len("RESULT ") :])
    for key in ("read_after_crash", "sync_after", "sync_again"):
        assert "CUDA_ERROR_ILLEGAL_ADDRESS" in out[key], out
    assert out["close"] != "HUNG", out
    assert out["new_client"] is True or "Restart the process" in out["new_client"], out
