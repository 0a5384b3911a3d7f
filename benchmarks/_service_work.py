"""The two workloads of ``bench_service.py`` and every service's handler for them.

* ``small``: 256 KiB of float32 ``x`` in, ``y = 2x + 1`` (a one-thread-per-element
  kernel), 256 KiB out.
* ``compute``: 64 KiB of float32 ``x`` in, one block of 256 threads running
  ``FMA_SRC`` (each thread, for each of its elements, ``iters`` dependent FMAs
  ``v = v * A + B``; ~1 ms on an H200 at the iteration count ``bench_service.py``
  calibrates), 64 KiB out. asynccube and the CuPy peers run the same CUDA source; the
  host server runs the same math in numpy (``_host_fma``), with a smaller iteration count
  (``HOST_ITERS``: numpy takes ~10 µs per pass over 64 KiB).

A handler is ``async (body: bytes) -> bytes``. The answers are checked by ``Checker``:
``small`` exactly against numpy, ``compute`` against the closed form of the iteration
(float64, within 1e-3: the device's fused multiply-add rounds differently from numpy's
multiply-then-add), each input's first answer, then every later answer byte for byte
against that first one (the kernels are deterministic).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

Handler = Callable[[bytes], Awaitable[bytes]]

Y_SRC = r"""
extern "C" __global__ void y2x1(const float* x, float* y, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i] + 1.0f;
}
"""
A, B = np.float32(0.9999), np.float32(0.0001)
FMA_SRC = r"""
extern "C" __global__ void fma_loop(const float* x, float* y, unsigned int n,
                                    unsigned int iters) {
    for (unsigned int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = x[i];
        for (unsigned int k = 0; k < iters; ++k) v = fmaf(v, 0.9999f, 0.0001f);
        y[i] = v;
    }
}
"""
FMA_THREADS = 256
HOST_ITERS = 16
"""The compute workload's iterations on the host server (numpy, not the device)."""
GPU_ITERS = 7700
"""The compute workload's iterations on a GPU unless calibrated (~1 ms on an H200: 64
elements per thread, ~4 cycles per dependent FMA at ~1.98 GHz)."""

OURS = {"asynccube": 1000, "asynccube_lowlag": 200}
"""asynccube's services and their ``streaming.batch_us`` (the default; a small budget)."""
GPU_PEERS = ("cupy_thread", "cupy_streams", "torch_thread", "cupy_blocking")


@dataclass(frozen=True)
class Workload:
    """What one request carries and computes."""

    name: str
    n_floats: int
    iters: int = 0

    @property
    def nbytes(self) -> int:
        """The size of the body in and of the body out."""
        return self.n_floats * 4

    def host(self, x: np.ndarray) -> np.ndarray:
        """The answer computed in numpy (float32, as the host server does)."""
        if self.name == "small":
            return x * np.float32(2) + np.float32(1)
        v = x.copy()
        for _ in range(self.iters):
            np.multiply(v, A, out=v)
            v += B
        return v

    def expected(self, x: np.ndarray) -> np.ndarray:
        """The reference answer: exact for ``small``; the iteration's closed form."""
        if self.name == "small":
            return self.host(x)
        a, b = float(A), float(B)
        ak = a**self.iters
        return ak * x.astype(np.float64) + b * (1 - ak) / (1 - a)

    def inputs(self, count: int = 8) -> list[bytes]:
        """``count`` random bodies."""
        rng = np.random.default_rng()
        return [rng.standard_normal(self.n_floats).astype(np.float32).tobytes()
                for _ in range(count)]  # fmt: skip


def workload(name: str, iters: int = 0) -> Workload:
    """``small`` or ``compute`` (with ``iters`` FMAs per element)."""
    if name == "small":
        return Workload("small", 64 * 1024)
    if name == "compute":
        return Workload("compute", 16 * 1024, iters)
    raise ValueError(f"unknown workload {name!r}: small or compute")


class Checker:
    """Checks answers (see the module docstring); ``bodies`` are the inputs sent."""

    def __init__(self, work: Workload, bodies: list[bytes], echo: bool = False) -> None:
        self.work, self.bodies, self.echo = work, bodies, echo
        exact = echo or work.name == "small"
        self.want: list[bytes | None] = [
            (b if echo else work.expected(np.frombuffer(b, np.float32)).tobytes())
            if exact else None
            for b in bodies
        ]  # fmt: skip

    def ok(self, i: int, got: bytes) -> bool:
        """Whether ``got`` is the right answer to ``bodies[i]``."""
        want = self.want[i]
        if want is not None:
            return got == want
        if len(got) != self.work.nbytes:
            return False
        x = np.frombuffer(self.bodies[i], np.float32)
        close = np.allclose(np.frombuffer(got, np.float32), self.work.expected(x), 1e-3, 1e-3)
        if close:
            self.want[i] = bytes(got)
        return bool(close)


def _host_y2x1(launch: Any) -> None:
    x = launch.buffers[0].view(np.float32)
    y = launch.buffers[1].view(np.float32)
    n = int(launch.scalar(np.uint32))
    np.multiply(x[:n], np.float32(2), out=y[:n])
    y[:n] += np.float32(1)


def _host_fma(launch: Any) -> None:
    x = launch.buffers[0].view(np.float32)
    y = launch.buffers[1].view(np.float32)
    n, iters = int(launch.scalar(np.uint32, 0)), int(launch.scalar(np.uint32, 1))
    y[:n] = Workload("compute", n, iters).host(x[:n])


