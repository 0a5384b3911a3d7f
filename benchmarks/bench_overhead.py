# ruff: noqa: N802, N815  (the fake driver keeps cuda.bindings' names)
"""Per-command Python overhead of the CUDA path, measured on a machine without a GPU.

Drives the real client -> channel -> CudaServer path against a fake driver whose every
call returns success at once:

* the hot path's own driver entry points (``_native.c`` resolves them with
  ``dlopen("libcuda.so.1")``) come from a tiny no-op ``libcuda.so.1`` compiled here with
  ``cc`` and loaded first, so the compiled extension runs its real C code up to the
  driver call (the pure-Python twin gets the same functions through ``cuGetProcAddress``);
* ``cuda.bindings.driver`` (used off the hot path: streams, events, pools) is replaced by
  a Python object with no-op calls and real pinned-looking host memory (``ctypes``).

A launch with a grid of 777 blocks fails with ``CUDA_ERROR_INVALID_VALUE``, and every
device-to-host copy fails with the library's ``fake_fail_dtoh`` while it is not 0 (the
tests of ``tests/test_fast_launch.py`` use both); every peer copy with ``fake_fail_peer``
(each notes the launches made so far in ``fake_peer_at``; each launch its stream in
``fake_launch_on``). While the library's ``fake_pending`` is
not 0 the device is slower than the host: event and stream queries answer
``CUDA_ERROR_NOT_READY`` until a host function runs (the device reached it, so it passed
everything before) or an event is waited for (``cuEventSynchronize``). The current context
is the calling thread's, as ``cuCtxSetCurrent`` set it (1 at first), for both the library
and the Python object. Each entry point
of the library counts its calls (:func:`c_calls`). NVRTC is real (kernels are compiled as
usual). What is left is asynccube's own work per
command: the figures are what the GPU figures would be with a free driver. Run::

    PYTHONPATH=src python benchmarks/bench_overhead.py [--profile execute|...|handler]
    ASYNCCUBE_NO_EXTENSIONS=1 PYTHONPATH=src python benchmarks/bench_overhead.py
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import ctypes
import itertools
import os
import pstats
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

FAKE_LIBCUDA = r"""
typedef unsigned long long u64;
void *fake_launch_on[4096]; /* the stream of each launch (a trace, by launch count) */
int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
    unsigned by, unsigned bz, unsigned smem, void *s, void **params, void **extra)
    { fake_launch_on[(fake_calls[0] - 1) % 4096] = s;
      return gx == 777u ? 1 : 0; } /* a grid of 777 fails: CUDA_ERROR_INVALID_VALUE */
int cuEventRecord(void *e, void *s) { return 0; }
int fake_pending = 0; /* not 0: the device has not passed what was queued */
int cuEventQuery(void *e) { return fake_pending ? 600 : 0; } /* CUDA_ERROR_NOT_READY */
int fake_fail_wait = 0; /* set to a CUresult: every cuStreamWaitEvent fails with it */
u64 fake_waited[2]; /* the stream and the event of the last cuStreamWaitEvent */
int cuStreamWaitEvent(void *s, void *e, unsigned flags)
    { fake_waited[0] = (u64)s; fake_waited[1] = (u64)e; return fake_fail_wait; }
int fake_fail_htod = 0; /* set to a CUresult: every host-to-device copy fails with it */
int cuMemcpyHtoDAsync_v2(u64 d, const void *h, unsigned long n, void *s) { return fake_fail_htod; }
int fake_fail_dtoh = 0; /* set to a CUresult: every device-to-host copy fails with it */
int cuMemcpyDtoHAsync_v2(void *h, u64 d, unsigned long n, void *s) { return fake_fail_dtoh; }
int cuLaunchHostFunc(void *s, void (*fn)(void *), void *data)
    { fake_pending = 0; fn(data); return 0; } /* reached: everything before it passed */
int cuEventCreate(void **e, unsigned flags) { static char ev; *e = &ev; return 0; }
int cuEventDestroy_v2(void *e) { return 0; }
static __thread void *fake_current = (void *)1; /* DeviceContext(0, 1, 1)'s, at first */
int cuCtxGetCurrent(void **c) { *c = fake_current; return 0; } /* this thread's, as set */
int cuCtxSetCurrent(void *c) { fake_current = c; return 0; }
void fake_ctx_put(void *c) { fake_current = c; } /* cuda.bindings' fake (not counted) */
void *fake_ctx_now(void) { return fake_current; }
int cuStreamQuery(void *s) { return fake_pending ? 600 : 0; }
int fake_fail_peer = 0; /* set to a CUresult: every peer copy fails with it */
long fake_peer_at[4096]; /* cuLaunchKernel's calls so far at each peer copy (a trace) */
long fake_peers = 0;
int cuMemcpyPeerAsync(u64 d, void *dc, u64 s, void *sc, unsigned long n, void *st)
    { fake_peer_at[fake_peers++ % 4096] = fake_calls[0]; return fake_fail_peer; }
