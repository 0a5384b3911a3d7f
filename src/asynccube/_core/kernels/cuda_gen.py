"""CUDA C++ of an elementwise kernel, and the parts a reduction kernel shares with it:
the parameter list in the argument ABI's order (buffers, scalars grouped by dtype,
metadata), the scalars' conversion, each element's loads, and the vectorized tiles.

Bandwidth: each thread moves 16-byte vectors (:func:`vector_width` elements of the
widest dtype; ``ac_vec``, an aligned array the compiler loads in one instruction),
several of them per tile (:func:`tile_elements`), all loads issued before any use, so
enough bytes are in flight to saturate HBM. The vector path runs when every pointer is
aligned to its vector (checked in the kernel: a binding may start at any offset); the
``n % width`` tail and unaligned bindings take a scalar grid-stride loop."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..values.bindings import SCALAR_DTYPES
from .cuda_expr import PREAMBLE, convert, emit
from .dtypes import Ty, c_storage, c_value, param_dtype, strong
from .typing import Typed

__all__ = [
    "OPTIONS",
    "KernelParts",
    "abi_scalars",
    "elementwise_source",
    "index_type",
    "tile_elements",
    "vector_width",
]

BLOCK = 256
"""Threads per block of every generated kernel."""

OPTIONS = ("--fmad=false",)
"""NVRTC options of every generated kernel: numpy rounds a product before adding to it,
so ``a * x + b`` is not contracted to one FMA (the kernels are memory-bound: it costs
nothing)."""

VECTOR_BYTES = 16
"""Bytes of the widest dtype's vector (one 128-bit load or store)."""

VEC_TYPE = r"""
template <typename T, int N> struct alignas(sizeof(T) * N) ac_vec { T v[N]; };
"""
"""An aligned array of ``N`` elements: loaded and stored as one vector."""


