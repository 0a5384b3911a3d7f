"""Kernels used across the tests, with both a host and a CUDA part."""

from __future__ import annotations

import time

import numpy as np

import asynccube as ac

ADD_CUDA = r"""
extern "C" __global__ void add(const float* a, const float* b, float* out, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}
"""


def _add_host(launch: ac.HostLaunch) -> None:
    a, b, out = (buf.view(np.float32) for buf in launch.buffers)
    n = int(launch.scalar(np.uint32))
    out[:n] = a[:n] + b[:n]


ADD = ac.Kernel("test_add_f32", cuda=ac.CudaSource(ADD_CUDA, entry="add"), host=_add_host)

SCALE_CUDA = r"""
extern "C" __global__ void scale(float* x, float factor, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] * factor;
}
"""


def _scale_host(launch: ac.HostLaunch) -> None:
    (x,) = (buf.view(np.float32) for buf in launch.buffers)
    n = int(launch.scalar(np.uint32))
    x[:n] *= launch.scalar(np.float32)


SCALE = ac.Kernel("test_scale_f32", cuda=ac.CudaSource(SCALE_CUDA, entry="scale"), host=_scale_host)


def _slow_fill_host(launch: ac.HostLaunch) -> None:
    (x,) = launch.buffers
    time.sleep(float(launch.scalar(np.float32)))
    x[:] = np.uint8(launch.scalar(np.uint8))


SLOW_FILL = ac.Kernel("test_slow_fill", host=_slow_fill_host)
"""Sleeps (releasing the GIL) then fills its buffer with a byte: a slow writer."""


def add_bindings(a: ac.Handle, b: ac.Handle, out: ac.Handle, n: int) -> ac.Bindings:
    """Bindings for ADD over n float32."""
    return (
        ac.Bindings()
        .with_buffers([a.binding(), b.binding(), out.binding()])
        .with_scalar(np.uint32, [n])
    )


def blocks(n: int, block: int = 256) -> ac.CubeCount:
    """Enough cubes for n elements."""
    return ac.CubeCount(max(1, -(-n // block)))


NOOP = ac.Kernel("test_noop", host=lambda launch: None)

SPIN_CUDA = r"""
extern "C" __global__ void spin(unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}
"""


def _spin_host(launch: ac.HostLaunch) -> None:
    time.sleep(int(launch.scalar(np.uint64)) / 1e9)


SPIN = ac.Kernel(
    "test_spin", cuda=ac.CudaSource(SPIN_CUDA, entry="spin", block=(1, 1, 1)), host=_spin_host
)
"""Keeps its stream busy for a uint64 scalar of nanoseconds (the device's clock on CUDA,
a sleep that releases the GIL on the host); launch it with ``CubeCount(1)``."""


def spin(seconds: float) -> ac.Bindings:
    """Bindings for SPIN."""
    return ac.Bindings().with_scalar(np.uint64, [int(seconds * 1e9)])
