"""Kernels written once (issue 26, part 1): ``ac.elementwise`` and ``ac.reduction``
beside what a user would write without them, in the same run.

    python benchmarks/bench_kernels.py [--cuda] [--mib 64] [--rounds 7]

Host server (always): 64 MiB float32 ``y = a*x + b`` beside numpy's own expression
``a * x + b``, and a 64 MiB float32 sum beside ``np.sum`` (goal: >= 80% of numpy's
speed). ``--cuda`` (default where a GPU is usable): on ``cuda:0`` the same
elementwise kernel beside CuPy's ``ElementwiseKernel`` (goal >= 90% of its bandwidth)
and ``cuMemcpyDtoD`` of the same bytes (goal >= 85%), the sum beside ``cupy.sum``
(goal >= 80%); a peer that is not installed is skipped. Each figure is the best of
``--rounds`` rounds, each round timed from the first launch to the sync after the
last (host: asynccube and numpy interleaved, round by round). Writes ``results/kernels.md|json``.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from _common import environment, table, write

import asynccube as ac

AXPB = ac.elementwise("y = a * x + b", name="bench_axpb")
TOTAL = ac.reduction("sum", name="bench_sum")
MiB = 1 << 20


def _best(fn: Callable[[], Any], rounds: int) -> float:
    out = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return min(out)


async def _best_async(fn: Callable[[], Awaitable[Any]], rounds: int) -> float:
    out = []
    for _ in range(rounds):
        start = time.perf_counter()
        await fn()
        out.append(time.perf_counter() - start)
    return min(out)


async def host_figures(mib: int, rounds: int) -> list[list[str]]:
    n = mib * MiB // 4
    x = np.random.default_rng(0).random(n, dtype=np.float32)
    async with ac.open_client("host") as client:
        tx, ty = client.create_array(x), client.empty_array((n,), np.float32)
        total = client.empty_array((), np.float32)

        async def axpb() -> None:
            AXPB(client, x=tx, a=2.0, b=1.0, y=ty)
            await client.sync()

        async def summed() -> None:
            TOTAL(client, x=tx, out=total)
            await client.sync()

        await axpb(), await summed()  # warm: the kernels are made
        times: dict[str, list[float]] = {"ours": [], "numpy": [], "ours_sum": [], "np_sum": []}
        for _ in range(rounds):  # interleaved: each pair sees the same machine load
            times["ours"].append(await _best_async(axpb, 1))
            times["numpy"].append(_best(lambda: 2.0 * x + 1.0, 1))
            times["ours_sum"].append(await _best_async(summed, 1))
            times["np_sum"].append(_best(lambda: np.sum(x), 1))
    ours, numpy_axpb = min(times["ours"]), min(times["numpy"])
    ours_sum, numpy_sum = min(times["ours_sum"]), min(times["np_sum"])
    return [
        _row(
            f"host: y = a*x + b, {mib} MiB float32", ours, numpy_axpb, "numpy `a * x + b`", "≥ 80%"
        ),
        _row(f"host: sum, {mib} MiB float32", ours_sum, numpy_sum, "numpy `np.sum(x)`", "≥ 80%"),
    ]


def _row(what: str, ours: float, peer: float, name: str, goal: str) -> list[str]:
    return [
        what,
        f"{ours * 1e3:.2f} ms",
        f"{peer * 1e3:.2f} ms ({name})",
        f"{peer / ours:.0%}",
        goal,
    ]


def _gbps(nbytes: int, seconds: float) -> str:
    return f"{nbytes / seconds / 1e9:.0f} GB/s"


async def cuda_figures(mib: int, rounds: int, reps: int = 20) -> list[list[str]]:
    n = mib * MiB // 4
    x = np.random.default_rng(0).random(n, dtype=np.float32)
    rows: list[list[str]] = []
    async with ac.open_client("cuda:0") as gpu:
        tx, ty = gpu.create_array(x), gpu.empty_array((n,), np.float32)
        total = gpu.empty_array((), np.float32)

        async def axpb() -> None:
            for _ in range(reps):
                AXPB(gpu, x=tx, a=2.0, b=1.0, y=ty)
            await gpu.sync()

        async def summed() -> None:
            for _ in range(reps):
                TOTAL(gpu, x=tx, out=total)
            await gpu.sync()

        await axpb(), await summed()
        ours = await _best_async(axpb, rounds) / reps
        ours_sum = await _best_async(summed, rounds) / reps
        copy = await _dtod(gpu, tx, ty, n * 4, rounds, reps)
    moved = 2 * n * 4
    rows.append(["cuda: y = a*x + b", _gbps(moved, ours), "-", "-", "-"])
    if copy is not None:
        rows.append(
            _bw_row("cuda: y = a*x + b vs copy", moved, ours, copy, "cuMemcpyDtoD", "≥ 85%")
        )
    rows += _cupy_rows(x, moved, ours, ours_sum, rounds, reps)
    return rows


def _bw_row(what: str, moved: int, ours: float, peer: float, name: str, goal: str) -> list[str]:
    return [what, _gbps(moved, ours), f"{_gbps(moved, peer)} ({name})", f"{peer / ours:.0%}", goal]


async def _dtod(
    gpu: Any, src: ac.Tensor, dst: ac.Tensor, nbytes: int, rounds: int, reps: int
) -> float | None:
    from asynccube._core.cuda.driver import check, cu

    a = await gpu.get_resource(src.binding())
    b = await gpu.get_resource(dst.binding())
    await gpu.sync()

    def copies() -> None:
        for _ in range(reps):
            check(
                cu().cuMemcpyDtoDAsync(
                    int(b.resource) + b.offset, int(a.resource) + a.offset, nbytes, 0
                )
            )
        check(cu().cuCtxSynchronize())

    copies()
    return _best(copies, rounds) / reps


def _cupy_rows(
    x: Any, moved: int, ours: float, ours_sum: float, rounds: int, reps: int
) -> list[list[str]]:
    try:
        import cupy
    except ImportError:
        return [["CuPy peers", "-", "skipped: cupy is not installed", "-", "-"]]
    kernel = cupy.ElementwiseKernel("T x, T a, T b", "T y", "y = a * x + b", "bench_axpb")
    cx = cupy.asarray(x)
    cy = cupy.empty_like(cx)
    a, b = np.float32(2.0), np.float32(1.0)

    def elementwise() -> None:
        for _ in range(reps):
            kernel(cx, a, b, cy)
        cupy.cuda.Device().synchronize()

    def summed() -> None:
        for _ in range(reps):
            cupy.sum(cx)
        cupy.cuda.Device().synchronize()

    elementwise(), summed()
    peer = _best(elementwise, rounds) / reps
    peer_sum = _best(summed, rounds) / reps
    return [
        _bw_row("cuda: y = a*x + b vs CuPy", moved, ours, peer, "ElementwiseKernel", "≥ 90%"),
        _bw_row("cuda: sum vs CuPy", moved // 2, ours_sum, peer_sum, "cupy.sum", "≥ 80%"),
    ]


def _gpu_usable() -> bool:
    from asynccube._core.runtime.devices import probe_gpus

    return probe_gpus().usable


async def main(args: argparse.Namespace) -> None:
    rows = await host_figures(args.mib, args.rounds)
    device = "host (numpy)"
    if args.cuda or (args.cuda is None and _gpu_usable()):
        rows += await cuda_figures(args.mib, args.rounds)
        device = "cuda:0 and host (numpy)"
    header = ["figure", "asynccube", "peer", "asynccube / peer (speed)", "goal"]
    body = table(header, rows) + (
        f"\n\nBest of {args.rounds} rounds. `python benchmarks/bench_kernels.py"
        f"{' --cuda' if 'cuda' in device else ''} --mib {args.mib}`"
    )
    figures = {"rows": rows}
    write("kernels", "Kernels written once (issue 26)", environment(device), body, figures)


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cuda", action="store_true", default=None, help="also measure on cuda:0")
    parser.add_argument("--mib", type=int, default=64, help="array size in MiB")
    parser.add_argument("--rounds", type=int, default=7)
    return parser.parse_args()


if __name__ == "__main__":
    asyncio.run(main(_parse()))
