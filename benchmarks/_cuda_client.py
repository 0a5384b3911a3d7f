"""bench_cuda's client section: asynccube end to end beside raw cuda.bindings, CuPy and
PyTorch, on asyncio's loop and on uvloop.

:func:`bench_client` measures the peers once, then :func:`client_figures` on each loop:
execute (UNCHECKED, CHECKED), 1 KiB read round trip, sync after a launch, 256 MiB writes
(pageable, staging) and read, ``empty`` + drop of 1 MiB, 4 tasks x 1000 small kernels vs
one task x 4000, and the loop while awaiting a 1 s kernel.
"""

from __future__ import annotations

import asyncio
import gc
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from _floor import ExtensionFloor, FloorProgram

from asynccube._core.cuda.driver import check, cu
from asynccube._core.cuda.storage import PinnedPool

MiB = 1 << 20
ROUNDS = int(os.environ.get("ASYNCCUBE_BENCH_ROUNDS", "5"))
"""Rounds of execute and of ``empty`` + drop, each beside its peer (paired ratios)."""


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def p99(xs: list[float]) -> float:
    return sorted(xs)[min(len(xs) - 1, int(0.99 * len(xs)))]


ADD_SRC = r"""
extern "C" __global__ void add(const float* a, const float* b, float* out, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}
extern "C" __global__ void spin(unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}
extern "C" __global__ void empty_kernel() {}
"""


def _kernels() -> tuple[Any, Any, Any]:
    import asynccube as ac

    add = ac.Kernel("bench_add", cuda=ac.CudaSource(ADD_SRC, "add", (256, 1, 1)))
    spin = ac.Kernel("bench_spin", cuda=ac.CudaSource(ADD_SRC, "spin", (1, 1, 1)))
    empty = ac.Kernel("bench_empty", cuda=ac.CudaSource(ADD_SRC, "empty_kernel", (1, 1, 1)))
    return add, spin, empty


_gc_spent = [0.0]
"""Seconds the cyclic garbage collector has run in this process (see :func:`_gc_timer`)."""
_gc_started = [0.0]


