"""Strided copies between device tensors and dense host bytes, as 2D copies.

Any tensor described by shape and strides (in elements) is copied with as few
``cuMemcpy2DAsync`` calls as its layout allows: the longest innermost run that is dense
on the device becomes the row ("width"), the next dimension the rows ("height", with the
device pitch), and the remaining outer dimensions, merged where they are evenly spaced,
are looped over. A contiguous tensor is one plain 1D copy; a pitched (OPTIMIZED) matrix
one 2D copy; a transposed view one 2D copy per row of the result.

The plan is pure arithmetic (no driver), so it is tested without a GPU.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from .driver import check, cu, error_from
from .native.hotpath import hot

__all__ = ["CopyPlan", "issue_copy", "plan_copy"]


@dataclass(frozen=True, slots=True)
class CopyPlan:
    """How to move a strided tensor to or from dense host memory.

    Attributes:
        width: Bytes per row (dense on both sides).
        height: Rows per 2D copy (1: a plain 1D copy of ``width`` bytes).
        pitch: Device bytes between consecutive rows.
        outer: ``(device_offset, host_offset)`` in bytes of each 2D copy.
        span: Device bytes from the first byte touched to one past the last.
    """

    width: int
    height: int
    pitch: int
    outer: tuple[tuple[int, int], ...]
    span: int

    @property
    def is_contiguous(self) -> bool:
        """One dense 1D copy."""
        return self.height == 1 and len(self.outer) == 1

    def copies(self) -> Iterator[tuple[int, int]]:
        """The ``(device_offset, host_offset)`` of each copy."""
        return iter(self.outer)


def _dims(shape: Sequence[int], strides: Sequence[int]) -> list[tuple[int, int]]:
    return [(d, s) for d, s in zip(shape, strides, strict=True) if d != 1]


def plan_copy(shape: Sequence[int], strides: Sequence[int], elem: int) -> CopyPlan:
    """The copy plan of a tensor of ``shape``/``strides`` (elements) and ``elem`` bytes.

    The dense host layout is row-major over ``shape``.
    """
    if len(shape) == 1 and strides[0] == 1:  # the common case, fast
        n = shape[0] * elem
        return CopyPlan(n, 1, n, ((0, 0),), n) if n else CopyPlan(0, 1, 0, (), 0)
    total = math.prod(shape) * elem
    if total == 0:
        return CopyPlan(0, 1, 0, (), 0)
    dims = _dims(shape, strides)
    width, rest = _dense_run(dims, elem)
    if not rest:
        return CopyPlan(width, 1, width, ((0, 0),), width)
    outer = _merge(rest)
    height, step = outer.pop()
    pitch = step * elem
    block = width * height
    offsets = []
    for host_index, idx in enumerate(itertools.product(*(range(d) for d, _ in outer))):
        dev = sum(i * s for i, (_, s) in zip(idx, outer, strict=True)) * elem
        offsets.append((dev, host_index * block))
    span = (sum((d - 1) * s for d, s in dims) * elem) + elem
    return CopyPlan(width, height, pitch, tuple(offsets), span)


def _dense_run(dims: list[tuple[int, int]], elem: int) -> tuple[int, list[tuple[int, int]]]:
    """Bytes of the innermost run dense on the device, and the dimensions left over."""
    run = 1
    i = len(dims)
    while i > 0 and dims[i - 1][1] == run:
        run *= dims[i - 1][0]
        i -= 1
    return run * elem, dims[:i]


def _merge(dims: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Merge adjacent outer dimensions that are evenly spaced (fewer, larger loops)."""
    out: list[tuple[int, int]] = []
    for d, s in dims:
        if out and out[-1][1] == s * d:
            pd, _ = out.pop()
            out.append((pd * d, s))
        else:
            out.append((d, s))
    return out


def issue_copy(plan: CopyPlan, dev: int, host: int, stream: Any, *, to_device: bool) -> None:
    """Queue the copies of ``plan`` between device address ``dev`` and dense host memory
    at ``host`` (page-locked, so the copies are asynchronous) on ``stream``."""
    d = cu()
    if plan.is_contiguous:
        err = hot.memcpy_async(to_device, dev, host, plan.width, stream)
        if err:
            raise error_from(err, "cuMemcpyHtoDAsync" if to_device else "cuMemcpyDtoHAsync")
        return
    if plan.pitch < plan.width:  # overlapping rows (stride 0): one copy per row
        for dev_off, host_off in plan.copies():
            for r in range(plan.height):
                row = CopyPlan(plan.width, 1, plan.width, ((0, 0),), plan.width)
                issue_copy(row, dev + dev_off + r * plan.pitch, host + host_off + r * plan.width,
                      stream, to_device=to_device)  # fmt: skip
        return
    for dev_off, host_off in plan.copies():
        p = _memcpy2d(plan, dev + dev_off, host + host_off, to_device)
        check(d.cuMemcpy2DAsync(p, stream), "cuMemcpy2DAsync")


def _memcpy2d(plan: CopyPlan, dev: int, host: int, to_device: bool) -> Any:
    d = cu()
    p = d.CUDA_MEMCPY2D()
    device_kind = d.CUmemorytype.CU_MEMORYTYPE_DEVICE
    host_kind = d.CUmemorytype.CU_MEMORYTYPE_HOST
    if to_device:
        p.srcMemoryType, p.srcHost, p.srcPitch = host_kind, host, plan.width
        p.dstMemoryType, p.dstDevice, p.dstPitch = device_kind, dev, plan.pitch
    else:
        p.srcMemoryType, p.srcDevice, p.srcPitch = device_kind, dev, plan.pitch
        p.dstMemoryType, p.dstHost, p.dstPitch = host_kind, host, plan.width
    p.WidthInBytes = plan.width
    p.Height = plan.height
    return p
