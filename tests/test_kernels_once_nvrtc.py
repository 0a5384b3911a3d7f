"""The CUDA source of kernels written once compiles with NVRTC for every supported dtype
signature (no GPU needed): codegen bugs show here, not on a GPU machine."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import asynccube as ac
from asynccube._core.cuda import compiler
from asynccube._core.cuda.compiler import KernelCompiler
from asynccube._core.errors import CompilationError
from asynccube._core.kernels.dtypes import SUPPORTED

# The modules (the package exports functions of the same names).
elementwise_module = importlib.import_module("asynccube._core.kernels.elementwise")
reduction_module = importlib.import_module("asynccube._core.kernels.reduction")

try:
    compiler.nvrtc_version()
except CompilationError as exc:  # pragma: no cover - depends on the machine
    pytest.skip(f"NVRTC is not available: {exc}", allow_module_level=True)

pytestmark = [pytest.mark.asyncio, pytest.mark.allow_loop_lag]  # compiles on the loop

ARCH = "sm_90"


@pytest.fixture(scope="module")
def comp() -> KernelCompiler:
    # No CUDA headers: generated kernels need none (a GPU machine may have none).
    return KernelCompiler(cache_dir=None, include_cuda_headers=False)


def _sources(kernel: Any) -> Iterator[ac.CudaSource]:
    for spec in kernel._specs.values():
        for k in getattr(spec, "kernels", None) or (spec.kernel,):
            assert k.cuda is not None
            yield k.cuda


def _compile_all(comp: KernelCompiler, kernel: Any) -> int:
    count = 0
    for source in _sources(kernel):
        out = comp.compile(source, ARCH)
        assert out.cubin.startswith(b"\x7fELF")
        count += 1
    return count


def _tensor(
    client: ac.ComputeClient, dtype: np.dtype[Any], shape: tuple[int, ...] = (4,)
) -> ac.Tensor:
    return client.empty_array(shape, dtype)


ALL_OPS = (
    "y = where(x > s, x * s + x // s - x % s, -x) ; z = maximum(x, s) == minimum(x, s); "
    "w = abs(x) + sign(x) + square(x) + x ** 2 + fmod(x, s)"
)


@pytest.mark.parametrize("dtype", [str(d) for d in SUPPORTED if d != np.bool_])
async def test_elementwise_compiles_in_every_dtype(
    host_client: ac.ComputeClient, comp: KernelCompiler, dtype: str
) -> None:
    dt = np.dtype(dtype)
    kernel = ac.elementwise(ALL_OPS)
    kernel.bind(host_client, x=_tensor(host_client, dt), s=dt.type(3))  # a strong scalar
    kernel.bind(host_client, x=_tensor(host_client, dt), s=3)  # a weak one
    math = ac.elementwise("y = exp(x) + log1p(abs(x)) + tanh(x) + floor(x) + sqrt(x) + atan2(x, x)")
    math.bind(host_client, x=_tensor(host_client, dt))
    casts = ac.elementwise("; ".join(f"c{i} = {d}(x)" for i, d in enumerate(SUPPORTED)))
    casts.bind(host_client, x=_tensor(host_client, dt))
    assert sum(_compile_all(comp, k) for k in (kernel, math, casts)) == 4


async def test_bool_logic_and_a_wide_index_compile(
    host_client: ac.ComputeClient, comp: KernelCompiler, monkeypatch: pytest.MonkeyPatch
) -> None:
    flags = ac.elementwise("y = (a and not b) or (a ^ b) or ~a; z = where(a, 1.5, 2)")
    t = _tensor(host_client, np.dtype(np.bool_))
    flags.bind(host_client, a=t, b=True)
    assert _compile_all(comp, flags) == 1
    for module in (elementwise_module, reduction_module):
        monkeypatch.setattr(module, "WIDE", 0)  # the 64-bit index even for 4 elements
    kernel, total = ac.elementwise("y = x + 1"), ac.reduction("sum")
    x = _tensor(host_client, np.dtype(np.float32), (2, 2))
    kernel.bind(host_client, x=x)
    for axis in (None, 0, 1):
        total.bind(host_client, x=x, axis=axis)
    assert "unsigned long long i" in next(_sources(kernel)).source
    assert _compile_all(comp, kernel) + _compile_all(comp, total) == 5


@pytest.mark.parametrize("op", ["sum", "prod", "min", "max"])
@pytest.mark.parametrize("dtype", [str(d) for d in SUPPORTED])
async def test_reductions_compile_in_every_dtype(
    host_client: ac.ComputeClient, comp: KernelCompiler, op: str, dtype: str
) -> None:
    dt = np.dtype(dtype)
    kernel = ac.reduction(op)
    x = _tensor(host_client, dt, (3, 5))
    for axis in (None, 0, 1):
        kernel.bind(host_client, x=x, axis=axis)
    assert _compile_all(comp, kernel) == 4  # partial + finish, two axes


async def test_a_map_with_scalars_and_a_float16_output_compiles(
    host_client: ac.ComputeClient, comp: KernelCompiler
) -> None:
    dot = ac.reduction("sum", "x * y + a")
    x = _tensor(host_client, np.dtype(np.float32), (3, 5))
    out = _tensor(host_client, np.dtype(np.float16), ())
    dot.bind(host_client, x=x, y=x, a=np.float16(1), out=out)
    dot.bind(host_client, x=x, y=x, a=1, axis=1)
    assert _compile_all(comp, dot) == 3
