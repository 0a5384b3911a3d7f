"""DLPack capsules (the structs of ``dlpack.h``, v1.1), made and read in C
(``_native_dlpack.c``) or through ctypes, its pure-Python twin.

:func:`make_capsule` wraps an address, shape, strides and dtype in a ``"dltensor"``
capsule (a ``DLManagedTensor``) or, when the consumer allows version 1, a
``"dltensor_versioned"`` one (a ``DLManagedTensorVersioned``). The Python object
``owner`` is kept (a reference in the C struct, or a registry entry) until the consumer
calls the deleter, or until the capsule is destroyed unconsumed; that is what keeps the
exported buffer alive. The
deleter may run on any thread the consumer frees from; it only drops the reference.

:class:`Imported` consumes a producer's capsule: read, renamed and its deleter called
once the memory is no longer used, in one compiled call each where the extension
``_native_dlpack.c`` imports (and ``ASYNCCUBE_NO_EXTENSIONS`` is not set), else through
ctypes (its pure-Python twin, the same fields read the same way).
"""

from __future__ import annotations

import ctypes
import struct
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import DLPackError
from ..extensions import compiled
from ..server.layout import contiguous_strides

__all__ = [
    "DLPACK_VERSION",
    "Imported",
    "dtype_code",
    "live_exports",
    "make_capsule",
    "take_capsule",
]

DLPACK_VERSION = (1, 1)
_MAJOR, _MINOR = DLPACK_VERSION
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


_NATIVE, NATIVE_REASON = compiled("asynccube._core.client._native_dlpack")
"""The compiled capsule maker and reader (``_native_dlpack.c``), or None: capsules are
then made and read through ctypes (the pure-Python twin); ``NATIVE_REASON`` says why."""

_NAME = b"dltensor"
_NAME_VERSIONED = b"dltensor_versioned"
_lock = threading.Lock()
_exports: dict[int, tuple[Any, ...]] = {}
"""Address of each live managed struct -> what it keeps alive (struct, arrays, owner)."""


def live_exports() -> int:
    """How many exported capsules' buffers are still held (by a consumer or a capsule)."""
    return len(_exports) + (_NATIVE.live() if _NATIVE is not None else 0)


def dtype_code(dtype: np.dtype[Any]) -> tuple[int, int]:
    """DLPack ``(code, bits)`` of a numpy dtype, or DLPackError if it has none."""
    known = _DTYPE_CODES.get(dtype)
    if known is not None:
        return known
    code = _CODES.get(dtype.kind)
    if code is None or dtype.byteorder == ">" or dtype.hasobject:
        raise DLPackError(
            f"dtype {dtype} cannot be expressed in DLPack, which takes bool, int, uint, "
            "float and complex in native byte order; read the tensor with "
            "`await client.read_array(tensor)` instead"
        )
    known = _DTYPE_CODES[dtype] = (code, dtype.itemsize * 8)
    return known


_DTYPE_CODES: dict[np.dtype[Any], tuple[int, int]] = {}
"""The codes :func:`dtype_code` found (an export asks once per capsule)."""


def _release(address: int) -> None:
    """The deleter: drop what the export kept alive (any thread; never raises)."""
    with _lock:
        _exports.pop(address, None)


_deleter = _DELETER(_release)
_DELETER_ADDRESS = ctypes.cast(_deleter, ctypes.c_void_p).value or 0

_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def _c_api(name: str, restype: Any, *argtypes: Any) -> Any:
    """A private ctypes binding of a C-API function (``ctypes.pythonapi``'s own
    function objects are shared with every library that sets their argtypes)."""
    return ctypes.PYFUNCTYPE(restype, *argtypes)((name, ctypes.pythonapi))


_capsule_new = _c_api("PyCapsule_New", ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p,
                      _DESTRUCTOR)  # fmt: skip
_capsule_is_valid = _c_api("PyCapsule_IsValid", ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)
_capsule_pointer = _c_api("PyCapsule_GetPointer", ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)
_capsule_set_name = _c_api("PyCapsule_SetName", ctypes.c_int, ctypes.py_object, ctypes.c_char_p)


