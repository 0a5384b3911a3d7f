"""Where a collective's time goes on two GPUs: NCCL's own issue cost (first calls and
steady state, with and without ``NCCL_RUNTIME_CONNECT=0``), the time ``ac.all_reduce``
spends on the calling (loop) thread, and a cProfile of awaited calls.

    python benchmarks/profile_collectives.py --devices cuda:0,cuda:1
    python benchmarks/profile_collectives.py --raw-only      # NCCL's issue cost alone

``--fake`` needs no GPU: two CUDA servers ("cuda:0", "cuda:1") over
``bench_overhead.py``'s no-op driver and a no-op NCCL library (:class:`NoopNccl`); it
prints the loop thread's CPU per call (``time.thread_time``, best of ``--rounds``) of
each collective at 64 KiB, awaited (``await ac.all_reduce(...)``) and queued (10 calls,
then their awaitables awaited in turn), cProfile's Python calls per call, and the
driver calls per call by entry point (the fakes' counters): the host work of one call,
which the GPU figures of ``bench_collectives.py`` pay on top of NCCL's.

    PYTHONPATH=src python benchmarks/profile_collectives.py --fake
    ASYNCCUBE_NO_EXTENSIONS=1 PYTHONPATH=src python benchmarks/profile_collectives.py --fake

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
from typing import Any

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


class NoopNccl:
    """Stands in for :class:`asynccube._core.cuda.nccl.Nccl`: every call returns at once."""

    def comm_init_all(self, devices: list[int]) -> list[int]:
        return [100 + d for d in devices]

    def comm_destroy(self, comm: int) -> None:
        pass

    def group_start(self) -> None:
        pass

    def group_end(self) -> None:
        pass

    def all_reduce(self, *args: object) -> None:
        pass

    def broadcast(self, *args: object) -> None:
        pass

    def all_gather(self, *args: object) -> None:
        pass

    def reduce_scatter(self, *args: object) -> None:
        pass


def _fake_clients(loop: asyncio.AbstractEventLoop) -> list[object]:
    """Two clients of CUDA servers of "devices" 0 and 1 over the no-op driver."""
    import bench_overhead

    from asynccube._core.client.client import ComputeClient
    from asynccube._core.cuda.driver import DeviceContext
    from asynccube._core.cuda.server import CudaServer

    out = []
    for ordinal in (0, 1):
        ctx = DeviceContext(ordinal, ordinal + 1, ordinal + 1)
        server = CudaServer(ctx, properties=bench_overhead.fake_properties())
        out.append(ComputeClient(server, loop))
    del bench_overhead
    return out


def _fake_calls(
    pairs: list[tuple[object, object]], triples: list[tuple[object, ...]]
) -> dict[str, object]:
    import asynccube as ac

    return {
        "all_reduce": lambda: ac.all_reduce(pairs, "float32"),
        "broadcast": lambda: ac.broadcast(pairs),
        "all_gather": lambda: ac.all_gather(triples),
        "reduce_scatter": lambda: ac.reduce_scatter([(c, o, i) for c, i, o in triples], "float32"),
    }


async def fake_profile(args: argparse.Namespace) -> None:
    """The loop thread's CPU per collective call over the no-op driver and NCCL."""
    import numpy as np

    from asynccube._core.cuda.native.hotpath import ACTIVE

    clients: list = _fake_clients(asyncio.get_running_loop())
    nbytes = 64 << 10
    pairs = [(c, c.create(np.zeros(nbytes // 4, np.float32))) for c in clients]
    triples = [
        (
            c,
            c.create(np.zeros(nbytes // 4, np.float32)),
            c.create(np.zeros(nbytes // 2, np.float32)),
        )
        for c in clients
    ]
    calls = _fake_calls(pairs, triples)
    print(f"\n{ACTIVE}, 2 fake CUDA clients, 64 KiB a client, best of {args.rounds} rounds:")
    try:
        for name, call in calls.items():
            for _ in range(50):  # warm: communicators made, the kind found fast
                await call()
            awaited, queued = [], []
            for _ in range(args.rounds):
                t0 = time.thread_time()
                for _ in range(args.calls):
                    await call()
                awaited.append((time.thread_time() - t0) / args.calls)
                t0 = time.thread_time()
                for _ in range(args.calls // 10):
                    batch = [call() for _ in range(10)]
                    for aw in batch:
                        await aw
                queued.append((time.thread_time() - t0) / (args.calls // 10 * 10))
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(args.calls):
                await call()
            prof.disable()
            stats = pstats.Stats(prof)
            per = stats.total_calls / args.calls  # type: ignore[attr-defined]
            print(
                f"  {name:14s} awaited {min(awaited) * 1e6:7.1f} µs, queued "
                f"{min(queued) * 1e6:7.1f} µs/call (loop thread CPU); "
                f"{per:.0f} Python calls per awaited call"
            )
            with DriverCounts() as counts:
                for _ in range(args.calls):
                    await call()
            print(f"  {'':14s} driver calls per awaited call: {counts.per(args.calls)}")
            with DriverCounts() as counts:
                for _ in range(args.calls // 10):
                    batch = [call() for _ in range(10)]
                    for aw in batch:
                        await aw
            print(f"  {'':14s} driver calls per queued call:  {counts.per(args.calls // 10 * 10)}")
            if args.top and name == "all_reduce":
                stats.sort_stats(args.sort).print_stats(args.top)
    finally:
        for c in clients:
            await c.close()


class DriverCounts:
    """Counts the fake driver's calls by entry point while open: ``cuda.bindings``' (the
    Python fake, wrapped) and the library's (its own counters, prefixed ``lib:``), the
    pure-Python twin's included (it calls the Python fake)."""

    def __enter__(self) -> DriverCounts:
        import collections

        import bench_overhead

        from asynccube._core.cuda import driver
        from asynccube._core.cuda.native import _twin, _twin_args

        self._driver, self._twin, self._args = driver, _twin, _twin_args
        self._real = real = driver._module
        self._twin_d, self._args_d = _twin._d, _twin_args.state.get("d")
        self.counts: collections.Counter[str] = collections.Counter()
        counts = self.counts

        class Counting:
            def __getattr__(self, name: str) -> Any:
                attr = getattr(real, name)
                if not name.startswith("cu") or not callable(attr):
                    return attr

                def counted(*args: Any) -> Any:
                    counts[name] += 1
                    return attr(*args)

                return counted

        proxy = Counting()
        driver._module = proxy
        if self._twin_d is real:
            _twin._d = proxy
        if self._args_d is real:
            _twin_args.state["d"] = proxy
        self._lib_calls = bench_overhead.c_calls
        self._lib_calls(real._lib, reset=True)
        return self

    def __exit__(self, *exc: object) -> None:
        lib = self._lib_calls(self._real._lib, reset=True)
        self.counts.update({f"lib:{k}": v for k, v in lib.items()})
        self._driver._module = self._real
        if self._twin_d is self._real:
            self._twin._d = self._real
        if self._args_d is self._real:
            self._args.state["d"] = self._real

    def per(self, calls: int) -> str:
        """The counts per call, by entry point, and their total."""
        total = sum(self.counts.values()) / calls
        each = ", ".join(f"{k} {v / calls:.2g}" for k, v in sorted(self.counts.items()))
        return f"{total:.3g} ({each})"


def _install_fake_nccl() -> None:
    import bench_overhead

    from asynccube._core.cuda import nccl

    bench_overhead.install_fake()
    fake = NoopNccl()
    nccl._found[:] = ["noop-nccl"]
    nccl.load = lambda path: fake  # type: ignore[assignment]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", default="cuda:0,cuda:1")
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--raw-only", action="store_true")
    parser.add_argument("--raw-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--fake", action="store_true", help="no GPU: no-op driver and NCCL")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--top", type=int, default=0, help="cProfile's top functions (--fake)")
    parser.add_argument("--sort", default="tottime", help="cProfile's order (--fake --top)")
    args = parser.parse_args()
    if args.fake:
        _install_fake_nccl()
        asyncio.run(fake_profile(args))
        return
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