@dataclass
class AsyncCubeParts:
    """What asynccube's handler uses: the client, kernel, grid and scalars."""

    client: Any
    kernel: Any
    count: Any
    scalars: list[int]
    nbytes: int

    def bindings(self, x: Any, y: Any) -> Any:
        """The launch's bindings for input ``x`` and output ``y``."""
        import asynccube as ac

        return (ac.Bindings().with_buffers([x.binding(), y.binding()])
                .with_scalar(np.uint32, self.scalars))  # fmt: skip


async def asynccube_parts(
    work: Workload, device: str, stack: list[Any], batch_us: int = 1000
) -> AsyncCubeParts:
    """A client on ``device`` (appended to ``stack``, closed by the caller) and the
    workload's kernel."""
    import asynccube as ac

    client = await ac.connect(device, config={"streaming": {"batch_us": batch_us}})
    stack.append(client)
    if work.name == "small":
        cuda = ac.CudaSource(Y_SRC, "y2x1", (256, 1, 1))
        kernel = ac.Kernel("bench_service_y2x1", cuda=cuda, host=_host_y2x1)
        return AsyncCubeParts(client, kernel, ac.CubeCount((work.n_floats + 255) // 256),
                              [work.n_floats], work.nbytes)  # fmt: skip
    kernel = ac.Kernel("bench_service_fma_loop",
                       cuda=ac.CudaSource(FMA_SRC, "fma_loop", (FMA_THREADS, 1, 1)),
                       host=_host_fma)  # fmt: skip
    return AsyncCubeParts(client, kernel, ac.CubeCount(1), [work.n_floats, work.iters],
                          work.nbytes)  # fmt: skip


async def _asynccube(
    work: Workload, device: str, stack: list[Any], batch_us: int
) -> tuple[Handler, str]:
    p = await asynccube_parts(work, device, stack, batch_us)
    client, kernel, count, nbytes = p.client, p.kernel, p.count, p.nbytes

    async def handle(body: bytes) -> bytes:
        x = client.create(body)
        y = client.empty(nbytes)
        client.execute(kernel, count, p.bindings(x, y))
        (out,) = await client.read([y])
        return out

    await handle(bytes(nbytes))  # compile and load before the clock starts
    return handle, f"asynccube on {client.device}, batch_us {batch_us}"


def _cupy_fn(work: Workload, streams: bool) -> Callable[[bytes], bytes]:
    """CuPy's answer to one body; with ``streams``, each thread on its own
    non-blocking stream."""
    import cupy as cp

    cp.cuda.runtime.getDeviceCount()  # raises without a GPU
    if work.name == "small":

        def compute(x: Any) -> Any:
            return 2 * x + 1
    else:
        kern = cp.RawKernel(FMA_SRC, "fma_loop")
        scalars = (np.uint32(work.n_floats), np.uint32(work.iters))

        def compute(x: Any) -> Any:
            y = cp.empty_like(x)
            kern((1,), (FMA_THREADS,), (x, y, *scalars))
            return y

    def run(body: bytes) -> bytes:
        x = cp.asarray(np.frombuffer(body, np.float32))
        out: bytes = compute(x).get().tobytes()
        return out

    local = threading.local()

    def on_stream(body: bytes) -> bytes:
        stream = getattr(local, "stream", None)
        if stream is None:
            stream = local.stream = cp.cuda.Stream(non_blocking=True)
        with stream:  # the copies, the kernel and get() on this thread's stream
            return run(body)

    fn = on_stream if streams else run
    fn(bytes(work.nbytes))
    return fn


def _torch_fn(work: Workload) -> Callable[[bytes], bytes]:
    import torch

    if work.name != "small":
        raise RuntimeError("torch_thread runs the small workload only")
    if not torch.cuda.is_available():
        raise RuntimeError("torch.cuda.is_available() is False")

    def fn(body: bytes) -> bytes:
        x = torch.frombuffer(bytearray(body), dtype=torch.float32).to("cuda")
        y = x * 2 + 1
        out: bytes = y.cpu().numpy().tobytes()
        return out

    fn(bytes(work.nbytes))
    return fn


async def make_handler(
    peer: str, work: Workload, device: str, stack: list[Any]
) -> tuple[Handler, str]:
    """The handler for ``peer``; raises with the reason when it cannot run here."""
    if peer in OURS:
        return await _asynccube(work, device, stack, OURS[peer])
    if peer == "numpy_loop":  # the floor: aiohttp and the bodies, no device at all

        async def on_loop(body: bytes) -> bytes:
            return work.host(np.frombuffer(body, np.float32)).tobytes()

        return on_loop, "numpy on the loop (no device)"
    if peer == "echo":  # the HTTP stack's own cost: the body back, no compute

        async def echo(body: bytes) -> bytes:
            return body

        return echo, "echo (no compute)"
    if peer not in GPU_PEERS:
        raise RuntimeError(f"unknown service {peer!r}")
    if device == "host":
        raise RuntimeError(f"{peer} needs a GPU; this run uses the host server")
    if peer == "torch_thread":
        fn = _torch_fn(work)
    else:
        fn = _cupy_fn(work, streams=peer == "cupy_streams")
    if peer == "cupy_blocking":

        async def blocking(body: bytes) -> bytes:
            return fn(body)

        return blocking, peer

    async def threaded(body: bytes) -> bytes:
        return await asyncio.to_thread(fn, body)

    return threaded, peer
