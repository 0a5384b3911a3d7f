"""Kernel parameter sizes read from the cubin (no driver, no failing driver query)."""

from __future__ import annotations

import numpy as np
import pytest

from asynccube._core.cuda.abi import Signature
from asynccube._core.cuda.compiler import KernelCompiler
from asynccube._core.cuda.cubin import kernel_param_sizes
from asynccube._core.values.kernel import CudaSource


def _compile(body: str, entry: str = "k", arch: str = "sm_90a") -> tuple[bytes, str]:
    src = CudaSource("#include <asynccube.h>\n" + body, entry)
    out = KernelCompiler().compile(src, arch)
    return out.cubin, out.symbol


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_sizes_of_every_kind_of_parameter(arch: str) -> None:
    sig = Signature(2, 1, [(np.float64, 1), (np.int16, 2), (np.int8, 1)], 5)
    body = f'extern "C" __global__ void k({sig.c_params()}) {{ if (b0) b0[0] = float64_0; }}'
    cubin, symbol = _compile(body, arch=arch)
    assert kernel_param_sizes(cubin, symbol) == tuple(sig.param_sizes())


def test_no_parameters() -> None:
    cubin, symbol = _compile('extern "C" __global__ void k() {}')
    assert kernel_param_sizes(cubin, symbol) == ()


def test_unknown_symbol_or_not_a_cubin() -> None:
    cubin, _ = _compile('extern "C" __global__ void k(float* a) { a[0] = 1; }')
    assert kernel_param_sizes(cubin, "other") is None
    assert kernel_param_sizes(b"not an elf", "k") is None
    assert kernel_param_sizes(cubin[:100], "k") is None
