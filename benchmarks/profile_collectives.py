"""Where a collective's time goes on two GPUs: NCCL's own issue cost (first calls and
steady state, with and without ``NCCL_RUNTIME_CONNECT=0``), the time ``ac.all_reduce``
spends on the calling (loop) thread, and a cProfile of awaited calls.

    python benchmarks/profile_collectives.py --devices cuda:0,cuda:1
    python benchmarks/profile_collectives.py --raw-only      # NCCL's issue cost alone

Prints a report (nothing written to results/): the profile explains a figure of
``bench_collectives.py``; it is not a figure itself.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import os
import pstats
import statistics
import subprocess
import sys
import time

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
SIZES = (64 << 10, 1 << 20, 64 << 20)


def raw_issue_cost(n: int) -> None:
    """ncclGroupStart/AllReduce/GroupEnd on the calling thread, timed per call (torch
    allocates the buffers and streams; asynccube's ctypes wrapper calls NCCL)."""
    import torch

    from asynccube._core.cuda import nccl

    lib = nccl.load(nccl.find_library() or "libnccl.so.2")
    t0 = time.perf_counter()
    comms = lib.comm_init_all(list(range(n)))
    print(f"  ncclCommInitAll: {(time.perf_counter() - t0) * 1e3:.1f} ms")
    streams = [torch.cuda.Stream(device=i) for i in range(n)]
    for nbytes in SIZES:
        bufs = [torch.zeros(nbytes // 4, device=f"cuda:{i}") for i in range(n)]
        for i in range(n):
            torch.cuda.synchronize(i)
        costs = []
        for _ in range(30):
            t0 = time.perf_counter()
            lib.group_start()
            for i in range(n):
                ptr = bufs[i].data_ptr()
                lib.all_reduce(ptr, nbytes // 4, 7, 0, comms[i], streams[i].cuda_stream)
            lib.group_end()
            costs.append(time.perf_counter() - t0)
            for i in range(n):
                streams[i].synchronize()
        first = ", ".join(f"{c * 1e3:.2f}" for c in costs[:4])
        steady = statistics.median(costs[10:]) * 1e6
        print(f"  {nbytes >> 10} KiB: first calls {first} ms; steady {steady:.1f} µs a group")
    for c in comms:
        lib.comm_destroy(c)


async def asynccube_profile(devices: list[str], calls: int) -> None:
    """The synchronous part of ``ac.all_reduce`` (the caller's thread) and the awaited
    time, first calls and steady; then a cProfile of ``calls`` awaited 64 KiB calls."""
    import numpy as np

    import asynccube as ac

    clients = [await ac.connect(d) for d in devices]
    try:
        for nbytes in SIZES:
            pairs = [(c, c.create(np.zeros(nbytes // 4, np.float32))) for c in clients]
            for c in clients:
                await c.sync()
            inline, total = [], []
            for _ in range(30):
                t0 = time.perf_counter()
                aw = ac.all_reduce(pairs, "float32")
                t1 = time.perf_counter()
                await aw
                inline.append(t1 - t0)
                total.append(time.perf_counter() - t0)
            pairs4 = zip(inline[:4], total[:4], strict=True)
            first = ", ".join(f"{a * 1e3:.2f}/{b * 1e3:.2f}" for a, b in pairs4)
            print(
                f"  {nbytes >> 10} KiB: first calls (call/awaited) {first} ms; steady call "
                f"{statistics.median(inline[10:]) * 1e6:.1f} µs, awaited "
                f"{statistics.median(total[10:]) * 1e6:.1f} µs"
            )
        pairs = [(c, c.create(np.zeros(16384, np.float32))) for c in clients]
        for _ in range(20):
            await ac.all_reduce(pairs, "float32")
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(calls):
            await ac.all_reduce(pairs, "float32")
        prof.disable()
        text = io.StringIO()
        stats = pstats.Stats(prof, stream=text)
        stats.sort_stats("tottime").print_stats(25)
        print(
            f"  cProfile of {calls} awaited 64 KiB all_reduce calls ({stats.total_calls} "
            f"Python calls, {stats.total_calls / calls:.0f} a call):"
        )
        print(text.getvalue())
    finally:
        for c in clients:
            await c.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", default="cuda:0,cuda:1")
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--raw-only", action="store_true")
    parser.add_argument("--raw-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    n = len(args.devices.split(","))
    if args.raw_child:
        raw_issue_cost(n)
        return
    for env in ({}, {"NCCL_RUNTIME_CONNECT": "0"}):
        print(f"NCCL issue cost on the calling thread, {env or 'default environment'}:")
        sys.stdout.flush()
        cmd = [sys.executable, __file__, "--raw-child", "--devices", args.devices]
        subprocess.run(cmd, env={**os.environ, **env}, check=False)
    if not args.raw_only:
        print("asynccube:")
        asyncio.run(asynccube_profile(args.devices.split(","), args.calls))


if __name__ == "__main__":
    main()
