"""Where a ``to_client`` between two CUDA clients of one device spends its host time
(issue 38), over ``bench_overhead.py``'s no-op driver (no GPU needed).

``bench_peer.py``'s timed copy: a batch of ``copy = src.to_client(h, dst)`` (each copy
dropped by the next), then ``await dst.sync()``. For each ``--batch-us`` (the channels'
budget per loop iteration: the default 1000 queues most of a long batch on both actors;
a huge one runs every copy inline), prints:

* the loop thread's CPU per copy (``time.thread_time``, best of ``--rounds``), for the
  calls alone and with the sync that drains what they queued;
* the fake library's driver calls per copy (the compiled hot path's; the pure-Python
  twin's go through the Python fake and are not counted there);
* cProfile's calls per copy and the top functions by own time (``--top``).

    PYTHONPATH=src python benchmarks/profile_to_client.py
    ASYNCCUBE_NO_EXTENSIONS=1 PYTHONPATH=src python benchmarks/profile_to_client.py --top 20
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import time
from typing import Any

import bench_overhead

SIZE = 4096


async def _batch(src: Any, dst: Any, h: Any, copies: int) -> tuple[float, float]:
    """Loop-thread CPU seconds of ``copies`` calls, and of the calls with the sync."""
    await src.sync()
    await dst.sync()
    t0 = time.thread_time()
    for _ in range(copies):
        copy = src.to_client(h, dst)
    t1 = time.thread_time()
    await dst.sync()
    t2 = time.thread_time()
    del copy
    return t1 - t0, t2 - t0


async def measure(batch_us: float, args: argparse.Namespace) -> None:
    from asynccube._core.client.client import ComputeClient
    from asynccube._core.cuda.native.hotpath import ACTIVE

    loop = asyncio.get_running_loop()
    src, dst = (
        ComputeClient(bench_overhead._server(), loop, batch_seconds=batch_us * 1e-6)
        for _ in range(2)
    )
    h = src.create(bytes(SIZE))
    await _batch(src, dst, h, 50)  # warm: events pooled, slices made
    rounds = [await _batch(src, dst, h, args.copies) for _ in range(args.rounds)]
    calls, whole = min(r[0] for r in rounds), min(r[1] for r in rounds)
    n = args.copies
    print(f"\n{ACTIVE}, batch_us={batch_us:g}, {n} copies of {SIZE} bytes:")
    print(f"  loop thread CPU per copy: calls {calls / n * 1e6:.2f} µs, with the sync "
          f"{whole / n * 1e6:.2f} µs")  # fmt: skip
    from asynccube._core.cuda import driver

    lib = driver._module._lib  # type: ignore[union-attr]  # the no-op libcuda.so.1
    bench_overhead.c_calls(lib, reset=True)
    await _batch(src, dst, h, n)
    driver = {k: round(v / n, 2) for k, v in bench_overhead.c_calls(lib, reset=True).items()}
    print(f"  driver calls per copy (compiled hot path): {driver}")
    prof = cProfile.Profile()
    await src.sync()
    await dst.sync()
    prof.enable()
    await _batch(src, dst, h, n)
    prof.disable()
    stats = pstats.Stats(prof)
    print(f"  Python calls per copy: {stats.total_calls / n:.0f}")  # type: ignore[attr-defined]
    if args.top:
        stats.sort_stats("tottime").print_stats(args.top)
    await src.close()
    await dst.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-us", default="1000,1e8", help="comma-separated budgets (µs)")
    p.add_argument("--copies", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--top", type=int, default=0, help="cProfile's top functions (0: none)")
    args = p.parse_args()
    bench_overhead.install_fake()
    for batch_us in (float(b) for b in args.batch_us.split(",")):
        asyncio.run(measure(batch_us, args))


if __name__ == "__main__":
    main()
