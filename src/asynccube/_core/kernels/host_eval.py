"""The host (numpy) side of a kernel written once: a typed tree evaluated in chunks.

Scalar-only parts are computed once per launch (:func:`fold`); the rest runs chunk by
chunk (:data:`CHUNK` elements), each operation a ufunc call with ``out=`` into a scratch
buffer of one chunk (or straight into the output), so no full-size temporary is made
and each chunk stays in cache. Each ufunc runs the loop typing chose (``signature=``),
so the host computes what the CUDA kernel computes, in the same dtypes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from .expr import Arg, Const
from .ops import ufunc
from .typing import Typed

__all__ = ["CHUNK", "ChunkEval", "fold"]

CHUNK: Final = 32768
"""Elements per chunk: a few scratch buffers of it stay in the L2 cache."""

Array = npt.NDArray[Any]


def fold(typed: Typed, scalars: Mapping[str, Any], out: dict[int, Any]) -> None:
    """Compute every scalar-only node of ``typed`` (into ``out``, by node id)."""
    for arg in typed.args:
        fold(arg, scalars, out)
    if typed.array:
        return
    value = _fold_one(typed, scalars, out)
    if isinstance(typed.ty, np.dtype):
        out[id(typed)] = np.asarray(value).astype(typed.ty, casting="unsafe")[()]
    else:
        out[id(typed)] = typed.ty(value.item() if isinstance(value, np.generic) else value)


def _fold_one(typed: Typed, scalars: Mapping[str, Any], done: dict[int, Any]) -> Any:
    node = typed.node
    if isinstance(node, Arg):
        return scalars[node.name]
    if isinstance(node, Const):
        return node.value
    vals = [done[id(a)] for a in typed.args]
    if node.op.startswith("cast:"):
        return vals[0]  # fold() casts it
    if node.op == "where":
        return vals[1] if vals[0] else vals[2]
    cast = [
        np.asarray(v).astype(dt, casting="unsafe") for v, dt in zip(vals, typed.loop, strict=True)
    ]
    return ufunc(node.op)(*cast, signature=(*typed.loop, typed.dtype), casting="unsafe")[()]


class ChunkEval:
    """Evaluates typed trees over one chunk ``[lo, hi)`` of the arrays.

    Args:
        arrays: Each array argument's (and earlier output's) flat view, by name.
        folded: The scalar-only nodes' values (from :func:`fold`).
    """

    def __init__(self, arrays: Mapping[str, Array], folded: Mapping[int, Any]) -> None:
        self.arrays = arrays
        self.folded = folded
        self._scratch: dict[int, Array] = {}
        self.lo = self.hi = 0

    def scratch(self, typed: Typed, dtype: np.dtype[Any] | None = None) -> Array:
        key = id(typed) if dtype is None else -id(typed)
        size = self.hi - self.lo
        buf = self._scratch.get(key)
        if buf is None or buf.size < size:
            buf = self._scratch[key] = np.empty(max(CHUNK, size), dtype or typed.dtype)
        return buf[:size]

    def into(self, typed: Typed, dest: Array) -> None:
        """Evaluate ``typed`` over the chunk into ``dest`` (cast as numpy casts)."""
        value = self.value(typed, dest)
        if value is not dest:
            np.copyto(dest, value, casting="unsafe")

    def value(self, typed: Typed, out: Array | None = None) -> Any:
        """The chunk's values of ``typed``: a scalar, a view of an argument, or ``out``
        (where its dtype allows) or a scratch buffer holding them."""
        if not typed.array:
            return self.folded[id(typed)]
        node = typed.node
        if isinstance(node, Arg):
            return self.arrays[node.name][self.lo : self.hi]
        assert not isinstance(node, Const)
        if node.op == "where":  # into scratch: its output may alias an operand
            dest = self.scratch(typed)
            self._where(typed, dest)
            return dest
        if node.op.startswith("cast:"):
            dest = out if out is not None and out.dtype == typed.dtype else self.scratch(typed)
            self.into(typed.args[0], dest)
            return dest
        dest = out if out is not None else self.scratch(typed)
        vals = [self.value(a) for a in typed.args]
        ufunc(node.op)(*vals, out=dest, signature=(*typed.loop, typed.dtype), casting="unsafe")
        return dest

    def _where(self, typed: Typed, dest: Array) -> None:
        cond_t, a_t, b_t = typed.args
        cond = self.value(cond_t)
        if not cond_t.array:
            self.into(a_t if cond else b_t, dest)
            return
        if cond.dtype != np.bool_:
            cond = np.not_equal(cond, 0, out=self.scratch(cond_t, np.dtype(np.bool_)))
        np.copyto(dest, self.value(b_t), casting="unsafe")
        np.copyto(dest, self.value(a_t), casting="unsafe", where=cond)