def _on_capsule_freed(capsule: int) -> None:
    """A capsule nobody consumed (its name unchanged) releases its export itself."""
    for name in (_NAME, _NAME_VERSIONED):
        if _capsule_is_valid(capsule, name):
            _release(_capsule_pointer(capsule, name))
            return


_destructor = _DESTRUCTOR(_on_capsule_freed)


_TENSOR_FMT = struct.Struct("=Qiii BBH QQQ")
"""A ``DLTensor``: data, device (type, id), ndim, dtype (code, bits, lanes), the shape
and strides pointers, byte_offset (48 bytes)."""
_VERSIONED_HEAD_FMT = struct.Struct("=II QQQ")
"""What precedes a versioned struct's ``dl_tensor``: version, manager_ctx, deleter, flags."""
_PLAIN_TAIL_FMT = struct.Struct("=QQ")
"""What follows a plain struct's ``dl_tensor``: manager_ctx, deleter."""


def _format(versioned: bool, ndim: int) -> struct.Struct:
    """The bytes of a managed struct with its shape and strides after it (native byte
    order; the fields fall on the offsets of ``dlpack.h``'s structs, checked by the
    tests against the ctypes definitions above)."""
    return _layout(versioned, ndim)[0]


def _layout(versioned: bool, ndim: int) -> tuple[struct.Struct, Any]:
    """:func:`_format`'s struct and the ctypes array type of its size, made once."""
    key = (versioned, ndim)
    layout = _formats.get(key)
    if layout is None:
        tensor = "Qiii BBH QQQ"  # data, device, ndim, dtype, shape, strides, byte_offset
        text = f"II QQQ {tensor}" if versioned else f"{tensor} QQ"
        fmt = struct.Struct(f"={text} {ndim}q {ndim}q")
        layout = _formats[key] = (fmt, ctypes.c_char * fmt.size)
    return layout


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
    until the consumer is done with it. The struct, its shape and its strides are one
    block: made and filled by one compiled call (``_native_dlpack.c``), or (its twin) a
    ctypes buffer filled by one ``struct.pack_into``, kept in a registry."""
    code, bits = dtype_code(dtype)
    if _NATIVE is not None:
        return _NATIVE.make(address, device[0], device[1], shape, strides, code, bits, owner,
                            versioned)  # fmt: skip
    ndim = len(shape)
    fmt, array_type = _layout(versioned, ndim)
    buf = array_type()
    key = _addressof(buf)
    if versioned:
        dims = key + 80
        fmt.pack_into(buf, 0, _MAJOR, _MINOR, 0, _DELETER_ADDRESS, 0, address, device[0], device[1],
                      ndim, code, bits, 1, dims, dims + 8 * ndim, 0, *shape, *strides)  # fmt: skip
        name = _NAME_VERSIONED
    else:
        dims = key + 64
        fmt.pack_into(buf, 0, address, device[0], device[1], ndim, code, bits, 1, dims,
                      dims + 8 * ndim, 0, 0, _DELETER_ADDRESS, *shape, *strides)  # fmt: skip
        name = _NAME
    with _lock:
        _exports[key] = (buf, owner)
    return _capsule_new(key, name, _destructor)


_addressof = ctypes.addressof
_formats: dict[tuple[bool, int], tuple[struct.Struct, Any]] = {}


_USED = b"used_dltensor"
_USED_VERSIONED = b"used_dltensor_versioned"
_READ_ONLY = 1
_IS_COPIED = 2
_DTYPES = {(0, 8): "i1", (0, 16): "i2", (0, 32): "i4", (0, 64): "i8",
           (1, 8): "u1", (1, 16): "u2", (1, 32): "u4", (1, 64): "u8",
           (2, 16): "f2", (2, 32): "f4", (2, 64): "f8",
           (5, 64): "c8", (5, 128): "c16", (6, 8): "?"}  # fmt: skip


_string_at: Any = getattr(ctypes, "_string_at", ctypes.string_at)
"""``ctypes.string_at`` without its Python-level wrapper (a call less per read)."""
_VERSIONED_FMT = struct.Struct("=II QQQ Qiii BBH QQQ")
"""A versioned struct's head and its ``DLTensor`` (80 bytes)."""
_PLAIN_FMT = struct.Struct("=Qiii BBH QQQ QQ")
"""A plain struct: its ``DLTensor``, manager_ctx and deleter (64 bytes)."""
_int_formats: dict[int, struct.Struct] = {}
_dtypes: dict[tuple[int, int, int], np.dtype[Any]] = {}


