"""Compiling, loading and launching kernels with the ABI packer on a real GPU."""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache
from typing import Any

import numpy as np
import pytest

from asynccube._core.cuda import abi, driver
from asynccube._core.cuda.compiler import KernelCompiler
from asynccube._core.cuda.driver import check, cu
from asynccube._core.memory.slice import ReleaseQueue, SliceHandle
from asynccube._core.values.bindings import (
    Bindings,
    MetadataBinding,
    TensorMapBinding,
    TensorMapMeta,
    TiledFormat,
)
from asynccube._core.values.kernel import CudaSource
from asynccube._core.values.stream_id import StreamId
from asynccube._core.values.types import Handle

SOURCE = r"""
#include <asynccube.h>
extern "C" __global__ void spin(unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}

__device__ void put(unsigned char* out, int at, const void* p, int n) {
    for (int i = 0; i < n; ++i) out[at + i] = ((const unsigned char*)p)[i];
}

extern "C" __global__ void probe(unsigned char* out, const unsigned char* second,
        const __grid_constant__ ac_tensor_map t0, double d0, float f0, float f1, ac_f16 h0,
        long long l0, int i0, unsigned char u0, ac_metadata<3> meta) {
    int at = 0;
    unsigned long long p = (unsigned long long)second;
    put(out, at, &p, 8); at += 8;
    put(out, at, &t0, 128); at += 128;
    put(out, at, &d0, 8); at += 8;
    put(out, at, &f0, 4); at += 4;
    put(out, at, &f1, 4); at += 4;
    put(out, at, &h0, 2); at += 2;
    put(out, at, &l0, 8); at += 8;
    put(out, at, &i0, 4); at += 4;
    put(out, at, &u0, 1); at += 1;
    put(out, at, &meta, 12);
}
"""


@cache
def _function(name: str) -> Any:
    props = driver.device_properties(0)
    cubin = KernelCompiler(cache_dir=None).compile(
        CudaSource(SOURCE, entry=name), props.extra["arch"]
    )
    module = check(cu().cuModuleLoadData(cubin.cubin), "cuModuleLoadData")
    return check(cu().cuModuleGetFunction(module, cubin.symbol.encode()), "cuModuleGetFunction")


def spin(stream: Any, seconds: float) -> None:
    """Launch a kernel that runs for ``seconds`` on ``stream``."""
    arg = np.array([int(seconds * 1e9)], np.uint64)
    params = np.array([arg.ctypes.data], np.uint64)
    check(
        cu().cuLaunchKernel(_function("spin"), 1, 1, 1, 1, 1, 1, 0, stream, params.ctypes.data, 0)
    )


def fake_tensor_map(handle: Handle) -> TensorMapBinding:
    """A tensor map binding whose 128 bytes are passed through as they are (no TMA)."""
    meta = TensorMapMeta(TiledFormat((8,)), 1, (64,), (1,), (1,), np.dtype(np.uint8))
    return TensorMapBinding(handle.binding(), meta)


@pytest.fixture(scope="module")
def gpu() -> Iterator[driver.DeviceContext]:
    ctx = driver.DeviceContext.open(0)
    yield ctx
    ctx.make_current()
    ctx.close()


@pytest.mark.cuda
def test_every_parameter_kind_reaches_the_kernel(gpu: driver.DeviceContext) -> None:
    gpu.make_current()
    d = cu()
    q = ReleaseQueue(-3)
    hs = [Handle(SliceHandle(i, q), None, None, StreamId(0), 0, 64) for i in range(2)]
    b = (
        Bindings()
        .with_buffers([h.binding() for h in hs])
        .with_scalar(np.float64, [3.25])
        .with_scalar(np.float32, [1.5, -2.0])
        .with_scalar(np.float16, [0.5])
        .with_scalar(np.int64, [-(2**40)])
        .with_scalar(np.int32, [-9])
        .with_scalar(np.uint8, [200])
        .with_metadata(MetadataBinding([11, 22, 33]))
        .with_tensor_maps([fake_tensor_map(hs[0])])
    )
    out = check(d.cuMemAlloc(4096))
    tmap = bytes(range(128))
    packer = abi.ArgPacker()  # the kernelParams array lives as long as the packer
    params = packer.pack(b, [int(out), 0x1234_5678_9ABC_DEF0], [tmap])
    check(d.cuLaunchKernel(_function("probe"), 1, 1, 1, 1, 1, 1, 0, 0, params, 0))
    got = bytearray(179)
    check(d.cuMemcpyDtoH(got, out, len(got)))
    check(d.cuMemFree(out))
    want = b"".join(
        [
            (0x1234_5678_9ABC_DEF0).to_bytes(8, "little"),
            tmap,
            np.float64(3.25).tobytes(),
            np.array([1.5, -2.0], np.float32).tobytes(),
            np.float16(0.5).tobytes(),
            np.int64(-(2**40)).tobytes(),
            np.int32(-9).tobytes(),
            bytes([200]),
            np.array([11, 22, 33], np.uint32).tobytes(),
        ]
    )
    assert bytes(got) == want
