"""CUDA backend benchmarks, asynccube beside raw cuda.bindings, cuda.core, CuPy and PyTorch.

Run on a GPU machine: ``scripts/gpu-check python3 benchmarks/bench_cuda.py [SECTION...]``
(sections: costs abi floor launch completion long_wait storage client; default all). Prints the
figures and the issue's table, and writes ``benchmarks/results/cuda.json`` and
``cuda.md`` (copies under ``$OUT`` when set). ``--markdown FILE.json`` reprints a table.

Sections 1-6 measure the building blocks of ``_core/cuda`` directly; section 7 (client)
measures asynccube end to end (client, actor, CUDA server) beside the peers:

1. NVRTC: compile time, cold and from the disk cache; the cubin loads and runs.
2. The kernel ABI: every parameter kind read back from a kernel; a 4-argument kernel
   computes the right thing.
3. Host cost per launch of a 4-argument kernel, amortized over many launches:
   tuple-packed ``cuLaunchKernel``, pre-packed, asynccube's ``ArgPacker`` + launch,
   cuda.core, CuPy, torch.
4. Completion round trips after an empty kernel: ``cuStreamSynchronize``; polling
   ``cuEventQuery`` with ``await asyncio.sleep(0)``; a waiter thread blocked in
   ``cuEventSynchronize`` (blocking-sync event) + ``call_soon_threadsafe``; the channel's
   ``CompletionWatcher``; the host-function pipe (``fileno()``) watched by the loop.
5. Awaiting a 1 s kernel: process CPU time and event-loop ticker lag, per mechanism.
6. Storage: pooled device alloc+free of 1 MiB, pinned staging take/release, and
   256 MiB copies, pinned vs pageable.
7. Client: execute, 1 KiB read round trip, sync after a launch, 256 MiB write/read,
   pooled alloc+free, 4 tasks x 1000 kernels vs one task, and the loop during a 1 s
   kernel; peers: raw cuda.bindings, CuPy, torch.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
# ASYNCCUBE_BENCH_SRC: measure another tree's src/ (the code before a change) with this bench
sys.path.insert(0, os.environ.get("ASYNCCUBE_BENCH_SRC") or str(ROOT / "src"))

from _cuda_client import bench_client  # noqa: E402
from _cuda_report import markdown  # noqa: E402
from _floor import c_floor, extension_call_floor  # noqa: E402

from asynccube._core.cuda import abi, compiler  # noqa: E402
from asynccube._core.cuda.completion import CudaCompletion, EventPool, HostFuncNotifier  # noqa: E402
from asynccube._core.cuda.driver import (  # noqa: E402
    DeviceContext,
    check,
    cu,
    device_properties,
    driver_available,
)
from asynccube._core.cuda.storage import CudaStorage, PinnedPool  # noqa: E402
from asynccube._core.values.kernel import CudaSource  # noqa: E402

MiB = 1 << 20
RESULTS: dict[str, Any] = {}
ROWS: list[tuple[str, str, str]] = []

KERNELS = r"""
#include <asynccube.h>
extern "C" __global__ void empty_kernel() {}

extern "C" __global__ void add4(const float* a, const float* b, float* out, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}

extern "C" __global__ void spin(unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}

__device__ void put(unsigned char* out, int at, const void* p, int n) {
    for (int i = 0; i < n; ++i) out[at + i] = ((const unsigned char*)p)[i];
}