int cuPointerGetAttributes(unsigned n, int *attrs, void **data, u64 ptr) {
    for (unsigned i = 0; i < n; ++i) *(unsigned *)data[i] = 0; /* not pinned */
    return 0;
}
int cuStreamGetCtx(void *s, void **c) { *c = (void *)1; return 0; } /* DeviceContext(0, 1, 1)'s */
int cuStreamIsCapturing(void *s, int *status) { *status = 0; return 0; } /* not capturing */
"""


FAKE_NAMES: tuple[str, ...] = tuple(re.findall(r"^int (cu\w+)\(", FAKE_LIBCUDA, re.M))
"""The library's entry points, in the order of its call counters (``fake_calls``)."""


def _counted(source: str) -> str:
    """``source`` with a call counter at the top of each entry point's body."""
    out = f"long fake_calls[{len(FAKE_NAMES)}];\n" + source
    for i, name in enumerate(FAKE_NAMES):
        head = re.compile(r"(^int " + name + r"\([^{]*\{)", re.M | re.S)
        out = head.sub(lambda m, i=i: f"{m.group(1)} fake_calls[{i}]++;", out, count=1)
    return out


def _fake_libcuda() -> ctypes.CDLL:
    """Build and load the no-op ``libcuda.so.1`` (its soname makes a later
    ``dlopen("libcuda.so.1")`` find this one). Its folder is removed once it is loaded
    (the mapping stays): a run leaves nothing in the temp dir."""
    with tempfile.TemporaryDirectory(prefix="asynccube-fakecuda-") as folder:
        tmp = Path(folder)
        (tmp / "fake.c").write_text(_counted(FAKE_LIBCUDA))
        lib = tmp / "libcuda.so.1"
        cmd = ["cc", "-O2", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(lib)]
        subprocess.run([*cmd, str(tmp / "fake.c")], check=True)
        out = ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
    out.fake_ctx_now.restype = ctypes.c_void_p
    out.fake_ctx_put.argtypes = [ctypes.c_void_p]
    return out


class _Enum:
    """Any enum namespace of ``cuda.bindings.driver``: every member is 0."""

    def __getattr__(self, name: str) -> int:
        return 0