def vector_width(dtypes: Sequence[np.dtype[Any]]) -> int:
    """Elements per vector: 16 bytes of the widest of ``dtypes``."""
    return max(1, VECTOR_BYTES // max((dt.itemsize for dt in dtypes), default=1))


def tile_elements(dtypes: Sequence[np.dtype[Any]], per_thread: int) -> tuple[int, int]:
    """``(width, unroll)``: the vector width and vectors per thread of one tile, so that
    a thread handles at least ``per_thread`` elements (whole vectors) per tile."""
    width = vector_width(dtypes)
    return width, max(1, per_thread // width)


def abi_scalars(scalars: Sequence[tuple[str, Ty]]) -> list[tuple[str, Ty]]:
    """The scalar arguments in the ABI's order: grouped by the dtype they are passed as
    (``SCALAR_DTYPES`` order), in the order given within a group."""
    rank = {dt: i for i, dt in enumerate(SCALAR_DTYPES)}
    return sorted(scalars, key=lambda item: rank[param_dtype(item[1])])


def index_type(wide: bool) -> str:
    """The loop index: 32 bits unless the element count needs more."""
    return "unsigned long long" if wide else "unsigned int"


@dataclass(frozen=True, slots=True)
class KernelParts:
    """A kernel's array inputs, extra buffer parameters (declarations), scalars (ABI
    order) and metadata words; :meth:`names` maps each name to its C value."""

    arrays: tuple[tuple[str, np.dtype[Any]], ...]
    buffers: tuple[str, ...]
    scalars: tuple[tuple[str, Ty], ...]
    meta_words: int

    def params(self) -> str:
        out = [f"const {c_storage(dt)}* p{k}" for k, (_, dt) in enumerate(self.arrays)]
        out += list(self.buffers)
        for k, (_, ty) in enumerate(self.scalars):
            pdt = param_dtype(ty)
            out.append(f"{'ac_f16' if pdt == np.float16 else c_value(pdt)} s{k}")
        out.append(f"ac_metadata<{self.meta_words}> meta")
        return ", ".join(out)

    def scalar_lines(self) -> list[str]:
        lines = []
        for k, (_, ty) in enumerate(self.scalars):
            dt = strong(ty)
            raw = f"ac_h2f(s{k}.bits)" if dt == np.float16 else f"s{k}"
            value = f"({raw} != 0)" if dt == np.bool_ else raw
            lines.append(f"const {c_value(dt)} v{k} = {value};")
        return lines

    def load_lines(self, index: str) -> list[str]:
        """Each array's element ``index``."""
        return self.raw_loads(lambda k: f"p{k}[{index}]")

    def raw_loads(self, raw: Callable[[int], str]) -> list[str]:
        """Each array's value from ``raw(k)``, the bits of array ``k``'s element."""
        lines = []
        for k, (_, dt) in enumerate(self.arrays):
            value = f"ac_h2f({raw(k)})" if dt == np.float16 else raw(k)
            lines.append(f"const {c_value(dt)} a{k} = {value};")
        return lines

    def vector_loads(self, width: int, unroll: int, idx: str, bound: str) -> list[str]:
        """Lines loading ``unroll`` vectors of each array into ``L<k>[u]`` (vector
        ``j = base + threadIdx.x + u * BLOCK`` while ``j < bound``)."""
        lines = [
            f"ac_vec<{c_storage(dt)}, {width}> L{k}[{unroll}];"
            for k, (_, dt) in enumerate(self.arrays)
        ]
        if not self.arrays:
            return lines
        loads = " ".join(
            f"L{k}[u] = reinterpret_cast<const ac_vec<{c_storage(dt)}, {width}>*>(p{k})[j];"
            for k, (_, dt) in enumerate(self.arrays)
        )
        return [
            *lines,
            "#pragma unroll",
            f"for (int u = 0; u < {unroll}; ++u) {{",
            f"    {tile_index(idx)} if (j < {bound}) {{ {loads} }}",
            "}",
        ]

    def names(self) -> dict[str, str]:
        out = {name: f"a{k}" for k, (name, _) in enumerate(self.arrays)}
        out.update({name: f"v{k}" for k, (name, _) in enumerate(self.scalars)})
        return out


def tile_index(idx: str) -> str:
    """Vector ``j`` of unrolled step ``u`` in the tile at ``base``: coalesced."""
    return f"const {idx} j = base + threadIdx.x + (unsigned int)u * {BLOCK}u;"


def tile_loop(
    idx: str, width: int, unroll: int, loads: str, element: str, before: str = "", after: str = ""
) -> str:
    """The aligned path of a vector kernel (elementwise and the reduction's first pass):
    grid-stride over tiles of ``BLOCK * unroll`` vectors of ``width`` elements, each
    tile's ``loads`` issued before any use, then per vector ``before``, ``element`` for
    each of its lanes (``e``), ``after``; ``i`` is left past the vectors, for the scalar
    tail."""
    tile = BLOCK * unroll
    inner = [f"{before}\n                " if before else "", "#pragma unroll\n"]
    inner.append(f"                for (int e = 0; e < {width}; ++e) {{ {element} }}")
    if after:
        inner.append(f"\n                {after}")
    return f"""if (aligned) {{
        const {idx} nv = n / {width}u;
        for ({idx} base = ({idx})blockIdx.x * {tile}u; base < nv;
             base += ({idx})gridDim.x * {tile}u) {{
        {loads}
        #pragma unroll
        for (int u = 0; u < {unroll}; ++u) {{
            {tile_index(idx)}
            if (j < nv) {{
                {"".join(inner)}
            }}
        }}
        }}
        i += nv * {width}u;
    }}"""


def aligned_check(pointers: Sequence[tuple[str, int]]) -> str:
    """``const bool aligned``: each ``(pointer, bytes)`` is aligned to ``bytes``."""
    terms = [f"((unsigned long long)({p}) & {b - 1}ULL)" for p, b in pointers if b > 1]
    test = f"({' | '.join(terms)}) == 0ULL" if terms else "true"
    return f"const bool aligned = {test};"


def store(expr: str, dt: np.dtype[Any]) -> str:
    """A value of ``dt`` as the bits written to memory."""
    return f"ac_f2h({expr})" if dt == np.float16 else expr


def count_lines(wide: bool, first: int = 0) -> str:
    """``n`` from metadata words ``first`` (low) and ``first + 1`` (high)."""
    if wide:
        return (
            f"const unsigned long long n = (unsigned long long)meta.v[{first}] | "
            f"((unsigned long long)meta.v[{first + 1}] << 32);"
        )
    return f"const unsigned int n = meta.v[{first}];"


def elementwise_source(
    parts: KernelParts,
    statements: Sequence[tuple[str, Typed]],
    outputs: Sequence[np.dtype[Any]],
    wide: bool,
    per_thread: int = 8,
) -> str:
    """The translation unit of an elementwise kernel (entry ``ac_elementwise``): tiles
    of ``BLOCK * unroll`` vectors per block (grid-stride over tiles), then the scalar
    tail; unaligned bindings take the scalar loop for every element."""
    idx = index_type(wide)
    dtypes = [dt for _, dt in parts.arrays] + list(outputs)
    width, unroll = tile_elements(dtypes, per_thread)

    def compute(loads: list[str], put: Callable[[int, str], str]) -> str:
        names = parts.names()
        body = list(loads)
        for j, ((target, typed), dt) in enumerate(zip(statements, outputs, strict=True)):
            value = convert(emit(typed, names), typed.dtype, dt)
            body.append(f"const {c_value(dt)} o{j} = {value};")
            body.append(put(j, store(f"o{j}", dt)))
            names[target] = f"o{j}"
        return " ".join(body)

    scalar = compute(parts.load_lines("i"), lambda j, v: f"q{j}[i] = {v};")
    packs = " ".join(f"ac_vec<{c_storage(dt)}, {width}> S{j};" for j, dt in enumerate(outputs))
    element = compute(parts.raw_loads(lambda k: f"L{k}[u].v[e]"), lambda j, v: f"S{j}.v[e] = {v};")
    writes = " ".join(
        f"reinterpret_cast<ac_vec<{c_storage(dt)}, {width}>*>(q{j})[j] = S{j};"
        for j, dt in enumerate(outputs)
    )
    pointers = [(f"p{k}", width * dt.itemsize) for k, (_, dt) in enumerate(parts.arrays)]
    pointers += [(f"q{j}", width * dt.itemsize) for j, dt in enumerate(outputs)]
    loads = "\n        ".join(parts.vector_loads(width, unroll, idx, "nv"))
    stride = f"({idx})blockDim.x * gridDim.x"
    return f"""{PREAMBLE}{VEC_TYPE}
extern "C" __global__ void __launch_bounds__({BLOCK}) ac_elementwise({parts.params()}) {{
    {count_lines(wide)}
    {" ".join(parts.scalar_lines())}
    {aligned_check(pointers)}
    {idx} i = ({idx})blockIdx.x * blockDim.x + threadIdx.x;
    {tile_loop(idx, width, unroll, loads, element, packs, writes)}
    for (; i < n; i += {stride}) {{
        {scalar}
    }}
}}
"""
