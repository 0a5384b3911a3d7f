"""``python -m asynccube demo``: concurrent tasks that create, compute and read back."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import numpy as np

from .bindings import Bindings, CubeCount
from .client import ComputeClient
from .kernel import CudaSource, HostLaunch, Kernel
from .open import open_client

__all__ = ["DemoReport", "run_demo"]

_BLOCK = 256

_SAXPY_CUDA = r"""
extern "C" __global__ void saxpy(const float* x, const float* y, float* out, float a,
                                 unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a * x[i] + y[i];
}
"""


def _saxpy_host(launch: HostLaunch) -> None:
    x, y, out = (b.view(np.float32) for b in launch.buffers)
    n = int(launch.scalar(np.uint32))
    out[:n] = float(launch.scalar(np.float32)) * x[:n] + y[:n]


SAXPY = Kernel(
    "asynccube_demo_saxpy",
    cuda=CudaSource(_SAXPY_CUDA, entry="saxpy", block=(_BLOCK, 1, 1)),
    host=_saxpy_host,
)
"""out = a * x + y over float32 (a float32 scalar, n a uint32 scalar)."""


@dataclass(frozen=True, slots=True)
class DemoReport:
    """What the demo did and measured."""

    device: str
    device_name: str
    tasks: int
    elements: int
    seconds: float
    checked: int
    memory: str


async def _task(client: ComputeClient, seed: int, n: int, rounds: int) -> int:
    rng = np.random.default_rng(seed)
    x = rng.random(n, dtype=np.float32)
    y = rng.random(n, dtype=np.float32)
    hx, hy = client.create(x), client.create(y)
    expected = y
    for r in range(rounds):
        a = np.float32(r + 1)
        out = client.empty(4 * n)
        bindings = (
            Bindings()
            .with_buffers([hx.binding(), hy.binding(), out.binding()])
            .with_scalar(np.float32, [a])
            .with_scalar(np.uint32, [n])
        )
        client.execute(SAXPY, CubeCount(-(-n // _BLOCK)), bindings)
        expected = a * x + expected
        hy = out
    got = await client.read_array(hy, np.float32)
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    return n


async def run_demo(
    device: str | None = None, tasks: int = 8, elements: int = 1 << 16, rounds: int = 4
) -> DemoReport:
    """Run ``tasks`` concurrent tasks of chained SAXPYs; check each against numpy."""
    async with open_client(device) as client:
        start = time.perf_counter()
        done = await asyncio.gather(
            *(_task(client, seed, elements, rounds) for seed in range(tasks))
        )
        seconds = time.perf_counter() - start
        usage = await client.memory_usage()
        return DemoReport(
            client.device, client.properties.name, tasks, sum(done), seconds, len(done), str(usage)
        )


def format_report(report: DemoReport) -> str:
    """The demo's printed summary."""
    return "\n".join(
        [
            f"device:   {report.device} ({report.device_name})",
            f"tasks:    {report.tasks} concurrent, {report.elements} elements in all",
            f"checked:  {report.checked}/{report.tasks} results match numpy",
            f"time:     {report.seconds * 1e3:.1f} ms",
            f"memory:   {report.memory}",
        ]
    )