def _gc_timer(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _gc_started[0] = time.perf_counter()
    else:
        _gc_spent[0] += time.perf_counter() - _gc_started[0]


gc.callbacks.append(_gc_timer)


async def _execute_best(
    client: Any, kernel: Any, count: Any, bindings: Any, mode: Any, reps: int
) -> tuple[float, float]:
    """(enqueue, total) µs per launch: the best of 3 rounds of ``reps`` launches."""
    best = []
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(reps):
            client.execute(kernel, count, bindings, mode)
        t1 = time.perf_counter()
        await client.sync()
        t2 = time.perf_counter()
        best.append(((t1 - t0) / reps * 1e6, (t2 - t0) / reps * 1e6))
    return min(best)


class Beside:
    """The peers measured again beside each round of asynccube's own, so that a ratio is
    taken between figures of the same moment (this machine's speed drifts by 20-30%
    within seconds): the launch floors and cuda.bindings' alloc + free."""

    def __init__(self, g: Any) -> None:
        self.g = g
        self.program = FloorProgram(g.cubin)
        self.ext = ExtensionFloor(g.cubin)

    def floors(self) -> dict[str, float | None]:
        """The launch floors now (µs; None where one cannot run): the C loop program
        (its own process), the same C loop run in this process, and one C-extension
        call per launch from Python."""
        v = self.program.run().get("c_launch_add4_us")
        return {
            "c_floor_us": float(v) if v is not None else None,
            "c_loop_here_us": self.ext.loop(),
            "ext_call_us": self.ext.call(),
        }

    def raw_alloc(self) -> float:
        """:func:`raw_alloc_us` now (the primary context, which the client's server keeps
        current on this thread)."""
        return raw_alloc_us(self.g)


def raw_alloc_us(g: Any, reps: int = 20000) -> float:
    """cuda.bindings' cuMemAllocAsync + cuMemFreeAsync of 1 MiB on ``g``'s stream, µs."""
    d, s = cu(), g.stream
    t0 = time.perf_counter()
    for _ in range(reps):
        p = check(d.cuMemAllocAsync(MiB, s))
        check(d.cuMemFreeAsync(p, s))
    us = (time.perf_counter() - t0) / reps * 1e6
    check(d.cuStreamSynchronize(s))
    return us


async def client_figures(out: dict[str, Any], beside: Beside | None = None) -> None:
    """asynccube's figures on the running loop, into ``out`` (with ``beside``: execute
    and ``empty`` + drop in :data:`ROUNDS` rounds, each beside its peer's)."""
    import asynccube as ac

    add, spin, empty = _kernels()
    async with ac.open_client("cuda:0") as client:
        n = 4096
        a = client.create(np.ones(n, np.float32))
        b = client.create(np.ones(n, np.float32))
        o = client.empty(4 * n)
        bindings = (
            ac.Bindings()
            .with_buffers([a.binding(), b.binding(), o.binding()])
            .with_scalar(np.uint32, [n])
        )
        count = ac.CubeCount(n // 256)
        unchecked, checked = ac.ExecutionMode.UNCHECKED, ac.ExecutionMode.CHECKED
        for k in (add, spin, empty):
            client.execute(
                k,
                ac.CubeCount(1),
                bindings
                if k is add
                else (ac.Bindings().with_scalar(np.uint64, [0]) if k is spin else ac.Bindings()),
            )
        await client.sync()
        reps = 20000
        rounds = []
        for k in range(ROUNDS):  # each round beside its own floors, the order alternated
            floors = beside.floors() if beside is not None and k % 2 == 0 else {}
            un = await _execute_best(client, add, count, bindings, unchecked, reps)
            ck = await _execute_best(client, add, count, bindings, checked, reps)
            if beside is not None and k % 2 == 1:
                floors = beside.floors()
            rounds.append({"unchecked": un, "checked": ck, "floors": floors})
        for mode_name in ("checked", "unchecked"):
            enq, total = min(r[mode_name] for r in rounds)
            out[f"execute_{mode_name}_enqueue_us"] = enq
            out[f"execute_{mode_name}_us"] = total
        out["execute_rounds"] = [
            {"unchecked_us": r["unchecked"][1], "checked_us": r["checked"][1], **r["floors"]}
            for r in rounds
        ]
        # read 1 KiB round trip
        h = client.create(bytes(1024))
        for _ in range(200):
            await client.read([h])
        ts = []
        for _ in range(2000):
            t0 = time.perf_counter()
            await client.read([h])
            ts.append(time.perf_counter() - t0)
        out["read_1KiB_us"] = med(ts) * 1e6
        # sync after one launch
        eb = ac.Bindings()
        one = ac.CubeCount(1)
        ts = []
        for i in range(2200):
            t0 = time.perf_counter()
            client.execute(empty, one, eb, unchecked)
            await client.sync()
            if i >= 200:
                ts.append(time.perf_counter() - t0)
        out["sync_after_launch_us"] = med(ts) * 1e6
        # 256 MiB write and read
        size = 256 * MiB
        big = client.empty(size)
        desc = big.copy_descriptor((size,), (1,), 1)
        data = np.full(size, 7, np.uint8)
        (stage,) = await client.staging([size])  # handed over by write: no snapshot copy
        stage[:] = 9
        for label, src in (("pageable", data), ("staging", stage)):
            client.write([(desc, src)])
            await client.sync()
            ts = []
            for _ in range(4):
                t0 = time.perf_counter()
                client.write([(desc, src)])
                await client.sync()
                ts.append(time.perf_counter() - t0)
            out[f"write_256MiB_{label}_GBs"] = size / min(ts) / 1e9
        server, sid = client.server, ac.StreamId.current()
        await client.sync()
        for label, src in (("pageable", data), ("staging", stage)):
            ts = []
            for _ in range(4):  # the server alone: no client-side snapshot of the data
                t0 = time.perf_counter()
                server.write([(desc, src)], sid)
                server.end_batch()
                await client.sync()
                ts.append(time.perf_counter() - t0)
            out[f"server_write_256MiB_{label}_GBs"] = size / min(ts) / 1e9
        await client.read([big])
        ts = []
        for _ in range(4):
            t0 = time.perf_counter()
            (raw,) = await client.read([big])
            ts.append(time.perf_counter() - t0)
            del raw
        out["read_256MiB_GBs"] = size / min(ts) / 1e9
        del big, stage
        client.memory_cleanup()
        # pooled alloc + free of 1 MiB
        for _ in range(100):
            client.empty(MiB)
        await client.memory_usage()
        reps = 20000
        rounds_al = []
        for k in range(ROUNDS):  # each round beside cuda.bindings' alloc + free
            raw = beside.raw_alloc() if beside is not None and k % 2 == 0 else None
            gc_before = _gc_spent[0]
            t0 = time.perf_counter()
            for _ in range(reps):
                hh = client.empty(MiB)
                del hh
            await client.memory_usage()
            ours = (time.perf_counter() - t0) / reps * 1e6
            if beside is not None and k % 2 == 1:
                raw = beside.raw_alloc()
            gc_ms = (_gc_spent[0] - gc_before) * 1e3  # the collector's share of the round
            rounds_al.append({"asynccube_us": ours, "raw_us": raw, "gc_ms": gc_ms})
        out["alloc_free_1MiB_us"] = min(r["asynccube_us"] for r in rounds_al)
        out["alloc_rounds"] = rounds_al
        # 4 tasks x 1000 small kernels vs one task
        sb = ac.Bindings().with_scalar(np.uint64, [50_000])

        async def worker(k: int) -> None:
            for _ in range(k):
                client.execute(spin, one, sb, unchecked)
            await client.sync()

        t0 = time.perf_counter()
        await worker(4000)
        one_task = time.perf_counter() - t0
        t0 = time.perf_counter()
        await asyncio.gather(*(asyncio.create_task(worker(1000)) for _ in range(4)))
        four_tasks = time.perf_counter() - t0
        out["one_task_4000_ms"] = one_task * 1e3
        out["four_tasks_1000_ms"] = four_tasks * 1e3
        out["concurrency_speedup"] = one_task / four_tasks
        # loop responsiveness while awaiting a 1 s kernel
        lags: list[float] = []
        stop = asyncio.Event()

        async def ticker() -> None:
            while not stop.is_set():
                t = time.perf_counter()
                await asyncio.sleep(0.001)
                lags.append(time.perf_counter() - t - 0.001)

        tick = asyncio.create_task(ticker())
        await asyncio.sleep(0.05)
        lags.clear()
        cpu0, t0 = time.process_time(), time.perf_counter()
        client.execute(spin, one, ac.Bindings().with_scalar(np.uint64, [1_000_000_000]))
        await client.sync()
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        stop.set()
        await tick
        out["long_wait_lag_p99_ms"] = p99(lags) * 1e3
        out["long_wait_cpu_pct"] = 100 * cpu / wall


def _peer_figures(g: Any, out: dict[str, Any]) -> None:
    d = cu()
    s = g.stream
    pinned = PinnedPool()
    buf = pinned.take(1024)
    dev = g.alloc(1024)
    ts = []
    for i in range(2200):
        t0 = time.perf_counter()
        check(d.cuMemcpyDtoHAsync(buf.ptr, dev, 1024, s))
        check(d.cuStreamSynchronize(s))
        if i >= 200:
            ts.append(time.perf_counter() - t0)
    out["raw_read_1KiB_us"] = med(ts) * 1e6
    try:
        import torch

        t = torch.zeros(256, device="cuda")
        for _ in range(200):
            t.cpu()
        ts = []
        for _ in range(2000):
            t0 = time.perf_counter()
            t.cpu()
            ts.append(time.perf_counter() - t0)
        out["torch_cpu_1KiB_us"] = med(ts) * 1e6
        for _ in range(200):
            torch.empty(MiB, dtype=torch.uint8, device="cuda")
        t0 = time.perf_counter()
        for _ in range(20000):
            x = torch.empty(MiB, dtype=torch.uint8, device="cuda")
            del x
        out["torch_alloc_free_1MiB_us"] = (time.perf_counter() - t0) / 20000 * 1e6
    except Exception as exc:
        out["torch_error"] = repr(exc)
    try:
        import cupy as cp

        x = cp.zeros(256, cp.float32)
        ts = []
        for i in range(2200):
            t0 = time.perf_counter()
            x.get()
            if i >= 200:
                ts.append(time.perf_counter() - t0)
        out["cupy_get_1KiB_us"] = med(ts) * 1e6
        for _ in range(200):
            cp.empty(MiB, cp.uint8)
        t0 = time.perf_counter()
        for _ in range(20000):
            y = cp.empty(MiB, cp.uint8)
            del y
        out["cupy_alloc_free_1MiB_us"] = (time.perf_counter() - t0) / 20000 * 1e6
    except Exception as exc:
        out["cupy_error"] = repr(exc)
    g.ctx.make_current()
    out["raw_cuMemAllocAsync_free_1MiB_us"] = raw_alloc_us(g)


def bench_client(g: Any, results: dict[str, Any], row: Callable[[str, str], None]) -> None:
    """The peers once (``client_peers``), then asynccube on asyncio (``client``) and on
    uvloop (``client_uvloop``)."""
    peers: dict[str, Any] = {}
    _peer_figures(g, peers)
    results["client_peers"] = peers
    for key, v in peers.items():
        row(f"client peers: {key}", f"{v:.2f}" if isinstance(v, float) else str(v))
    beside = Beside(g)
    for loop, key in (("asyncio", "client"), ("uvloop", "client_uvloop")):
        out: dict[str, Any] = {}
        if loop == "uvloop":
            try:
                import uvloop
            except ImportError:
                results[key] = {"skipped": "uvloop is not installed"}
                continue
            uvloop.run(client_figures(out, beside))
        else:
            asyncio.run(client_figures(out, beside))
        g.ctx.make_current()
        results[key] = out
        for name, v in out.items():
            if not isinstance(v, list):  # the rounds are in the JSON
                row(f"client ({loop}): {name}", f"{v:.2f}" if isinstance(v, float) else str(v))