def _ints_format(count: int) -> struct.Struct:
    """``count`` native int64s, the struct made once per count."""
    fmt = _int_formats.get(count)
    if fmt is None:
        fmt = _int_formats[count] = struct.Struct(f"={count}q")
    return fmt


def _dtype_of(code: int, bits: int, lanes: int) -> np.dtype[Any] | None:
    """The numpy dtype of a DLPack ``(code, bits, lanes)``, None where none matches."""
    key = (code, bits, lanes)
    dtype = _dtypes.get(key)
    if dtype is None:
        name = _DTYPES.get((code, bits)) if lanes == 1 else None
        if name is None:
            return None
        dtype = _dtypes[key] = np.dtype(name)
    return dtype


class Imported:
    """What a consumed capsule described, and the owner of its memory: calls the
    producer's deleter when dropped (so keep it while the memory is in use).

    Attributes:
        address: The first element's address (``data + byte_offset``).
        device: ``(device type, index)``.
        shape: The shape.
        strides: Strides in elements.
        dtype: The numpy dtype.
        read_only: The producer marked the memory read-only (versioned capsules only:
            a legacy, unversioned capsule has no flags, and its producer's contract is
            that the memory may be written, so it is never read-only).
        copied: The producer marked the memory as a copy made for this consumer.
        source: The producer object, kept alive as well.

    Whatever refers to an ``Imported`` (a bound handle, :meth:`array`'s result and
    every view of it) keeps the capsule's memory alive: the deleter runs only once the
    last of them is gone.
    """

    shape: tuple[int, ...]
    strides: tuple[int, ...]

    def __init__(self, capsule: Any, source: Any) -> None:
        self.source = source
        if _NATIVE is not None:
            self._consume_native(capsule)
            return
        versioned = bool(_capsule_is_valid(id(capsule), _NAME_VERSIONED))
        if not versioned and not _capsule_is_valid(id(capsule), _NAME):
            raise DLPackError("__dlpack__ returned no unconsumed DLPack capsule")
        name = _NAME_VERSIONED if versioned else _NAME
        managed = _capsule_pointer(id(capsule), name)
        if versioned:  # the head and the DLTensor after it, read at once
            major, minor, _, deleter, flags, *tensor = _VERSIONED_FMT.unpack(
                _string_at(managed, 80)
            )
            if major != 1:  # the spec: refuse a major version not known
                raise ValueError(f"DLPack version {major}.{minor} is not supported (1.x is)")
        else:
            *tensor, _, deleter = _PLAIN_FMT.unpack(_string_at(managed, 64))
            flags = 0
        ndim, dims = tensor[3], tensor[7]
        if ndim < 0:  # checked before the capsule is consumed, as the compiled reader does
            raise ValueError(f"the DLTensor has ndim {ndim}")
        if ndim > 0 and not dims:
            raise ValueError(f"the DLTensor has ndim {ndim} and no shape")
        self._managed, self._deleter = managed, deleter  # the deleter is ours to call now
        self.read_only = bool(flags & _READ_ONLY)
        self.copied = bool(flags & _IS_COPIED)
        _capsule_set_name(capsule, _USED_VERSIONED if versioned else _USED)
        self._describe(*tensor)

    def _consume_native(self, capsule: Any) -> None:
        """:meth:`__init__` through the compiled reader (``_native_dlpack.c``): one
        call reads the struct and consumes the capsule."""
        assert _NATIVE is not None
        fields = _NATIVE.consume(capsule)
        if fields is None:
            raise DLPackError("__dlpack__ returned no unconsumed DLPack capsule")
        managed, deleter, flags, address, kind, index, code, bits, lanes, shape, strides, _ = fields
        self._managed, self._deleter = managed, deleter
        self.read_only = bool(flags & _READ_ONLY)
        self.copied = bool(flags & _IS_COPIED)
        self.address = address
        self.device = (kind, index)
        self.shape = shape
        self.strides = contiguous_strides(shape) if strides is None else strides
        self.dtype = _dtype_of(code, bits, lanes)
        self.type_code = (code, bits, lanes)

    def _describe(
        self,
        data: int,
        kind: int,
        index: int,
        ndim: int,
        code: int,
        bits: int,
        lanes: int,
        dims: int,
        steps: int,
        offset: int,
    ) -> None:
        """The fields of the consumed ``DLTensor`` (its shape and strides read at once
        where they lie one after the other, as most producers lay them out)."""
        self.address = data + offset
        self.device = (kind, index)
        if ndim < 0:
            raise ValueError(f"the DLTensor has ndim {ndim}")
        if not ndim:
            self.shape = self.strides = ()
        elif steps == dims + 8 * ndim:
            both = _ints_format(2 * ndim).unpack(_string_at(dims, 16 * ndim))
            self.shape, self.strides = both[:ndim], both[ndim:]
        else:
            self.shape = _ints_format(ndim).unpack(_string_at(dims, 8 * ndim))
            if steps:
                self.strides = _ints_format(ndim).unpack(_string_at(steps, 8 * ndim))
            else:
                self.strides = contiguous_strides(self.shape)
        self.dtype = _dtype_of(code, bits, lanes)
        self.type_code = (code, bits, lanes)

    def array(self) -> Any:
        """A numpy array over the memory (kDLCPU), writable, with the producer's shape
        and strides; its base is this object, so the producer's deleter runs only once
        the array and every view of it are gone."""
        assert self.dtype is not None
        itemsize = self.dtype.itemsize
        if 0 in self.shape:  # no element: any address, even NULL, is fine
            return np.empty(self.shape, self.dtype)
        interface = {
            "version": 3,
            "shape": self.shape,
            "typestr": self.dtype.str,
            "descr": self.dtype.descr,
            "strides": tuple(s * itemsize for s in self.strides),
            "data": (self.address, False),
        }
        return np.asarray(_Interface(self, interface))

    def flat(self, nbytes: int) -> Any:
        """A writable ``uint8`` array over the first ``nbytes`` bytes of the memory
        (kDLCPU; C-contiguous memory, so these are all its elements), based on this
        object as :meth:`array`'s is."""
        if not nbytes:
            return np.empty(0, np.uint8)
        interface = {
            "version": 3,
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (self.address, False),
        }
        return np.asarray(_Interface(self, interface))

    def __del__(self) -> None:
        managed, self._managed = getattr(self, "_managed", None), None
        if managed and self._deleter:
            if _NATIVE is not None:
                _NATIVE.call_deleter(self._deleter, managed)
            else:
                _deleter_at(self._deleter)(managed)


