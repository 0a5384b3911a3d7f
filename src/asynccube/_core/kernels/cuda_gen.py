"""CUDA C++ of an elementwise kernel, and the parts a reduction kernel shares with it:
the parameter list in the argument ABI's order (buffers, scalars grouped by dtype,
metadata), the scalars' conversion and each element's loads."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..values.bindings import SCALAR_DTYPES
from .cuda_expr import PREAMBLE, convert, emit
from .dtypes import Ty, c_storage, c_value, param_dtype, strong
from .typing import Typed

__all__ = ["KernelParts", "abi_scalars", "elementwise_source", "index_type"]

BLOCK = 256
"""Threads per block of every generated kernel."""


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
        lines = []
        for k, (_, dt) in enumerate(self.arrays):
            raw = f"p{k}[{index}]"
            value = f"ac_h2f({raw})" if dt == np.float16 else raw
            lines.append(f"const {c_value(dt)} a{k} = {value};")
        return lines

    def names(self) -> dict[str, str]:
        out = {name: f"a{k}" for k, (name, _) in enumerate(self.arrays)}
        out.update({name: f"v{k}" for k, (name, _) in enumerate(self.scalars)})
        return out


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
) -> str:
    """The translation unit of an elementwise kernel (entry ``ac_elementwise``): a
    grid-stride loop computing each statement per element."""
    idx = index_type(wide)
    names = parts.names()
    body = parts.load_lines("i")
    for j, ((target, typed), dt) in enumerate(zip(statements, outputs, strict=True)):
        value = convert(emit(typed, names), typed.dtype, dt)
        body.append(f"const {c_value(dt)} o{j} = {value};")
        body.append(f"q{j}[i] = {store(f'o{j}', dt)};")
        names[target] = f"o{j}"
    loop = "\n        ".join(body)
    return f"""{PREAMBLE}
extern "C" __global__ void ac_elementwise({parts.params()}) {{
    {count_lines(wide)}
    {" ".join(parts.scalar_lines())}
    for ({idx} i = ({idx})blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += ({idx})blockDim.x * gridDim.x) {{
        {loop}
    }}
}}
"""
