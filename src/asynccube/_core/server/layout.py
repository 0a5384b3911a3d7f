"""Tensor layouts shared by servers: strides, pitched rows, strided copies."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from ..errors import BufferTooBig, InvalidArgument, UnsupportedStrides
from ..values.types import AllocationDescriptor, AllocationKind, CopyDescriptor
from .host_copies import new_bytes

__all__ = [
    "allocation_layout",
    "check_copy",
    "contiguous_strides",
    "gather",
    "gather_array",
    "gather_into",
    "scatter",
]


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Row-major strides, in elements."""
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * max(shape[i + 1], 1)
    return tuple(strides)


def allocation_layout(desc: AllocationDescriptor, row_align: int) -> tuple[int, tuple[int, ...]]:
    """Bytes to reserve and the strides (elements) for ``desc``.

    OPTIMIZED tensors of rank >= 2 get rows padded to a multiple of ``row_align`` bytes
    (and of the element size); everything else is contiguous.
    """
    _check_descriptor(desc)
    shape, elem = desc.shape, desc.elem_size
    if desc.kind is AllocationKind.CONTIGUOUS or len(shape) < 2:
        return desc.nbytes, contiguous_strides(shape)
    unit = math.lcm(row_align, elem)
    pitch = -(-shape[-1] * elem // unit) * unit if shape[-1] else 0
    row_elems = pitch // elem
    strides = contiguous_strides((*shape[:-1], row_elems))
    return pitch * math.prod(shape[:-1]), strides


def _check_descriptor(desc: AllocationDescriptor) -> None:
    if desc.elem_size <= 0:
        raise InvalidArgument(f"elem_size must be positive, got {desc.elem_size}")
    if any(not isinstance(d, int) or d < 0 for d in desc.shape):
        raise BufferTooBig(-1, f"shape {desc.shape} has a negative or non-int dimension")


def check_copy(desc: CopyDescriptor, data_len: int | None = None) -> None:
    """Validate a copy descriptor against its binding (and the data length, if given)."""
    shape, strides, elem = desc.shape, desc.strides, desc.elem_size
    if elem <= 0 or len(shape) != len(strides):
        raise InvalidArgument(
            f"copy descriptor needs elem_size > 0 and len(shape) == len(strides), "
            f"got elem_size={elem}, shape={shape}, strides={strides}"
        )
    if any(d < 0 for d in shape) or any(s < 0 for s in strides):
        raise UnsupportedStrides(f"negative shape or strides: shape={shape}, strides={strides}")
    extent = span_bytes(shape, strides, elem)
    if extent > desc.binding.size:
        raise InvalidArgument(
            f"shape {shape} with strides {strides} spans {extent} bytes, "
            f"but the binding has {desc.binding.size}"
        )
    if data_len is not None and data_len != desc.nbytes:
        raise InvalidArgument(
            f"data has {data_len} bytes but shape {shape} x {elem} needs {desc.nbytes}"
        )


def span_bytes(shape: Sequence[int], strides: Sequence[int], elem: int) -> int:
    """Bytes from the first to just past the last element addressed."""
    if any(d == 0 for d in shape):
        return 0
    return (sum((d - 1) * s for d, s in zip(shape, strides, strict=True)) + 1) * elem


def _strided(view: npt.NDArray[np.uint8], desc: CopyDescriptor) -> npt.NDArray[np.uint8]:
    elem = desc.elem_size
    if not desc.shape:
        return view[:elem]
    typed = view[: span_bytes(desc.shape, desc.strides, elem)]
    byte_strides = (*(s * elem for s in desc.strides), 1)
    return np.lib.stride_tricks.as_strided(
        typed, shape=(*desc.shape, elem), strides=byte_strides, writeable=True
    )


def gather(view: npt.NDArray[np.uint8], desc: CopyDescriptor) -> bytes:
    """The tensor ``desc`` describes inside ``view``, densely packed, as new ``bytes``
    (filled by numpy with the GIL released, see :func:`.copies.new_bytes`)."""
    out, dst = new_bytes(desc.nbytes)
    gather_into(dst, view, desc)
    return out


def gather_array(view: npt.NDArray[np.uint8], desc: CopyDescriptor) -> npt.NDArray[np.uint8]:
    """Like :func:`gather`, into a new writable uint8 array the caller owns."""
    dst = np.empty(desc.nbytes, dtype=np.uint8)
    gather_into(dst, view, desc)
    return dst


def gather_into(
    dst: npt.NDArray[np.uint8], view: npt.NDArray[np.uint8], desc: CopyDescriptor
) -> None:
    """Pack the tensor ``desc`` describes inside ``view`` into ``dst`` (its size)."""
    if desc.strides == contiguous_strides(desc.shape):
        np.copyto(dst, view[: desc.nbytes])
        return
    np.copyto(dst.reshape((*desc.shape, desc.elem_size)), _strided(view, desc))


def scatter(view: npt.NDArray[np.uint8], desc: CopyDescriptor, data: npt.NDArray[np.uint8]) -> None:
    """Write dense bytes ``data`` into the tensor ``desc`` describes inside ``view``."""
    if desc.strides == contiguous_strides(desc.shape):
        np.copyto(view[: desc.nbytes], data)
        return
    _strided(view, desc)[...] = data.reshape((*desc.shape, desc.elem_size))
