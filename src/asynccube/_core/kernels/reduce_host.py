"""The host (numpy) parts of the reduction kernels. The whole-tensor pass writes the
full result into the first partial (identities into the rest), so the finishing pass
is the same launch on both servers. A map that is an argument itself is reduced in one
ufunc call (numpy's own speed); any other is evaluated chunk by chunk (:mod:`.host_eval`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from ..values.kernel import HostLaunch
from .dtypes import Ty
from .elementwise import host_scalars, launch_count
from .expr import Arg
from .host_eval import CHUNK, ChunkEval, fold
from .typing import Typed

__all__ = ["axis_host", "finish_host", "identity", "partial_host"]

HostFn = Callable[[HostLaunch], None]
Arrays = tuple[tuple[str, np.dtype[Any]], ...]


def identity(op: str, acc: np.dtype[Any]) -> Any:
    """The identity of ``op`` (a ufunc name) as a scalar of ``acc``."""
    if op in ("add", "multiply"):
        return acc.type(op == "multiply")
    low = op == "maximum"
    if acc.kind == "b":
        return acc.type(not low)
    if acc.kind == "f":
        return acc.type(-np.inf if low else np.inf)
    info = np.iinfo(acc)
    return acc.type(info.min if low else info.max)


class _Mapper:
    """The map's values over a launch's views, in chunks (or the argument itself)."""

    def __init__(self, mapped: Typed, arrays: Arrays, scalars: tuple[tuple[str, Ty], ...]):
        self.mapped, self.arrays, self.scalars = mapped, arrays, scalars

    def views(self, launch: HostLaunch, n: int) -> dict[str, npt.NDArray[Any]]:
        return {
            name: buf[: n * dt.itemsize].view(dt)
            for (name, dt), buf in zip(self.arrays, launch.buffers, strict=False)
        }

    def direct(self) -> str | None:
        """The argument's name when the map is a bare array argument."""
        node = self.mapped.node
        return node.name if isinstance(node, Arg) and self.mapped.array else None

    def evaluator(self, launch: HostLaunch, views: dict[str, npt.NDArray[Any]]) -> ChunkEval:
        folded: dict[int, Any] = {}
        fold(self.mapped, host_scalars(launch, self.scalars), folded)
        return ChunkEval(views, folded)


def _reduce(op: str, values: Any, acc: np.dtype[Any], axis: int | None = None) -> Any:
    fn: np.ufunc = getattr(np, op)
    if op in ("add", "multiply"):  # an identity of their own (and faster without initial=)
        return fn.reduce(values, axis=axis, dtype=acc)
    return fn.reduce(values, axis=axis, dtype=acc, initial=identity(op, acc))


def _whole(mapper: _Mapper, launch: HostLaunch, op: str, acc: np.dtype[Any], n: int) -> Any:
    views = mapper.views(launch, n)
    name = mapper.direct()
    if name is not None:
        return _reduce(op, views[name], acc)
    chunks, total = mapper.evaluator(launch, views), identity(op, acc)
    combine: np.ufunc = getattr(np, op)
    for lo in range(0, n, CHUNK):
        chunks.lo, chunks.hi = lo, min(n, lo + CHUNK)
        total = combine(total, _reduce(op, chunks.value(mapper.mapped), acc), dtype=acc)
    return total


def partial_host(
    mapped: Typed, arrays: Arrays, scalars: tuple[tuple[str, Ty], ...], op: str, acc: np.dtype[Any]
) -> HostFn:
    """The host part of ``ac_reduce_partial``."""
    mapper = _Mapper(mapped, arrays, scalars)

    def run(launch: HostLaunch) -> None:
        partials = launch.buffers[-1].view(acc)[: launch.count[0]]
        with np.errstate(all="ignore"):
            partials[0] = _whole(mapper, launch, op, acc, launch_count(launch))
        partials[1:] = identity(op, acc)

    return run


def finish_host(op: str, acc: np.dtype[Any], out: np.dtype[Any]) -> HostFn:
    """The host part of ``ac_reduce_finish``."""

    def run(launch: HostLaunch) -> None:
        partials = launch.buffers[0].view(acc)[: int(launch.metadata[0])]
        result = launch.buffers[1][: out.itemsize].view(out)
        with np.errstate(all="ignore"):
            np.copyto(result, _reduce(op, partials, acc), casting="unsafe")

    return run


def axis_host(
    mapped: Typed,
    arrays: Arrays,
    scalars: tuple[tuple[str, Ty], ...],
    op: str,
    acc: np.dtype[Any],
    out: np.dtype[Any],
    axis: int,
) -> HostFn:
    """The host part of ``ac_reduce_axis``."""
    mapper = _Mapper(mapped, arrays, scalars)

    def run(launch: HostLaunch) -> None:
        rows, cols = launch_count(launch, 0), launch_count(launch, 2)
        views = mapper.views(launch, rows * cols)
        result = launch.buffers[-1][: (cols if axis == 0 else rows) * out.itemsize].view(out)
        with np.errstate(all="ignore"):
            np.copyto(
                result, _axis(mapper, launch, views, op, acc, axis, rows, cols), casting="unsafe"
            )

    return run


def _axis(
    mapper: _Mapper,
    launch: HostLaunch,
    views: dict[str, npt.NDArray[Any]],
    op: str,
    acc: np.dtype[Any],
    axis: int,
    rows: int,
    cols: int,
) -> Any:
    name = mapper.direct()
    if name is not None:
        return _reduce(op, views[name].reshape(rows, cols), acc, axis)
    chunks = mapper.evaluator(launch, views)
    step = max(1, CHUNK // max(cols, 1))
    parts = []
    for r in range(0, rows, step):
        r1 = min(rows, r + step)
        chunks.lo, chunks.hi = r * cols, r1 * cols
        block = np.asarray(chunks.value(mapper.mapped)).reshape(r1 - r, cols)
        parts.append(_reduce(op, block, acc, axis))
    if axis == 1:
        return np.concatenate(parts) if parts else np.empty(0, acc)
    return _reduce(op, np.stack(parts), acc, 0) if parts else np.full(cols, identity(op, acc))
