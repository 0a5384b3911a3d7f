"""CUDA C++ of the reduction kernels: a block reduction (warp shuffles, then one warp
over the warps' values in shared memory), used by the whole-array pass (one partial per
block, then one block reduces the partials) and by the per-row and per-column
reductions of a 2-D tensor.

The whole-array pass reads 16-byte vectors, several per thread per tile (all loads
before the folds), as :mod:`.cuda_gen` describes; each thread folds its elements in a
fixed order, so a result depends only on the input and its size: deterministic."""

from __future__ import annotations

from typing import Any

import numpy as np

from .cuda_expr import PREAMBLE, convert, emit
from .cuda_gen import (
    BLOCK,
    VEC_TYPE,
    KernelParts,
    aligned_check,
    count_lines,
    index_type,
    store,
    tile_elements,
    tile_loop,
)
from .dtypes import c_value
from .typing import Typed

__all__ = ["axis_source", "c_identity", "finish_source", "partial_source"]

_COMBINE = {
    "add": "(a + b)",
    "multiply": "(a * b)",
    "minimum": "ac_min(a, b)",
    "maximum": "ac_max(a, b)",
}


def c_identity(op: str, acc: np.dtype[Any]) -> str:
    """The identity of ``op`` in C: 0, 1, or the largest/smallest value of ``acc``."""
    ct = c_value(acc)
    if op in ("add", "multiply"):
        return f"(({ct}){int(op == 'multiply')})"
    low = op == "maximum"
    if acc.kind == "b":
        return "false" if low else "true"
    if acc.kind == "f":
        inf = "__longlong_as_double(0x7ff0000000000000LL)"
        return f"(({ct})(-{inf}))" if low else f"(({ct}){inf})"
    info = np.iinfo(acc)
    value = int(info.min if low else info.max)
    if value == -(1 << 63):
        return "((long long)(-9223372036854775807LL - 1))"
    return f"(({ct}){value}{'ULL' if acc.kind == 'u' else 'LL'})"


def _helpers(op: str, acc: np.dtype[Any]) -> str:
    ct = c_value(acc)
    warps = BLOCK // 32
    return f"""{PREAMBLE}{VEC_TYPE}
__device__ __forceinline__ {ct} ac_combine({ct} a, {ct} b) {{ return ({ct}){_COMBINE[op]}; }}
__device__ __forceinline__ {ct} ac_warp_reduce({ct} v) {{
    #pragma unroll
    for (int k = 16; k > 0; k >>= 1) v = ac_combine(v, ({ct})__shfl_down_sync(0xffffffffu, v, k));
    return v;
}}
__device__ __forceinline__ {ct} ac_block_reduce({ct} v) {{
    __shared__ {ct} s[{warps}];
    v = ac_warp_reduce(v);
    if ((threadIdx.x & 31u) == 0) s[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x < 32) {{
        v = threadIdx.x < {warps}u ? s[threadIdx.x] : {c_identity(op, acc)};
        v = ac_warp_reduce(v);
    }}
    __syncthreads();
    if (threadIdx.x == 0) s[0] = v;
    __syncthreads();
    const {ct} out = s[0];
    __syncthreads();
    return out;
}}
"""


def _element(parts: KernelParts, mapped: Typed, acc: np.dtype[Any], index: str) -> str:
    """Lines folding element ``index`` into ``acc``."""
    value = convert(emit(mapped, parts.names()), mapped.dtype, acc)
    return " ".join([*parts.load_lines(index), f"acc = ac_combine(acc, {value});"])


