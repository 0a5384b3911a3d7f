"""``python -m asynccube demo``: concurrent tasks that create, compute and read back."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Final, cast

import numpy as np

from ..channel.progress import Progress, open_progress
from ..client.client import ComputeClient
from ..errors import InvalidArgument
from ..html import fmt_bytes
from ..memory.config import physical_memory
from ..runtime.devices import parse_device, probe_gpus
from ..runtime.open import open_client
from ..values.bindings import Bindings, CubeCount
from ..values.kernel import CudaSource, HostLaunch, Kernel

__all__ = [
    "MAX_ELEMENTS",
    "MAX_LAUNCHES",
    "MAX_ROUNDS",
    "MAX_TASKS",
    "DemoReport",
    "check_demo_args",
    "format_report",
    "run_demo",
]

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
    """What the demo did and measured.

    Attributes:
        device: The device string that ran it.
        device_name: The device's name.
        why: Why this device ran it (asked for, or the default and why).
        tasks: Concurrent tasks.
        elements: float32 elements per task.
        rounds: Chained SAXPY launches per task.
        seconds: Wall-clock time of the tasks (after a warm-up launch; opening the
            client excluded).
        compared: Results compared with numpy (each task's, and the warm-up's).
        matched: Results that matched.
        memory: Memory usage at the end.
    """

    device: str
    device_name: str
    why: str
    tasks: int
    elements: int
    rounds: int
    seconds: float
    compared: int
    matched: int
    memory: str

    @property
    def ok(self) -> bool:
        """True when results were compared and every one matched."""
        return self.compared > 0 and self.matched == self.compared


MAX_TASKS: Final = 100_000
"""Most concurrent tasks the demo runs."""
MAX_ELEMENTS: Final = 1 << 28
"""Most float32 elements per task (1 GiB per array)."""
MAX_ROUNDS: Final = 10_000
"""Most chained launches per task."""
MAX_LAUNCHES: Final = 10_000_000
"""Most launches in all (tasks times rounds)."""
BYTES_PER_ELEMENT: Final = 40
"""Memory one element of one task needs at once: ten float32 arrays (x, y, the expected
result, a temporary and the result read back on the host; x, y and two results on the
device)."""


def check_demo_args(tasks: object, elements: object, rounds: object, *, prefix: str = "") -> None:
    """Raise InvalidArgument naming the first argument that is not an int >= 1, is
    above its bound, or asks for more than half the machine's memory (``prefix``: how
    the names are written, ``"--"`` on the command line)."""
    bounds = (("tasks", tasks, MAX_TASKS), ("elements", elements, MAX_ELEMENTS),
              ("rounds", rounds, MAX_ROUNDS))  # fmt: skip
    for name, value, most in bounds:
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InvalidArgument(f"{prefix}{name} must be an integer >= 1, got {value!r}")
        if value > most:
            raise InvalidArgument(
                f"{prefix}{name} must be at most {most:,}, got {value:,}; give a smaller value"
            )
    n_tasks, n_rounds = cast(int, tasks), cast(int, rounds)
    if n_tasks * n_rounds > MAX_LAUNCHES:
        raise InvalidArgument(
            f"{prefix}tasks {n_tasks:,} x {prefix}rounds {n_rounds:,} is "
            f"{n_tasks * n_rounds:,} launches, over the demo's {MAX_LAUNCHES:,}; lower "
            f"{prefix}tasks or {prefix}rounds"
        )
    _check_demo_memory(n_tasks, cast(int, elements), prefix)


def _check_demo_memory(tasks: int, elements: int, prefix: str) -> None:
    memory = physical_memory()
    need = tasks * elements * BYTES_PER_ELEMENT
    if memory is not None and need > memory // 2:
        raise InvalidArgument(
            f"{prefix}tasks {tasks:,} x {prefix}elements {elements:,} needs about "
            f"{fmt_bytes(need)} of memory at once ({BYTES_PER_ELEMENT} bytes per element "
            f"per task), over half of this machine's {fmt_bytes(memory)}; lower "
            f"{prefix}tasks or {prefix}elements"
        )


async def _task(client: ComputeClient, seed: int, n: int, rounds: int) -> bool:
    """``rounds`` chained SAXPYs over ``n`` elements; True if the result matches numpy."""
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
            .with_buffers([hx, hy, out])
            .with_scalar(np.float32, [a])
            .with_scalar(np.uint32, [n])
        )
        client.execute(SAXPY, CubeCount(-(-n // _BLOCK)), bindings)
        expected = a * x + expected
        hy = out
    got = await client.read_array(hy, np.float32)
    return bool(got.shape == expected.shape and np.allclose(got, expected, rtol=1e-5))


async def _counted(progress: Progress, task: Awaitable[bool]) -> bool:
    """``await task``, then one step of ``progress``."""
    result = await task
    progress.step("done")
    return result


async def _choose_device(device: str | None) -> tuple[str, str]:
    """The device to run on and why."""
    if device is not None:
        parse_device(device)  # InvalidArgument for an unknown device
        return device, "as asked"
    probe = await asyncio.get_running_loop().run_in_executor(None, probe_gpus)
    if probe.usable:
        return "cuda:0", "the default: a GPU and its driver are usable"
    return "host", f"the default, as no GPU is usable: {probe.reason}"


async def run_demo(
    device: str | None = None, tasks: int = 8, elements: int = 1 << 16, rounds: int = 4
) -> DemoReport:
    """Run ``tasks`` concurrent tasks of ``rounds`` chained SAXPYs over ``elements``
    float32 each, after one warm-up launch, and compare every result with numpy."""
    check_demo_args(tasks, elements, rounds)
    chosen, why = await _choose_device(device)
    async with open_client(chosen) as client:
        warm = await _task(client, tasks, _BLOCK, 1)  # compiles and loads the kernel
        start = time.perf_counter()
        progress = await open_progress(tasks, f"demo on {chosen}")
        try:
            results = await asyncio.gather(
                *(_counted(progress, _task(client, s, elements, rounds)) for s in range(tasks))
            )
        finally:
            progress.close()
        seconds = time.perf_counter() - start
        await client.sync()  # then every handle the tasks dropped counts as free
        usage = await client.memory_usage()
        matched = sum(results) + warm
        return DemoReport(
            client.device, client.properties.name, why, tasks, elements, rounds, seconds,
            len(results) + 1, matched, str(usage),
        )  # fmt: skip


def format_report(report: DemoReport) -> str:
    """The demo's printed summary."""
    verdict = "" if report.ok else "  MISMATCH: the device disagrees with numpy"
    return "\n".join(
        [
            f"device:   {report.device} ({report.device_name}): {report.why}",
            f"tasks:    {report.tasks} concurrent, each {report.rounds} chained SAXPY "
            f"launches over {report.elements} float32 elements",
            f"checked:  {report.matched}/{report.compared} results match numpy "
            f"({report.tasks} tasks and 1 warm-up, every element){verdict}",
            f"time:     {report.seconds * 1e3:.1f} ms wall clock for the {report.tasks} tasks "
            "(create, launches, read back; after a warm-up launch, which compiles the "
            "kernel on CUDA; opening the client excluded)",
            f"memory:   {report.memory}",
        ]
    )
