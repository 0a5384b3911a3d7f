"""DLPack capsules made with ctypes (the structs of ``dlpack.h``, v1.1).

:func:`make_capsule` wraps an address, shape, strides and dtype in a ``"dltensor"``
capsule (a ``DLManagedTensor``) or, when the consumer allows version 1, a
``"dltensor_versioned"`` one (a ``DLManagedTensorVersioned``). The Python object
``owner`` is kept in a registry until the consumer calls the deleter, or until the
capsule is destroyed unconsumed; that is what keeps the exported buffer alive. The
deleter may run on any thread the consumer frees from; it only drops the reference.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from .errors import DLPackError

__all__ = ["DLPACK_VERSION", "dtype_code", "live_exports", "make_capsule"]

DLPACK_VERSION = (1, 1)
_CODES = {"i": 0, "u": 1, "f": 2, "c": 5, "b": 6}


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _Device),
        ("ndim", ctypes.c_int32),
        ("dtype", _DataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class _Managed(ctypes.Structure):
    _fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER)]


class _Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _ManagedVersioned(ctypes.Structure):
    _fields_ = [
        ("version", _Version),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", _DELETER),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", _Tensor),
    ]


_NAME = b"dltensor"
_NAME_VERSIONED = b"dltensor_versioned"
_lock = threading.Lock()
_exports: dict[int, tuple[Any, ...]] = {}
"""Address of each live managed struct -> what it keeps alive (struct, arrays, owner)."""


def live_exports() -> int:
    """How many exported capsules' buffers are still held (by a consumer or a capsule)."""
    return len(_exports)


def dtype_code(dtype: np.dtype[Any]) -> tuple[int, int]:
    """DLPack ``(code, bits)`` of a numpy dtype, or DLPackError if it has none."""
    code = _CODES.get(dtype.kind)
    if code is None or dtype.byteorder == ">" or dtype.hasobject:
        raise DLPackError(f"dtype {dtype} cannot be expressed in DLPack")
    return code, dtype.itemsize * 8


def _release(address: int) -> None:
    """The deleter: drop what the export kept alive (any thread; never raises)."""
    with _lock:
        _exports.pop(address, None)


_deleter = _DELETER(_release)

_api = ctypes.pythonapi
_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, _DESTRUCTOR]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]


def _on_capsule_freed(capsule: int) -> None:
    """A capsule nobody consumed (its name unchanged) releases its export itself."""
    for name in (_NAME, _NAME_VERSIONED):
        if _api.PyCapsule_IsValid(capsule, name):
            _release(_api.PyCapsule_GetPointer(capsule, name))
            return


_destructor = _DESTRUCTOR(_on_capsule_freed)


def make_capsule(
    address: int,
    device: tuple[int, int],
    shape: Sequence[int],
    strides: Sequence[int],
    dtype: np.dtype[Any],
    owner: Any,
    *,
    versioned: bool,
) -> Any:
    """A DLPack capsule over ``address`` (strides in elements) keeping ``owner`` alive
    until the consumer is done with it."""
    code, bits = dtype_code(dtype)
    ndim = len(shape)
    dims = (ctypes.c_int64 * max(ndim, 1))(*shape)
    steps = (ctypes.c_int64 * max(ndim, 1))(*strides)
    tensor = _Tensor(
        ctypes.c_void_p(address), _Device(*device), ndim, _DataType(code, bits, 1),
        dims, steps, 0,
    )  # fmt: skip
    managed: _Managed | _ManagedVersioned
    if versioned:
        managed = _ManagedVersioned(_Version(*DLPACK_VERSION), None, _deleter, 0, tensor)
    else:
        managed = _Managed(tensor, None, _deleter)
    key = ctypes.addressof(managed)
    with _lock:
        _exports[key] = (managed, dims, steps, owner)
    return _api.PyCapsule_New(key, _NAME_VERSIONED if versioned else _NAME, _destructor)
