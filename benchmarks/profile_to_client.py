"""Where a ``to_client`` between two CUDA clients of one device spends its host time
(issue 38), over ``bench_overhead.py``'s no-op driver (no GPU needed).

``bench_peer.py``'s timed copy: a batch of ``copy = src.to_client(h, dst)`` (each copy
dropped by the next), then ``await dst.sync()``. With ``--devices 2`` (the default) the
two clients stand for two GPUs (two fake devices and contexts, peer access enabled as on
the GPU machine: each side's context must be made current for its part); ``--devices 1``:
two clients of one device. For each ``--batch-us`` (the channels'
budget per loop iteration: the default 1000 queues most of a long batch on both actors;
a huge one runs every copy inline), prints:

* the loop thread's CPU per copy (``time.thread_time``, best of ``--rounds``), for the
  calls alone and with the sync that drains what they queued;
* the driver calls per copy, of the calls alone and with the sync (``--busy``: the
  device slower than the host, its queries answering not ready as a GPU's do mid-run,
  until the sync's host function): the fake library's (the compiled hot path's; the
  pure-Python twin's go through the Python fake and are not counted there), and the
  ``cuCtxSetCurrent`` calls made through ``cuda.bindings`` (``driver.set_current``);
* cProfile's calls per copy and the top functions by own time (``--top``).

    PYTHONPATH=src python benchmarks/profile_to_client.py
    ASYNCCUBE_NO_EXTENSIONS=1 PYTHONPATH=src python benchmarks/profile_to_client.py --top 20
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import ctypes
import pstats
import time
from typing import Any

import bench_overhead

SIZE = 4096


async def _batch(
    src: Any, dst: Any, h: Any, copies: int, counted: list[dict[str, int]] | None = None
) -> tuple[float, float]:
    """Loop-thread CPU seconds of ``copies`` calls, and of the calls with the sync;
    ``counted`` gets the driver calls of the calls alone, then with the sync."""
    from asynccube._core.cuda import driver

    lib = driver._module._lib  # type: ignore[union-attr]  # the no-op libcuda.so.1
    await src.sync()
    await dst.sync()
    if _busy[0]:  # the device slower than the host until the sync (its host function)
        ctypes.c_int.in_dll(lib, "fake_pending").value = 1
    if counted is not None:
        bench_overhead.c_calls(lib, reset=True)
        _switches[0] = 0
    t0 = time.thread_time()
    for _ in range(copies):
        copy = src.to_client(h, dst)
    t1 = time.thread_time()
    if counted is not None:
        counted.append({**bench_overhead.c_calls(lib), "cuCtxSetCurrent(py)": _switches[0]})
    await dst.sync()
    t2 = time.thread_time()
    if counted is not None:
        counted.append({**bench_overhead.c_calls(lib), "cuCtxSetCurrent(py)": _switches[0]})
    del copy
    return t1 - t0, t2 - t0


async def measure(batch_us: float, args: argparse.Namespace) -> None:
    from asynccube._core.client.client import ComputeClient
    from asynccube._core.cuda.native.hotpath import ACTIVE

    loop = asyncio.get_running_loop()
    src, dst = (
        ComputeClient(_server(i if args.devices == 2 else 0), loop, batch_seconds=batch_us * 1e-6)
        for i in range(2)
    )
    h = src.create(bytes(SIZE))
    await _batch(src, dst, h, 50)  # warm: events pooled, slices made
    rounds = [await _batch(src, dst, h, args.copies) for _ in range(args.rounds)]
    calls, whole = min(r[0] for r in rounds), min(r[1] for r in rounds)
    n = args.copies
    print(f"\n{ACTIVE}, batch_us={batch_us:g}, {n} copies of {SIZE} bytes:")
    print(f"  loop thread CPU per copy: calls {calls / n * 1e6:.2f} µs, with the sync "
          f"{whole / n * 1e6:.2f} µs")  # fmt: skip
    counted: list[dict[str, int]] = []
    await _batch(src, dst, h, n, counted)
    for what, counts in zip(("the calls alone", "with the sync"), counted, strict=True):
        per_copy = {k: round(v / n, 2) for k, v in counts.items() if v}
        print(f"  driver calls per copy (compiled hot path), {what}: {per_copy}")
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


_busy = [False]
"""``--busy``: stream and event queries say not ready during the copies."""

_switches = [0]
"""``cuCtxSetCurrent`` calls through the Python fake (``driver.set_current``)."""


def _server(ordinal: int) -> Any:
    """``bench_overhead._server()`` on fake device ``ordinal`` (context ``ordinal + 1``:
    device 0's is the one the fake's ``cuCtxGetCurrent`` answers)."""
    if not ordinal:
        return bench_overhead._server()
    from asynccube._core.cuda import driver
    from asynccube._core.cuda.server import CudaServer

    original = driver.DeviceContext
    props = bench_overhead._server().properties  # a throwaway server: its properties
    return CudaServer(original(ordinal, ordinal + 1, ordinal + 1), properties=props)


def _count_switches() -> None:
    """Count ``cuCtxSetCurrent`` through ``cuda.bindings``; devices reach each other."""
    from asynccube._core.cuda import driver

    fake = driver._module

    def set_current(ctx: Any) -> tuple[int]:
        _switches[0] += 1
        return (0,)

    fake.cuCtxSetCurrent = set_current  # type: ignore[union-attr]
    fake.cuDeviceCanAccessPeer = lambda a, b: (0, 1)  # type: ignore[union-attr]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-us", default="1000,1e8", help="comma-separated budgets (µs)")
    p.add_argument("--copies", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--devices", type=int, default=2, choices=(1, 2))
    p.add_argument("--top", type=int, default=0, help="cProfile's top functions (0: none)")
    p.add_argument(
        "--busy", action="store_true", help="the device slower than the host (queries: not ready)"
    )
    args = p.parse_args()
    _busy[0] = args.busy
    bench_overhead.install_fake()
    _count_switches()
    for batch_us in (float(b) for b in args.batch_us.split(",")):
        asyncio.run(measure(batch_us, args))


if __name__ == "__main__":
    main()