class FakeDriver:
    """The parts of ``cuda.bindings.driver`` the CUDA server uses, as no-ops."""

    CU_MEMHOSTALLOC_PORTABLE = 0

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._lib = lib
        self._ids = itertools.count(0x1000)
        self._host: dict[int, Any] = {}

    def __getattr__(self, name: str) -> Any:
        if name.startswith("CU"):
            return _Enum()
        if name.startswith("cu"):
            return self._ok
        raise AttributeError(name)

    def _ok(self, *args: Any) -> tuple[int]:
        return (0,)

    def _new(self, *args: Any) -> tuple[int, int]:
        return 0, next(self._ids)

    cuDeviceGet = cuStreamCreate = cuStreamCreateWithPriority = cuEventCreate = _new
    cuModuleLoadData = cuModuleGetFunction = cuDevicePrimaryCtxRetain = _new
    cuMemPoolCreate = _new

    def cuDeviceTotalMem(self, dev: Any) -> tuple[int, int]:
        return 0, 80 << 30

    def cuDeviceGetAttribute(self, attr: Any, dev: Any) -> tuple[int, int]:
        return 0, 0  # no memory pools: cuMemAlloc

    def cuFuncGetAttribute(self, attr: Any, fn: Any) -> tuple[int, int]:
        return 0, 1024

    def cuMemcpyDtoHAsync(self, *args: Any) -> tuple[int]:
        return (ctypes.c_int.in_dll(self._lib, "fake_fail_dtoh").value,)  # as the C fake

    def cuMemcpyHtoDAsync(self, *args: Any) -> tuple[int]:
        return (ctypes.c_int.in_dll(self._lib, "fake_fail_htod").value,)  # as the C fake

    def cuStreamWaitEvent(self, stream: Any, event: Any, flags: int) -> tuple[int]:
        waited = (ctypes.c_uint64 * 2).in_dll(self._lib, "fake_waited")  # as the C fake
        waited[0], waited[1] = int(stream), int(event)
        return (ctypes.c_int.in_dll(self._lib, "fake_fail_wait").value,)

    def cuLaunchKernel(self, fn: Any, gx: int, *args: Any) -> tuple[int]:
        return (1 if gx == 777 else 0,)  # as the C fake: a grid of 777 fails

    def cuEventQuery(self, event: Any) -> tuple[int]:
        return (600 if self._pending() else 0,)  # as the C fake

    def cuStreamQuery(self, stream: Any) -> tuple[int]:
        return (600 if self._pending() else 0,)  # as the C fake

    def cuEventSynchronize(self, event: Any) -> tuple[int]:
        ctypes.c_int.in_dll(self._lib, "fake_pending").value = 0  # waited: passed
        return (0,)

    def _pending(self) -> int:
        return ctypes.c_int.in_dll(self._lib, "fake_pending").value

    def CUstream(self, value: int = 0) -> int:
        return value  # a handle is its int (client.wait on a raw handle)

    CUevent = CUstream

    def cuStreamGetCtx(self, stream: Any) -> tuple[int, int]:
        return 0, 1  # every stream is of DeviceContext(0, 1, 1)'s context

    def cuStreamIsCapturing(self, stream: Any) -> tuple[int, int]:
        return 0, 0  # CU_STREAM_CAPTURE_STATUS_NONE

    def cuCtxGetCurrent(self) -> tuple[int, int]:
        return 0, self._lib.fake_ctx_now() or 0  # this thread's, as the C fake's (1 at first)

    def cuCtxSetCurrent(self, context: Any) -> tuple[int]:
        self._lib.fake_ctx_put(ctypes.c_void_p(int(context)))  # one current context
        return (0,)

    def cuDriverGetVersion(self) -> tuple[int, int]:
        return 0, 13000

    def cuGetProcAddress(self, name: bytes, *args: Any) -> tuple[int, int]:
        return 0, ctypes.cast(getattr(self._lib, name.decode()), ctypes.c_void_p).value or 0

    def cuMemGetInfo(self) -> tuple[int, int, int]:
        return 0, 80 << 30, 80 << 30

    def cuMemAlloc(self, size: int) -> tuple[int, int]:
        return 0, next(self._ids) << 32

    def cuMemHostAlloc(self, size: int, flags: int) -> tuple[int, int]:
        buf = ctypes.create_string_buffer(size)
        ptr = ctypes.addressof(buf)
        self._host[ptr] = buf
        return 0, ptr

    def cuMemFreeHost(self, ptr: int) -> tuple[int]:
        self._host.pop(int(ptr), None)
        return (0,)

    def cuFuncGetParamInfo(self, fn: Any, index: int) -> tuple[int, int, int]:
        return 1, 0, 0

    def cuFuncGetParamCount(self, fn: Any) -> tuple[int, int]:
        raise RuntimeError("as cuda.bindings on a driver before CUDA 13.1")

    def cuPointerGetAttributes(self, n: int, attrs: Any, ptr: int) -> tuple[int, list[int]]:
        return 0, [-1]  # not pinned


def c_calls(lib: ctypes.CDLL, reset: bool = False) -> dict[str, int]:
    """The calls made so far to each entry point of the fake ``libcuda.so.1`` ``lib``
    (those called at least once); ``reset``: count from 0 again."""
    counts = (ctypes.c_long * len(FAKE_NAMES)).in_dll(lib, "fake_calls")
    out = {name: int(counts[i]) for i, name in enumerate(FAKE_NAMES) if counts[i]}
    if reset:
        ctypes.memset(counts, 0, ctypes.sizeof(counts))
    return out


def install_fake() -> None:
    """Route the CUDA server's driver calls to the fakes (before a server is built)."""
    from asynccube._core.cuda import driver

    driver._module = FakeDriver(_fake_libcuda())


def _server() -> Any:
    from asynccube._core.cuda.driver import DeviceContext
    from asynccube._core.cuda.server import CudaServer

    return CudaServer(DeviceContext(0, 1, 1), properties=fake_properties())