extern "C" __global__ void abi_probe(unsigned char* out, unsigned char* unused,
        const __grid_constant__ ac_tensor_map t0,
        double d0, float f0, float f1, ac_f16 h0, long long l0, int i0, int i1,
        unsigned char u0, ac_metadata<3> meta) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    int at = 0;
    unsigned long long ptr = (unsigned long long)unused;
    put(out, at, &ptr, 8); at += 8;
    put(out, at, &t0, 128); at += 128;
    put(out, at, &d0, 8); at += 8;
    put(out, at, &f0, 4); at += 4;
    put(out, at, &f1, 4); at += 4;
    put(out, at, &h0, 2); at += 2;
    put(out, at, &l0, 8); at += 8;
    put(out, at, &i0, 4); at += 4;
    put(out, at, &i1, 4); at += 4;
    put(out, at, &u0, 1); at += 1;
    put(out, at, &meta, 12); at += 12;
}
"""


def row(name: str, value: str, note: str = "") -> None:
    ROWS.append((name, value, note))
    print(f"  {name:<58} {value:>14}  {note}", flush=True)


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def p99(xs: list[float]) -> float:
    return sorted(xs)[min(len(xs) - 1, int(0.99 * len(xs)))]


class Gpu:
    """The device, a stream, the compiled module and a few buffers."""

    def __init__(self) -> None:
        self.ctx = DeviceContext.open(0)
        self.props = device_properties(0)
        d = cu()
        self.stream = check(d.cuStreamCreate(int(d.CUstream_flags.CU_STREAM_NON_BLOCKING)))
        self.arch = self.props.extra["arch"]
        self.cache_dir = Path(tempfile.mkdtemp(prefix="ac-kernels-"))
        src = CudaSource(KERNELS, entry="add4")
        t0 = time.perf_counter()
        comp = compiler.KernelCompiler(cache_dir=self.cache_dir)
        comp.compile(src, self.arch)
        cold = time.perf_counter() - t0
        t0 = time.perf_counter()
        warm = compiler.KernelCompiler(cache_dir=self.cache_dir)
        self.cubin = warm.compile(src, self.arch).cubin
        disk = time.perf_counter() - t0
        row("NVRTC compile (cold) ms", f"{cold * 1e3:.1f}", f"{self.arch}, {len(self.cubin)} B")
        row("NVRTC compile from disk cache ms", f"{disk * 1e3:.2f}", f"hits={warm.stats.disk_hits}")
        RESULTS["compile"] = {"cold_ms": cold * 1e3, "disk_ms": disk * 1e3, "arch": self.arch}
        self.module = check(d.cuModuleLoadData(self.cubin), "cuModuleLoadData")
        self.fn = {
            name: check(d.cuModuleGetFunction(self.module, name.encode()))
            for name in ("empty_kernel", "add4", "spin", "abi_probe")
        }

    def alloc(self, n: int) -> int:
        return int(check(cu().cuMemAlloc(n), "cuMemAlloc"))

    def launch(self, name: str, grid: int, block: int, params: int) -> None:
        (err,) = cu().cuLaunchKernel(
            self.fn[name], grid, 1, 1, block, 1, 1, 0, self.stream, params, 0
        )
        if err:
            check((err,), f"cuLaunchKernel({name})")

    def sync(self) -> None:
        check(cu().cuStreamSynchronize(self.stream), "cuStreamSynchronize")

    def dtoh(self, ptr: int, n: int) -> bytes:
        out = bytearray(n)
        check(cu().cuMemcpyDtoH(out, ptr, n), "cuMemcpyDtoH")
        return bytes(out)


def check_abi(g: Gpu) -> None:
    from asynccube._core.memory.slice import ReleaseQueue, SliceHandle
    from asynccube._core.values.bindings import (
        Bindings,
        MetadataBinding,
        TensorMapBinding,
        TensorMapMeta,
        TiledFormat,
    )
    from asynccube._core.values.stream_id import StreamId
    from asynccube._core.values.types import Handle

    def fake_tensor_map(handle: Handle) -> TensorMapBinding:
        meta = TensorMapMeta(TiledFormat((8,)), 1, (64,), (1,), (1,), np.dtype(np.uint8))
        return TensorMapBinding(handle.binding(), meta)

    q = ReleaseQueue(99)
    hs = [Handle(SliceHandle(i, q), None, None, StreamId(0), 0, 256) for i in range(2)]
    b = (
        Bindings()
        .with_buffers([h.binding() for h in hs])
        .with_scalar(np.float64, [3.25])
        .with_scalar(np.float32, [1.5, -2.0])
        .with_scalar(np.float16, [0.5])
        .with_scalar(np.int64, [-(2**40)])
        .with_scalar(np.int32, [7, -9])
        .with_scalar(np.uint8, [200])
        .with_metadata(MetadataBinding([11, 22, 33]))
        .with_tensor_maps([fake_tensor_map(hs[0])])
    )
    out = g.alloc(4096)
    tmap = bytes(range(128))
    packer = abi.ArgPacker()
    params = packer.pack(b, [out, 0x1234_5678_9ABC_DEF0], [tmap])
    g.launch("abi_probe", 1, 32, params)
    g.sync()
    got = g.dtoh(out, 183)
    want = (
        (0x1234_5678_9ABC_DEF0).to_bytes(8, "little")
        + tmap
        + np.float64(3.25).tobytes()
        + np.array([1.5, -2.0], np.float32).tobytes()
        + np.float16(0.5).tobytes()
        + np.int64(-(2**40)).tobytes()
        + np.array([7, -9], np.int32).tobytes()
        + bytes([200])
        + np.array([11, 22, 33], np.uint32).tobytes()
    )
    ok = got == want
    row("ABI: every parameter kind read back by a kernel", "ok" if ok else "MISMATCH")
    RESULTS["abi_ok"] = ok
    if not ok:
        print("   got ", got.hex(), "\n   want", want.hex())


def check_add4(g: Gpu, n: int = 1 << 20) -> tuple[int, int, int]:
    a_host = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    b_host = np.random.default_rng(2).standard_normal(n).astype(np.float32)
    a, b, o = g.alloc(4 * n), g.alloc(4 * n), g.alloc(4 * n)
    d = cu()
    check(d.cuMemcpyHtoD(a, a_host, 4 * n))
    check(d.cuMemcpyHtoD(b, b_host, 4 * n))
    check(d.cuMemsetD8(o, 0xFF, 4 * n))
    packs = abi.ArgPack(abi.Signature(3, 0, [(np.uint32, 1)]))
    from asynccube._core.values.bindings import ScalarBinding

    params = packs.pack([a, b, o], [ScalarBinding(np.uint32, [n])])
    g.launch("add4", (n + 255) // 256, 256, params)
    g.sync()
    got = np.frombuffer(g.dtoh(o, 4 * n), np.float32)
    ok = bool(np.array_equal(got, a_host + b_host))
    row("add4 via ArgPack + cuLaunchKernel(int address)", "ok" if ok else "WRONG")
    RESULTS["add4_ok"] = ok
    return a, b, o


def bench_launch(g: Gpu, bufs: tuple[int, int, int], n: int = 4096, reps: int = 20000) -> None:
    from asynccube._core.memory.slice import ReleaseQueue, SliceHandle
    from asynccube._core.values.bindings import Bindings
    from asynccube._core.values.stream_id import StreamId
    from asynccube._core.values.types import Handle

    d = cu()
    a, b, o = bufs
    f, s, grid = g.fn["add4"], g.stream, (n + 255) // 256
    launch = d.cuLaunchKernel
    da, db, do = (d.CUdeviceptr(x) for x in bufs)

    def timed(label: str, body: Callable[[], None], key: str) -> float:
        body()
        g.sync()
        best = []
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(reps):
                body()
            t1 = time.perf_counter()
            g.sync()
            best.append((t1 - t0) / reps * 1e6)
        us = min(best)
        RESULTS.setdefault("launch_us", {})[key] = us
        row(f"launch host cost: {label} (us)", f"{us:.2f}")
        return us

    types = (None, None, None, ctypes.c_uint)

    def tuple_packed() -> None:
        launch(f, grid, 1, 1, 256, 1, 1, 0, s, ((da, db, do, n), types), 0)

    timed("raw cuLaunchKernel, tuple-packed args", tuple_packed, "raw_tuple")
    vals = [np.array([x], np.uint64) for x in (a, b, o)] + [np.array([n], np.uint32)]
    pre = np.array([v.ctypes.data for v in vals], np.uint64)
    pre_addr = pre.ctypes.data

    def prepacked() -> None:
        launch(f, grid, 1, 1, 256, 1, 1, 0, s, pre_addr, 0)

    timed("raw cuLaunchKernel, pre-packed args", prepacked, "raw_prepacked")
    q = ReleaseQueue(98)
    hs = [Handle(SliceHandle(i, q), None, None, StreamId(0), 0, 4 * n) for i in range(3)]
    bindings = Bindings().with_buffers([h.binding() for h in hs]).with_scalar(np.uint32, [n])
    packer = abi.ArgPacker()
    ptrs = [a, b, o]

    def ours() -> None:
        params = packer.pack(bindings, ptrs)
        (err,) = launch(f, grid, 1, 1, 256, 1, 1, 0, s, params, 0)
        if err:
            raise RuntimeError(err)

    timed("asynccube ArgPacker.pack + cuLaunchKernel", ours, "asynccube_packer")
    t0 = time.perf_counter()
    for _ in range(reps):
        packer.pack(bindings, ptrs)
    RESULTS["launch_us"]["pack_only"] = (time.perf_counter() - t0) / reps * 1e6
    row("  ... of which ArgPacker.pack alone (us)", f"{RESULTS['launch_us']['pack_only']:.2f}")
    bench_launch_peers(g, n, reps, timed)


def bench_launch_peers(g: Gpu, n: int, reps: int, timed: Callable[..., float]) -> None:
    try:
        from cuda.core import Device, LaunchConfig, ObjectCode, launch

        dev = Device(0)
        dev.set_current()
        cs = dev.create_stream()
        kern = ObjectCode.from_cubin(g.cubin).get_kernel("add4")
        bufs = [dev.allocate(4 * n, stream=cs) for _ in range(3)]
        cfg = LaunchConfig(grid=(n + 255) // 256, block=256)
        nn = np.uint32(n)

        def core() -> None:
            launch(cs, cfg, kern, bufs[0], bufs[1], bufs[2], nn)

        core()
        cs.sync()
        t0 = time.perf_counter()
        for _ in range(reps):
            core()
        t1 = time.perf_counter()
        cs.sync()
        us = (t1 - t0) / reps * 1e6
        RESULTS["launch_us"]["cuda_core"] = us
        row("launch host cost: cuda.core launch (us)", f"{us:.2f}")
    except Exception as exc:
        row("launch host cost: cuda.core launch (us)", "n/a", f"{type(exc).__name__}: {exc}"[:60])
    try:
        import cupy as cp

        cupy_prelude = (
            "struct ac_f16 { unsigned short b; };"
            "struct __align__(64) ac_tensor_map { unsigned long long o[16]; };"
            "template <int N> struct ac_metadata { unsigned int v[N]; };"
        )
        k = cp.RawKernel(KERNELS.replace("#include <asynccube.h>", cupy_prelude), "add4")
        x = cp.ones(n, cp.float32)
        y = cp.ones(n, cp.float32)
        z = cp.empty(n, cp.float32)
        nn = np.uint32(n)
        grid = ((n + 255) // 256,)

        def cupy_call() -> None:
            k(grid, (256,), (x, y, z, nn))

        cupy_call()
        cp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            cupy_call()
        t1 = time.perf_counter()
        cp.cuda.Device().synchronize()
        us = (t1 - t0) / reps * 1e6
        RESULTS["launch_us"]["cupy"] = us
        row("launch host cost: CuPy RawKernel call (us)", f"{us:.2f}")
    except Exception as exc:
        row("launch host cost: CuPy RawKernel (us)", "n/a", f"{type(exc).__name__}: {exc}"[:60])
    try:
        import torch

        x = torch.ones(n, device="cuda")
        y = torch.ones(n, device="cuda")
        z = torch.empty(n, device="cuda")
        torch.add(x, y, out=z)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            torch.add(x, y, out=z)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        us = (t1 - t0) / reps * 1e6
        RESULTS["launch_us"]["torch_add"] = us
        row("launch host cost: torch.add(out=) (us)", f"{us:.2f}")
    except Exception as exc:
        row("launch host cost: torch.add (us)", "n/a", f"{type(exc).__name__}: {exc}"[:60])
    g.ctx.make_current()


# ---------------------------------------------------------------- completion


async def await_poll(c: CudaCompletion[Any]) -> None:
    while not c.done():  # noqa: ASYNC110 - polling is what is measured here
        await asyncio.sleep(0)


_pool = ThreadPoolExecutor(4, thread_name_prefix="bench-waiter")


async def await_thread(c: CudaCompletion[Any]) -> None:
    if not c.done():
        await asyncio.get_running_loop().run_in_executor(_pool, c.wait, None)


async def await_fd(c: CudaCompletion[Any], spin: float = 0.0) -> None:
    deadline = time.perf_counter() + spin
    while not c.done():
        if time.perf_counter() >= deadline:
            break
        await asyncio.sleep(0)
    else:
        return
    loop = asyncio.get_running_loop()
    fd = c.fileno()
    fut = loop.create_future()
    loop.add_reader(fd, lambda: fut.done() or fut.set_result(None))
    try:
        while not c.done():
            try:
                await asyncio.wait_for(asyncio.shield(fut), 0.5)
            except TimeoutError:
                pass
    finally:
        loop.remove_reader(fd)


async def await_watcher(c: CudaCompletion[Any], watcher: Any) -> None:
    fut = asyncio.get_running_loop().create_future()
    watcher.watch(c, lambda comp: fut.set_result(None), spin=True)
    await fut


def bench_completion(g: Gpu, reps: int = 2000) -> None:
    d = cu()
    empty = g.fn["empty_kernel"]
    launch = d.cuLaunchKernel
    s = g.stream
    out: dict[str, float] = {}

    def raw_sync() -> float:
        t0 = time.perf_counter()
        launch(empty, 1, 1, 1, 1, 1, 1, 0, s, 0, 0)
        d.cuStreamSynchronize(s)
        return time.perf_counter() - t0

    for _ in range(200):
        raw_sync()
    out["raw_stream_sync"] = med([raw_sync() for _ in range(reps)]) * 1e6
    events = EventPool()
    notifier = HostFuncNotifier()
    ctx = g.ctx.context

    async def run_mode(name: str, waiter: Callable[[CudaCompletion[Any]], Any]) -> float:
        times = []
        for i in range(reps + 100):
            t0 = time.perf_counter()
            launch(empty, 1, 1, 1, 1, 1, 1, 0, s, 0, 0)
            ev = events.record(s)
            c: CudaCompletion[Any] = CudaCompletion([ev], None, events, notifier, s, ctx)
            await waiter(c)
            c.result()
            if i >= 100:
                times.append(time.perf_counter() - t0)
        return med(times) * 1e6

    async def main() -> None:
        from asynccube._core.channel.completion import CompletionWatcher

        watcher = CompletionWatcher(asyncio.get_running_loop())
        out["poll_sleep0"] = await run_mode("poll", await_poll)
        out["waiter_thread"] = await run_mode("thread", await_thread)
        out["fd_hostfunc"] = await run_mode("fd", await_fd)
        out["fd_after_200us_spin"] = await run_mode("fd200", lambda c: await_fd(c, 200e-6))
        out["channel_watcher"] = await run_mode("watcher", lambda c: await_watcher(c, watcher))
        watcher.shutdown()

    asyncio.run(main())
    g.ctx.make_current()
    RESULTS["roundtrip_us"] = out
    names = {
        "raw_stream_sync": "empty kernel + cuStreamSynchronize (blocking)",
        "poll_sleep0": "empty kernel + event + poll cuEventQuery/sleep(0)",
        "waiter_thread": "empty kernel + event + executor thread cuEventSynchronize",
        "fd_hostfunc": "empty kernel + event + hostfunc close(pipe) + add_reader",
        "fd_after_200us_spin": "  same, after polling up to 200 us",
        "channel_watcher": "empty kernel + event + lead's CompletionWatcher",
    }
    for key, label in names.items():
        row(f"round trip: {label} (us)", f"{out[key]:.1f}")
    RESULTS["events_created"] = events.created
    RESULTS["hostfuncs_armed"] = notifier.armed


def bench_long_wait(g: Gpu, seconds: float = 1.0) -> None:
    d = cu()
    events = EventPool()
    notifier = HostFuncNotifier()
    ctx = g.ctx.context
    ns = np.uint64(int(seconds * 1e9))
    arg = np.array([ns], np.uint64)
    params = np.array([arg.ctypes.data], np.uint64)
    out: dict[str, dict[str, float]] = {}

    async def ticker(stop: asyncio.Event, lags: list[float]) -> None:
        while not stop.is_set():
            t0 = time.perf_counter()
            await asyncio.sleep(0.001)
            lags.append(time.perf_counter() - t0 - 0.001)

    async def measure(waiter: Callable[[CudaCompletion[Any]], Any] | None) -> dict[str, float]:
        stop = asyncio.Event()
        lags: list[float] = []
        tick = asyncio.get_running_loop().create_task(ticker(stop, lags))
        await asyncio.sleep(0.01)
        lags.clear()
        cpu0, t0 = time.process_time(), time.perf_counter()
        if waiter is None:
            await asyncio.sleep(seconds)
        else:
            d.cuLaunchKernel(g.fn["spin"], 1, 1, 1, 1, 1, 1, 0, g.stream, params.ctypes.data, 0)
            ev = events.record(g.stream)
            c: CudaCompletion[Any] = CudaCompletion([ev], None, events, notifier, g.stream, ctx)
            await waiter(c)
            c.result()
        wall = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
        stop.set()
        await tick
        return {
            "wall_s": wall,
            "cpu_pct_of_core": 100 * cpu / wall,
            "lag_p99_ms": p99(lags) * 1e3,
            "lag_max_ms": max(lags) * 1e3,
        }

    async def main() -> None:
        from asynccube._core.channel.completion import CompletionWatcher

        watcher = CompletionWatcher(asyncio.get_running_loop())
        out["idle_baseline"] = await measure(None)
        out["poll_sleep0"] = await measure(await_poll)
        out["waiter_thread"] = await measure(await_thread)
        out["fd_after_200us_spin"] = await measure(lambda c: await_fd(c, 200e-6))
        out["channel_watcher"] = await measure(lambda c: await_watcher(c, watcher))
        watcher.shutdown()

    asyncio.run(main())
    g.ctx.make_current()
    RESULTS["long_wait"] = out
    for key, m in out.items():
        row(
            f"1 s kernel, {key}: cpu % core / lag p99 ms",
            f"{m['cpu_pct_of_core']:.1f} / {m['lag_p99_ms']:.2f}",
            f"wall {m['wall_s']:.3f} s, lag max {m['lag_max_ms']:.2f} ms",
        )


def bench_storage(g: Gpu) -> None:
    d = cu()
    st = CudaStorage(0)
    out: dict[str, float] = {}
    h = st.alloc(MiB)
    ok = st.resource(h) % 512 == 0
    st.dealloc(h.id)
    reps = 2000
    t0 = time.perf_counter()
    for _ in range(reps):
        h = st.alloc(MiB)
        st.dealloc(h.id)
    out["storage_alloc_free_1MiB_us"] = (time.perf_counter() - t0) / reps * 1e6
    pool = check(d.cuDeviceGetDefaultMemPool(check(d.cuDeviceGet(0))))
    del pool
    t0 = time.perf_counter()
    for _ in range(reps):
        p = check(d.cuMemAllocAsync(MiB, g.stream))
        check(d.cuMemFreeAsync(p, g.stream))
    out["raw_cuMemAllocAsync_free_1MiB_us"] = (time.perf_counter() - t0) / reps * 1e6
    g.sync()
    pinned = PinnedPool()
    b = pinned.take(MiB)
    b.release()
    t0 = time.perf_counter()
    for _ in range(reps):
        pinned.take(MiB).release()
    out["pinned_take_release_1MiB_us"] = (time.perf_counter() - t0) / reps * 1e6
    out["pinned_capacity_of_257MiB"] = pinned.class_size(257 * MiB) / MiB
    size = 256 * MiB
    dev = st.resource(st.alloc(size))
    big = pinned.take(size)
    arr = big.array()
    arr[:] = 7
    pageable = np.full(size, 3, np.uint8)

    def bw(fn: Callable[[], None]) -> float:
        fn()
        g.sync()
        ts = []
        for _ in range(5):
            t0 = time.perf_counter()
            fn()
            g.sync()
            ts.append(time.perf_counter() - t0)
        return size / min(ts) / 1e9

    out["h2d_pinned_GBs"] = bw(lambda: check(d.cuMemcpyHtoDAsync(dev, big.ptr, size, g.stream)))
    out["d2h_pinned_GBs"] = bw(lambda: check(d.cuMemcpyDtoHAsync(big.ptr, dev, size, g.stream)))
    out["h2d_pageable_GBs"] = bw(lambda: check(d.cuMemcpyHtoDAsync(dev, pageable, size, g.stream)))
    out["d2h_pageable_GBs"] = bw(lambda: check(d.cuMemcpyDtoHAsync(pageable, dev, size, g.stream)))
    t0 = time.perf_counter()
    arr[:] = pageable
    out["host_memcpy_256MiB_GBs"] = size / (time.perf_counter() - t0) / 1e9
    st.close()
    RESULTS["storage"] = out
    row("CudaStorage pages aligned to 512", "ok" if ok else "NO")
    for key, v in out.items():
        row(key, f"{v:.2f}")


def bench_costs(g: Gpu) -> None:
    """One-off costs that decide what may run on the loop thread."""
    d = cu()
    out: dict[str, float] = {}

    def ms(fn: Callable[[], object]) -> float:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3

    flags = int(d.CU_MEMHOSTALLOC_PORTABLE)
    for size in (4096, 64 << 10, MiB, 4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB):
        ptrs: list[int] = []
        grab = lambda size=size, ptrs=ptrs: ptrs.append(int(check(d.cuMemHostAlloc(size, flags))))  # noqa: E731
        first = ms(grab)
        again = ms(grab)
        free = ms(lambda ptrs=ptrs: [check(d.cuMemFreeHost(p)) for p in ptrs])
        out[f"cuMemHostAlloc_{size >> 10}KiB_ms"] = again
        out[f"cuMemHostAlloc_{size >> 10}KiB_first_ms"] = first
        out[f"cuMemFreeHost_2x{size >> 10}KiB_ms"] = free
    st = CudaStorage(0)
    for size in (2 * MiB, 64 * MiB, 1024 * MiB):
        out[f"pool_grow_{size >> 20}MiB_ms"] = ms(lambda size=size: st.alloc(size))
    st.close()
    out["HostFuncNotifier_init_ms"] = ms(HostFuncNotifier)
    out["cuModuleLoadData_ms"] = ms(lambda: check(d.cuModuleLoadData(g.cubin)))
    attr = d.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR
    dev = check(d.cuDeviceGet(0))
    out["stream_wait_value_nor"] = float(check(d.cuDeviceGetAttribute(attr, dev)))
    RESULTS["costs"] = out
    for key, v in out.items():
        row(key, f"{v:.3f}")


def environment(g: Gpu) -> None:
    import cuda.bindings

    env = {
        "python": platform.python_version(),
        "cuda.bindings": cuda.bindings.__version__,
        "nvrtc": ".".join(map(str, compiler.nvrtc_version())),
        "device": g.props.name,
        "driver_version": g.props.extra["driver_version"],
        "compute_capability": g.props.extra["compute_capability"],
        "sm_count": g.props.extra["sm_count"],
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    try:
        from asynccube._core.cuda.native import hotpath

        env["hot_path"] = f"{hotpath.ACTIVE} ({hotpath.REASON})"
        from asynccube._core.values import slices

        env["hot_path"] += f", slice token {getattr(slices, 'TOKEN', 'python')}"
    except ImportError:
        env["hot_path"] = "python (before issue 11)"
    env["src"] = sys.path[0]
    for mod in ("cuda.core", "cupy", "torch", "uvloop"):
        try:
            env[mod] = __import__(mod, fromlist=["__version__"]).__version__
        except Exception as exc:
            env[mod] = f"n/a ({type(exc).__name__})"
    RESULTS["environment"] = env
    print(json.dumps(env), flush=True)
    RESULTS["properties"] = {
        k: (list(v) if isinstance(v, tuple) else v) for k, v in g.props.extra.items()
    }
    print(json.dumps(RESULTS["properties"]), flush=True)


def bench_floor(g: Gpu) -> None:
    """The driver's floor on the same cubin: a C loop and a C-extension call."""
    out = {**c_floor(g.cubin), **extension_call_floor(g.cubin)}
    g.ctx.make_current()
    RESULTS["floor"] = out
    for key, v in out.items():
        row(f"floor: {key}", f"{v:.2f}" if isinstance(v, float) else str(v)[:60])