def _deleter_at(address: int) -> Any:
    """A callable for the producer's deleter at ``address``, made once per address (a
    producer has one deleter, or a few)."""
    function = _deleters.get(address)
    if function is None:
        if len(_deleters) >= _MAX_DELETERS:
            _deleters.clear()
        function = _deleters[address] = _DELETER(address)
    return function


_deleters: dict[int, Any] = {}
_MAX_DELETERS = 64


class _Interface:
    """The base of :meth:`Imported.array`'s array: numpy keeps it (so the
    :class:`Imported`, so the producer's memory) while the array or a view lives."""

    __slots__ = ("__array_interface__", "imported")

    def __init__(self, imported: Imported, interface: dict[str, Any]) -> None:
        self.imported = imported
        self.__array_interface__ = interface


def take_capsule(obj: Any, stream: int | None, copy: bool | None = None) -> Imported:
    """Ask ``obj`` for a capsule (versioned if it can; ``stream``: the consumer's, for
    the producer to order its work before; ``copy``: passed on when not None) and
    consume it. A producer of DLPack < 1.0 takes neither ``max_version`` nor ``copy``:
    it is asked for its legacy capsule, except for a copy (TypeError then)."""
    try:
        if copy is None:
            capsule = obj.__dlpack__(stream=stream, max_version=DLPACK_VERSION)
        else:
            capsule = obj.__dlpack__(stream=stream, max_version=DLPACK_VERSION, copy=copy)
    except TypeError:  # a producer of DLPack < 1.0 takes no max_version
        if copy is not None:
            raise
        capsule = obj.__dlpack__(stream=stream)
    return Imported(capsule, obj)
