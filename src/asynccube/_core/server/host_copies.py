"""Large host copies that leave the event loop free: what the host server borrows
instead of copying on the loop, and the copies its workers make with the GIL released.

A copy made on the loop thread stalls every task; so does one made on a worker thread
that holds the GIL (``ndarray.tobytes``, ``bytes(memoryview)``: a memcpy under the GIL,
about 0.65 ms per MiB into fresh memory). The host server therefore

* *borrows* data of :data:`BORROW_BYTES` or more handed to ``create``/``write``
  (:func:`borrow`): it keeps a reference and its worker copies from it in stream order,
  like a staging buffer (the README's lifetime rules say what the caller may do
  meanwhile);
* copies with numpy (``np.copyto`` and assignments release the GIL for plain dtypes);
* builds the ``bytes`` a read returns the way C code does (:func:`new_bytes`: an
  uninitialised ``bytes`` object filled before anyone else sees it), so the fill is a
  numpy copy with the GIL released rather than ``tobytes`` holding it. Large results ask
  the kernel for huge pages, as numpy does for its own arrays: faulting in and freeing
  1 GiB of 4 KiB pages takes seconds and tens of milliseconds (on the loop, when the
  caller drops it).
"""

from __future__ import annotations

import ctypes
import mmap
from typing import Any, Final

import numpy as np
import numpy.typing as npt

__all__ = ["BORROW_BYTES", "borrow", "dense", "new_bytes", "source_nbytes"]

BORROW_BYTES: Final = 1 << 20
"""Data of at least this many bytes is borrowed, not copied on the loop (a copy of less
takes well under a millisecond, even into fresh memory)."""
_HUGE: Final = 4 << 20
"""Results of at least this many bytes ask for transparent huge pages (numpy's limit)."""
_HUGE_PAGE: Final = 2 << 20

View = npt.NDArray[np.uint8]


def borrow(data: Any) -> npt.NDArray[Any] | None:
    """``data`` itself (as an array over its memory) when the server should copy it in
    stream order instead of snapshotting it now: a buffer of :data:`BORROW_BYTES` or
    more that is not ``bytes`` (those are immutable: taken by reference anyway). None
    for anything else (small data, object arrays, objects numpy cannot view without a
    copy), which the client snapshots as before."""
    if isinstance(data, bytes):
        return None
    if isinstance(data, np.ndarray):
        if data.dtype.hasobject or data.nbytes < BORROW_BYTES:
            return None
        return data.view(np.ndarray) if type(data) is not np.ndarray else data
    try:
        view = memoryview(data)
    except TypeError:
        return None
    if view.nbytes < BORROW_BYTES or not view.c_contiguous:
        return None
    return np.frombuffer(view.cast("B"), dtype=np.uint8)


def source_nbytes(data: Any) -> int:
    """The byte count of a write's data (bytes-like or a borrowed array)."""
    if isinstance(data, np.ndarray):
        return int(data.nbytes)
    return memoryview(data).nbytes


def dense(data: Any) -> View:
    """A write's data as dense bytes (worker side: a strided borrowed array is packed
    here, off the loop, by numpy with the GIL released)."""
    if isinstance(data, np.ndarray):
        flat = np.ascontiguousarray(data).reshape(-1)
        return flat.view(np.uint8)
    return np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)


def _c_api() -> tuple[Any, Any] | None:
    try:
        api = ctypes.pythonapi
        make = api.PyBytes_FromStringAndSize
        start = api.PyBytes_AsString
    except (AttributeError, OSError):  # not CPython: tobytes below
        return None
    make.restype, make.argtypes = ctypes.py_object, (ctypes.c_void_p, ctypes.c_ssize_t)
    start.restype, start.argtypes = ctypes.c_void_p, (ctypes.py_object,)
    return make, start


_API: Final = _c_api()


def new_bytes(nbytes: int) -> tuple[bytes, View]:
    """A new ``bytes`` of ``nbytes`` and a writable uint8 view of its contents, to be
    filled before the ``bytes`` is handed to anyone (the C API's
    ``PyBytes_FromStringAndSize(NULL, n)`` pattern: the object is not shared, and not
    hashed, until then). Worker threads only; the view must not outlive the fill."""
    if _API is None or nbytes == 0:
        raw = bytearray(nbytes)
        return bytes(raw), np.frombuffer(raw, dtype=np.uint8)
    make, start = _API
    out: bytes = make(None, nbytes)
    address = int(start(out))
    if nbytes >= _HUGE:
        _advise_huge(address, nbytes)
    memory: Any = (ctypes.c_ubyte * nbytes).from_address(address)
    return out, np.frombuffer(memory, dtype=np.uint8)


def _advise_huge(address: int, nbytes: int) -> None:
    """Ask for transparent huge pages over the whole 2 MiB pages of the range (a hint:
    ignored where the kernel has none)."""
    first = -(-address // _HUGE_PAGE) * _HUGE_PAGE
    last = (address + nbytes) // _HUGE_PAGE * _HUGE_PAGE
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if last <= first or advice is None or _MADVISE is None:
        return
    _MADVISE(first, last - first, advice)


def _madvise() -> Any:
    try:
        fn = ctypes.CDLL(None).madvise
    except (AttributeError, OSError):
        return None
    fn.restype, fn.argtypes = ctypes.c_int, (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    return fn


_MADVISE: Final = _madvise()