def _load(dest: Path, name: str) -> dict[str, Any] | None:
    path = dest / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def render(results: dict[str, Any], dest: Path) -> str:
    """The CUDA section, with the fallback and before-issue-11 runs found beside it."""
    return markdown(results, _load(dest, "cuda_fallback"), _load(dest, "cuda_baseline"))


def main() -> int:
    dest = ROOT / "benchmarks" / "results"
    args = sys.argv[1:]
    if len(args) == 2 and args[0] == "--markdown":
        print(render(json.loads(Path(args[1]).read_text()), Path(args[1]).parent))
        return 0
    name = "cuda"
    if "--results" in args:  # e.g. cuda_fallback: a partial run kept beside cuda.json
        name = args[args.index("--results") + 1]
    ok, reason = driver_available()
    if not ok:
        print(f"no GPU: {reason}")
        return 1
    g = Gpu()
    environment(g)
    sections = {
        "costs": lambda: bench_costs(g),
        "abi": lambda: check_abi(g),
        "floor": lambda: bench_floor(g),
        "launch": lambda: bench_launch(g, check_add4(g)),
        "completion": lambda: bench_completion(g),
        "long_wait": lambda: bench_long_wait(g),
        "storage": lambda: bench_storage(g),
        "client": lambda: bench_client(g, RESULTS, row),
    }
    only = [a for a in args if a in sections] or list(sections)
    for section_name in only:
        section = sections[section_name]
        try:
            section()
        except Exception as exc:
            import traceback

            traceback.print_exc()
            row(f"SECTION {section_name} FAILED", type(exc).__name__, str(exc)[:80])
            g.ctx.make_current()
    print("\n=== summary ===")
    for label, value, note in ROWS:
        print(f"{label:<60} {value:>14}  {note}")
    text = json.dumps(RESULTS, indent=2, default=str)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / f"{name}.json").write_text(text)
    files = {f"{name}.json": text}
    if name == "cuda":
        table = render(RESULTS, dest)
        print("\n" + table)
        (dest / "cuda.md").write_text(table)
        files["cuda.md"] = table
    if os.environ.get("OUT"):
        for fname, body in files.items():
            Path(os.environ["OUT"], fname).write_text(body)
    return 0


if __name__ == "__main__":
    threading.current_thread().name = "bench"
    sys.exit(main())