def partial_source(
    parts: KernelParts,
    mapped: Typed,
    op: str,
    acc: np.dtype[Any],
    wide: bool,
    per_thread: int = 16,
) -> str:
    """Entry ``ac_reduce_partial``: each block folds a grid-stride share of the ``n``
    elements (tiles of ``BLOCK * unroll`` vectors, then the scalar tail; unaligned
    bindings: the scalar loop) into ``partials[blockIdx.x]`` (buffer ``r0``)."""
    idx = index_type(wide)
    width, unroll = tile_elements([dt for _, dt in parts.arrays], per_thread)
    value = convert(emit(mapped, parts.names()), mapped.dtype, acc)
    element = " ".join(
        [*parts.raw_loads(lambda k: f"L{k}[u].v[e]"), f"acc = ac_combine(acc, {value});"]
    )
    pointers = [(f"p{k}", width * dt.itemsize) for k, (_, dt) in enumerate(parts.arrays)]
    loads = "\n        ".join(parts.vector_loads(width, unroll, idx, "nv"))
    return f"""{_helpers(op, acc)}
extern "C" __global__ void __launch_bounds__({BLOCK}) ac_reduce_partial({parts.params()}) {{
    {count_lines(wide)}
    {" ".join(parts.scalar_lines())}
    {aligned_check(pointers)}
    {c_value(acc)} acc = {c_identity(op, acc)};
    {idx} i = ({idx})blockIdx.x * blockDim.x + threadIdx.x;
    {tile_loop(idx, width, unroll, loads, element)}
    for (; i < n; i += ({idx})blockDim.x * gridDim.x) {{
        {_element(parts, mapped, acc, "i")}
    }}
    acc = ac_block_reduce(acc);
    if (threadIdx.x == 0) r0[blockIdx.x] = acc;
}}
"""


def finish_source(op: str, acc: np.dtype[Any], out: np.dtype[Any]) -> str:
    """Entry ``ac_reduce_finish``: one block folds the ``meta.v[0]`` partials into
    ``out[0]``."""
    ct = c_value(acc)
    value = store(convert("acc", acc, out), out)
    out_ct = "unsigned short" if out == np.float16 else c_value(out)
    return f"""{_helpers(op, acc)}
extern "C" __global__ void ac_reduce_finish(const {ct}* partials, {out_ct}* out,
                                            ac_metadata<1> meta) {{
    {ct} acc = {c_identity(op, acc)};
    for (unsigned int i = threadIdx.x; i < meta.v[0]; i += blockDim.x)
        acc = ac_combine(acc, partials[i]);
    acc = ac_block_reduce(acc);
    if (threadIdx.x == 0) out[0] = {value};
}}
"""


def axis_source(
    parts: KernelParts,
    mapped: Typed,
    op: str,
    acc: np.dtype[Any],
    out: np.dtype[Any],
    axis: int,
    wide: bool,
) -> str:
    """Entry ``ac_reduce_axis``: a ``rows x cols`` tensor (metadata: rows, cols)
    reduced along ``axis`` into buffer ``r0``: axis 1, one block per row; axis 0, one
    thread per column (reads coalesced across the threads)."""
    idx = index_type(wide)
    result = store(convert("acc", acc, out), out)
    element = _element(parts, mapped, acc, "i")
    init = f"{c_value(acc)} acc = {c_identity(op, acc)};"
    if axis == 1:
        loop = f"""for ({idx} r = blockIdx.x; r < rows; r += gridDim.x) {{
        {init}
        for ({idx} c = threadIdx.x; c < cols; c += blockDim.x) {{
            const {idx} i = r * cols + c; {element}
        }}
        acc = ac_block_reduce(acc);
        if (threadIdx.x == 0) r0[r] = {result};
    }}"""
    else:
        loop = f"""for ({idx} c = ({idx})blockIdx.x * blockDim.x + threadIdx.x; c < cols;
         c += ({idx})blockDim.x * gridDim.x) {{
        {init}
        for ({idx} r = 0; r < rows; ++r) {{
            const {idx} i = r * cols + c; {element}
        }}
        r0[c] = {result};
    }}"""
    rows = count_lines(wide, 0).replace(" n ", " rows ")
    cols = count_lines(wide, 2).replace(" n ", " cols ")
    return f"""{_helpers(op, acc)}
extern "C" __global__ void ac_reduce_axis({parts.params()}) {{
    {rows}
    {cols}
    {" ".join(parts.scalar_lines())}
    {loop}
}}
"""