def fake_properties() -> Any:
    """The properties of the fake device (an sm_80 with 16 GiB): a new object each call."""
    from asynccube._core.server.protocol import DeviceProperties

    extra = {
        "max_grid_dim": (2**31 - 1, 65535, 65535),
        "arch": "sm_80",
        "max_threads_per_block": 1024,
        "max_block_dim": (1024, 1024, 64),
        "max_shared_memory_per_block_optin": 227 << 10,
    }
    return DeviceProperties("fake", "cuda", 512, 16 << 30, extra)


ADD = r"""
extern "C" __global__ void add(const float* a, const float* b, float* out, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}
extern "C" __global__ void empty_kernel() {}
"""


async def measure(which: str, reps: int) -> dict[str, float]:
    """Microseconds per command for each scenario (best of 3 rounds)."""
    import asynccube as ac
    from asynccube._core.client.client import ComputeClient

    server = _server()
    client = ComputeClient(server, asyncio.get_running_loop())
    add = ac.Kernel("ov_add", cuda=ac.CudaSource(ADD, "add", (256, 1, 1)))
    empty = ac.Kernel("ov_empty", cuda=ac.CudaSource(ADD, "empty_kernel", (1, 1, 1)))
    n = 4096
    a, b, o = (client.empty(4 * n) for _ in range(3))
    bindings = (
        ac.Bindings()
        .with_buffers([a.binding(), b.binding(), o.binding()])
        .with_scalar(np.uint32, [n])
    )
    count, one, eb = ac.CubeCount(n // 256), ac.CubeCount(1), ac.Bindings()
    unchecked = ac.ExecutionMode.UNCHECKED
    client.execute(add, count, bindings)
    client.execute(empty, one, eb)
    h = client.create(bytes(1024))
    await client.sync()

    async def execute() -> None:
        for _ in range(reps):
            client.execute(add, count, bindings, unchecked)
        await client.sync()

    async def read() -> None:
        for _ in range(reps):
            await client.read([h])

    async def sync() -> None:
        for _ in range(reps):
            client.execute(empty, one, eb, unchecked)
            await client.sync()

    async def empty_drop() -> None:
        for _ in range(reps):
            client.empty(1 << 20)
        await client.sync()

    scenarios = {"execute": execute, "read": read, "sync": sync, "empty": empty_drop}
    out = {}
    for name, fn in scenarios.items():
        if which not in ("all", name):
            continue
        await fn()
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            await fn()
            best = min(best, (time.perf_counter() - t0) / reps * 1e6)
        out[name] = best
    if which in ("all", "handler"):
        out["handler"] = await _handler(client, add, max(1, reps // 400))
    await client.close()
    return out


async def _handler(client: Any, add: Any, per_task: int) -> float:
    """CPU µs per request of ``bench_service``'s handler (create 256 KiB, empty, bind,
    execute, await read) run by 64 tasks at once (commands queue for the actor, as in a
    loaded service); best of 3 rounds, in process CPU time (steadier than the wall clock
    on a shared machine; the two 256 KiB host copies included)."""
    import asynccube as ac

    n = 64 * 1024
    count, body = ac.CubeCount(n // 256), bytes(4 * n)

    async def handle() -> None:
        x, y = client.create(body), client.empty(4 * n)
        b = ac.Bindings().with_buffers([x.binding(), x.binding(), y.binding()])
        client.execute(add, count, b.with_scalar(np.uint32, [n]))
        await client.read([y])

    async def task(k: int) -> None:
        for _ in range(k):
            await handle()

    await asyncio.gather(*(task(per_task) for _ in range(64)))
    best = float("inf")
    for _ in range(3):
        t0 = time.process_time()
        await asyncio.gather(*(task(per_task) for _ in range(64)))
        best = min(best, (time.process_time() - t0) / (64 * per_task) * 1e6)
    return best


def main() -> None:
    """Print µs per command (or a cProfile of one scenario)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", choices=["execute", "read", "sync", "empty", "handler"])
    parser.add_argument("--reps", type=int, default=20000)
    args = parser.parse_args()
    install_fake()
    from asynccube._core.cuda.native.hotpath import ACTIVE

    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        asyncio.run(measure(args.profile, args.reps))
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        return
    figures = asyncio.run(measure("all", args.reps))
    print(f"hot path: {ACTIVE}, python {sys.version.split()[0]}, pid {os.getpid()}")
    for name, us in figures.items():
        unit = "us of CPU per request (64 tasks)" if name == "handler" else "us/command"
        print(f"{name:8s} {us:7.2f} {unit}")


if __name__ == "__main__":
    main()
