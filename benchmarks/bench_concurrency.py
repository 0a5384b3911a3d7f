"""Where concurrency pays (issue 38): the request as users write it, with a kernel that
keeps its stream busy for a while, at 1, 8 and 64 concurrent tasks.

``bench_requests.py``'s request (``create(body)``, ``empty``, a fresh ``Bindings``,
``execute`` of ``y = 2x + 1``, ``await read``) ends within a few µs on the device: a
read then spins on its copy, and 64 tasks cost what one does. Real requests run kernels
of tens of µs. Here each request first launches a kernel that keeps its stream busy for
``--kernel-us`` µs (the device's clock, one thread), then the same steps. While the device
works for one task, its read suspends it (``FastLaunch.read`` defers once recent reads
spun long: ``cuda/fast.py``), and the loop runs the other tasks' host work: the time
per request should fall from 1 to 64 tasks. Beside it: CuPy blocking (the same spin and
``y = 2x + 1`` as ``RawKernel``s, one request at a time) and CuPy with a stream per
worker thread (``asyncio.to_thread``), in the same run.

    python benchmarks/bench_concurrency.py --device cuda:0 --kernel-us 0,20,100

Writes ``results/concurrency.{md,json}`` (``--no-write``: print only). Needs a GPU.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from _common import table
from _cuda_client import ADD_SRC as SPIN_SRC  # holds the spin kernel bench_cuda uses
from _service_work import Y_SRC
from bench_requests import (
    Unavailable,
    Work,
    _gpu_index,
    cupy_calls,
    cupy_device,
    default_device,
    measure,
    measure_blocking,
    publish,
    run_on,
    threaded_request,
    work_for,
    y2x1_kernel,
)

TASKS = (1, 8, 64)
LOOPS = ("asyncio", "uvloop")
SIZE = 1024
Key = tuple[str, int, int]  # (library or loop, kernel µs, tasks)


def asynccube_request(client: Any, kernels: tuple[Any, Any], work: Work, ns: int) -> Any:
    """The request with a spin of ``ns`` ns first (none at 0)."""
    import asynccube as ac

    spin, y2x1 = kernels
    n, nbytes = work.n, work.size
    count, one = ac.CubeCount((n + 255) // 256), ac.CubeCount(1)
    busy = ac.Bindings().with_scalar(np.uint64, [ns])

    async def request(body: bytes) -> bytes:
        x = client.create(body)
        y = client.empty(nbytes)
        bindings = ac.Bindings().with_buffers([x.binding(), y.binding()])
        if ns:
            client.execute(spin, one, busy)
        client.execute(y2x1, count, bindings.with_scalar(np.uint32, [n]))
        (out,) = await client.read([y.binding()])
        return out  # type: ignore[no-any-return]

    return request


def cupy_request(device: str, work: Work, ns: int, streams: bool) -> Callable[[bytes], Any]:
    """CuPy: ``asarray``, the spin, ``empty_like``, ``y = 2x + 1``, ``.get()``."""
    cp, gpu = cupy_device(device)
    with gpu:
        spin, y2x1 = cp.RawKernel(SPIN_SRC, "spin"), cp.RawKernel(Y_SRC, "y2x1")
    n, busy = np.uint32(work.n), np.uint64(ns)
    grid = ((work.n + 255) // 256,)

    def one(body: bytes) -> Any:
        x = cp.asarray(np.frombuffer(body, np.float32))
        if ns:
            spin((1,), (1,), (busy,))
        y = cp.empty_like(x)
        y2x1(grid, (256,), (x, y, n))
        return y.get()

    return cupy_calls(gpu, one, streams)


def _median(values: list[float]) -> float:
    return statistics.median(values)


def asynccube_figures(device: str, loop: str, kernel_us: Sequence[int], requests: int,
                      runs: int) -> dict[Key, float]:  # fmt: skip
    """µs per request of asynccube on ``loop`` for every (kernel µs, tasks)."""

    async def main() -> dict[Key, float]:
        import asynccube as ac

        spin = ac.Kernel("bench_concurrency_spin", cuda=ac.CudaSource(SPIN_SRC, "spin", (1, 1, 1)))
        kernels = (spin, y2x1_kernel())
        work = work_for(SIZE)
        out: dict[Key, float] = {}
        async with ac.open_client(device) as client:
            for us in kernel_us:
                request = asynccube_request(client, kernels, work, us * 1000)
                await measure(loop, request, work, 1, 64)  # compile, load, pools
                await measure(loop, request, work, max(TASKS), 2 * max(TASKS))
                for tasks in TASKS:
                    walls = [(await measure(loop, request, work, tasks, requests))[0]
                             for _ in range(runs)]  # fmt: skip
                    out[(loop, us, tasks)] = _median(walls)
        return out

    return run_on(loop, main)  # type: ignore[no-any-return]


def cupy_figures(device: str, kernel_us: Sequence[int], requests: int,
                 runs: int) -> dict[Key, float]:  # fmt: skip
    """µs per request of CuPy blocking (1 task) and with a stream per thread."""
    work = work_for(SIZE)
    out: dict[Key, float] = {}
    for us in kernel_us:
        blocking = cupy_request(device, work, us * 1000, streams=False)
        out[("cupy", us, 1)] = _median(
            [measure_blocking(blocking, work, requests)[0] for _ in range(runs)]
        )
        threaded = threaded_request(cupy_request(device, work, us * 1000, streams=True))

        async def main(req: Any = threaded) -> dict[int, float]:
            await measure("asyncio", req, work, max(TASKS), 2 * max(TASKS), check=True)
            got: dict[int, float] = {}
            for t in TASKS:
                walls = [(await measure("asyncio", req, work, t, requests))[0]
                         for _ in range(runs)]  # fmt: skip
                got[t] = _median(walls)
            return got

        for tasks, v in asyncio.run(main()).items():
            out[("cupy_threads", us, tasks)] = v
    return out


def report(figs: dict[Key, float], kernel_us: Sequence[int], loops: Sequence[str],
           command: str) -> tuple[str, dict[str, Any]]:  # fmt: skip
    """The markdown section and the JSON figures."""

    def f(key: Key) -> str:
        v = figs.get(key)
        return "" if v is None else f"{v:.1f}"

    rows = []
    for us in kernel_us:
        cupy = figs.get(("cupy", us, 1))
        for tasks in TASKS:
            row = [f"{us} µs", str(tasks)]
            row += [f((loop, us, tasks)) for loop in loops]
            row += [f(("cupy_threads", us, tasks)), f(("cupy", us, 1)) if tasks == 1 else ""]
            first = figs.get((loops[0], us, tasks))
            row.append("" if cupy is None or first is None else f"{first / cupy:.2f}x")
            one = figs.get((loops[0], us, 1))
            row.append(f"{first / one:.2f}x" if tasks > 1 and first and one else "-")
            rows.append(row)
    header = ["kernel", "tasks", *(f"asynccube {loop}" for loop in loops),
              "CuPy stream per thread", "CuPy blocking", f"{loops[0]} / CuPy blocking",
              f"{loops[0]}: vs 1 task"]  # fmt: skip
    body = (
        "µs per request (wall time over all requests; median of the runs), 1 KiB bodies:\n\n"
        + table(header, rows)
        + "\n\nA request: `create(body)`, `empty`, a fresh `Bindings`, `execute` of a kernel "
        "that keeps its stream busy for the row's µs (one thread, the device's clock; none "
        "at 0), `execute` of `y = 2x + 1`, `await read`. Below 1.00x in the last column: "
        "the time per request falls from 1 task to that many (concurrency pays).\n\n"
        f"Command: `python benchmarks/bench_concurrency.py {command}`.\n"
    )
    return body, {f"{k[0]}/{k[1]}us/{k[2]}": v for k, v in figs.items()}


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="", help="cuda:N (default: cuda:0 if usable)")
    ap.add_argument("--kernel-us", default="0,20,100", help="µs each request's kernel runs")
    ap.add_argument("--loops", default=",".join(LOOPS))
    ap.add_argument("--requests", type=int, default=2048, help="requests per figure")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--no-write", action="store_true", help="print only (no results/ files)")
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[Key, float]:
    """Run the benchmark; print or write ``results/concurrency.{md,json}``."""
    args = parse(argv)
    device = args.device or default_device()
    _gpu_index(device)  # raises Unavailable on the host
    kernel_us = [int(v) for v in args.kernel_us.split(",") if v]
    loops = [v for v in args.loops.split(",") if v]
    figs: dict[Key, float] = {}
    for loop in loops:
        try:
            figs.update(asynccube_figures(device, loop, kernel_us, args.requests, args.runs))
        except Unavailable as exc:
            print(f"{loop}: {exc}", file=sys.stderr)
    try:
        figs.update(cupy_figures(device, kernel_us, args.requests, args.runs))
    except Unavailable as exc:
        print(f"cupy: {exc}", file=sys.stderr)
    command = " ".join(argv if argv is not None else sys.argv[1:])
    body, figures = report(figs, kernel_us, loops, command)
    title = f"Where concurrency pays: the request with a busy kernel (issue 38), {device}"
    publish("concurrency", title, device, body, figures, args.no_write)
    return figs


if __name__ == "__main__":
    try:
        main()
    except Unavailable as exc:
        sys.exit(f"bench_concurrency: {exc}")
