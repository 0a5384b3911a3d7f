"""Encoding ``TensorMapBinding`` s as 128-byte ``CUtensorMap`` s for TMA.

``TensorMapMeta`` gives shape and strides innermost first, strides in elements; the
driver wants the global address, the dimensions, the byte strides of every dimension but
the innermost, the box (tile) and the traversal strides. Tiled maps use
``cuTensorMapEncodeTiled``, im2col maps ``cuTensorMapEncodeIm2col``. The result is passed
to the kernel by value as a ``const __grid_constant__`` parameter (see the ABI).
"""

from __future__ import annotations

import ctypes
from typing import Any, Final

import numpy as np

from ..errors import InvalidArgument
from ..values.bindings import Im2colFormat, OobFill, TensorMapMeta, TiledFormat
from .abi import TENSOR_MAP_BYTES
from .driver import check, cu

__all__ = ["encode_tensor_map"]

_DTYPES: Final = {
    "uint8": "UINT8",
    "int8": "UINT8",
    "uint16": "UINT16",
    "int16": "UINT16",
    "uint32": "UINT32",
    "int32": "INT32",
    "uint64": "UINT64",
    "int64": "INT64",
    "float16": "FLOAT16",
    "float32": "FLOAT32",
    "float64": "FLOAT64",
    "bfloat16": "BFLOAT16",
}


def _data_type(meta: TensorMapMeta) -> Any:
    name = _DTYPES.get(np.dtype(meta.storage_ty).name)
    if name is None:
        raise InvalidArgument(f"TMA has no data type for {meta.storage_ty}")
    return getattr(cu().CUtensorMapDataType, f"CU_TENSOR_MAP_DATA_TYPE_{name}")


def _enums(meta: TensorMapMeta) -> tuple[Any, Any, Any, Any]:
    d = cu()
    interleave = d.CUtensorMapInterleave(meta.interleave.value)
    swizzle = d.CUtensorMapSwizzle(meta.swizzle.value)
    promo = d.CUtensorMapL2promotion(meta.prefetch.value)
    fill = d.CUtensorMapFloatOOBfill(1 if meta.oob_fill is OobFill.NAN else 0)
    return interleave, swizzle, promo, fill


def _check(meta: TensorMapMeta, address: int) -> None:
    rank = meta.rank
    if not 1 <= rank <= 5 or len(meta.shape) != rank or len(meta.strides) != rank:
        raise InvalidArgument(
            f"a tensor map needs 1 to 5 dims with one shape and stride each, got rank {rank}, "
            f"shape {meta.shape}, strides {meta.strides}"
        )
    if address % 16:
        raise InvalidArgument(f"TMA needs a 16-byte aligned address, got {address:#x}")


def encode_tensor_map(meta: TensorMapMeta, address: int) -> bytes:
    """The 128 bytes of the ``CUtensorMap`` for ``meta`` over device memory at ``address``."""
    _check(meta, address)
    d = cu()
    item = np.dtype(meta.storage_ty).itemsize
    dims = [d.cuuint64_t(int(n)) for n in meta.shape]
    strides = [d.cuuint64_t(int(s) * item) for s in meta.strides[1:]]
    elem = [d.cuuint32_t(int(e)) for e in meta.elem_stride]
    interleave, swizzle, promo, fill = _enums(meta)
    dtype = _data_type(meta)
    fmt = meta.format
    if isinstance(fmt, TiledFormat):
        box = [d.cuuint32_t(int(b)) for b in fmt.tile_size]
        res = d.cuTensorMapEncodeTiled(
            dtype, meta.rank, address, dims, strides, box, elem, interleave, swizzle, promo, fill
        )
        tmap = check(res, "cuTensorMapEncodeTiled")
    elif isinstance(fmt, Im2colFormat):
        res = d.cuTensorMapEncodeIm2col(
            dtype, meta.rank, address, dims, strides,
            list(fmt.pixel_box_lower_corner), list(fmt.pixel_box_upper_corner),
            fmt.channels_per_pixel, fmt.pixels_per_column, elem,
            interleave, swizzle, promo, fill,
        )  # fmt: skip
        tmap = check(res, "cuTensorMapEncodeIm2col")
    else:
        raise InvalidArgument(f"unknown tensor map format {fmt!r}")
    return ctypes.string_at(int(tmap.getPtr()), TENSOR_MAP_BYTES)
