"""A kernel-written-once call's host work (issue 38), over the no-op CUDA driver of
``bench_overhead.py`` (no GPU needed; answers are not computed): µs and Python calls
(cProfile) per ``ac.reduction`` whole-tensor sum call and per ``ac.elementwise``
``y = a*x + b`` call, and the driver calls a sum call makes once warm.

    python benchmarks/profile_kernel_calls.py [--n 16777216] [--reps 2000] [--top 25]
    ASYNCCUBE_NO_EXTENSIONS=1 python benchmarks/profile_kernel_calls.py   # the twin
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import time
from collections.abc import Callable
from typing import Any

import bench_overhead

bench_overhead.install_fake()

import numpy as np  # noqa: E402

import asynccube as ac  # noqa: E402
from asynccube._core.client.client import ComputeClient  # noqa: E402

AXPB = ac.elementwise("y = a * x + b", name="prof_axpb")
TOTAL = ac.reduction("sum", name="prof_sum")


def _timed(call: Callable[[], Any], reps: int) -> float:
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(reps):
            call()
        best = min(best, time.perf_counter() - t0)
    return best / reps * 1e6


def _profiled(call: Callable[[], Any], reps: int, top: int) -> int:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(reps):
        call()
    prof.disable()
    stats = pstats.Stats(prof)
    calls = sum(v[1] for v in stats.stats.values())  # type: ignore[attr-defined]
    if top:
        stats.sort_stats("tottime").print_stats(top)
    return int(calls // reps)


async def main(n: int, reps: int, top: int) -> None:
    client = ComputeClient(bench_overhead._server(), asyncio.get_running_loop())
    tx, ty = client.empty_array((n,), np.float32), client.empty_array((n,), np.float32)
    total = client.empty_array((), np.float32)
    calls = {
        "sum (ac.reduction)": lambda: TOTAL(client, x=tx, out=total),
        "y = a*x + b (ac.elementwise)": lambda: AXPB(client, x=tx, a=2.0, b=1.0, y=ty),
    }
    for call in calls.values():
        call()
    await client.sync()
    for what, call in calls.items():
        us = _timed(call, reps)
        await client.sync()
        per = _profiled(call, reps, top)
        await client.sync()
        print(f"{what}: {us:.2f} us per call, {per} Python calls per call (cProfile)")
    await client.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=1 << 24)
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--top", type=int, default=0)
    a = ap.parse_args()
    asyncio.run(main(a.n, a.reps, a.top))
