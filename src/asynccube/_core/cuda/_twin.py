"""The pure-Python twin of the compiled hot path (``_native.c``), on ``cuda.bindings``.

Same functions, same arguments, same checks and the same exceptions as the C module:
each driver call returns its ``CUresult`` (an int-like), bad arguments raise
:class:`~asynccube._core.errors.InvalidArgument`. :mod:`.hotpath` picks one of the two
once, at import.
"""

from __future__ import annotations

import ctypes
import struct
import threading
from collections.abc import Sequence
from typing import Any, Final

import numpy as np

from ..errors import InvalidArgument
from ._twin_args import _need_driver, _refuse, _u32, _u64, state
from ._twin_notify import (
    host_func_entry,
    libc_close_address,
    notify_close,
    notify_drain,
    notify_spin,
)
from .driver import cu

__all__ = [
    "PackState", "address", "copy_into", "driver_open", "event_query", "event_record",
    "is_pinned", "launch", "memcpy_async", "notify_close", "notify_drain", "notify_spin",
    "open_driver", "param_sizes", "stream_wait_event",
]  # fmt: skip

_BIG: Final = 1 << 20
_SPLIT: Final = 16 << 20
_state = state
_d: Any = None
"""``cuda.bindings.driver`` once :func:`open_driver` succeeded."""


def open_driver() -> None:
    """Load the driver (``cuda.bindings``) and resolve what the hot path needs."""
    if _state:
        return
    d = cu()
    (err,) = d.cuInit(0)
    if err:
        raise OSError(f"the CUDA driver does not start: {err!r}")
    version = int(d.cuDriverGetVersion()[1])
    flags = int(d.CUdriverProcAddress_flags.CU_GET_PROC_ADDRESS_DEFAULT)
    res = d.cuGetProcAddress(b"cuLaunchHostFunc", version, flags)
    if res[0]:
        raise OSError(f"cuLaunchHostFunc not found: {res[0]!r}")
    _state["host_func"] = host_func_entry(int(res[1]))
    _state["close"] = libc_close_address()
    _state["attr"] = d.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMORY_TYPE
    _state["host"] = int(d.CUmemorytype.CU_MEMORYTYPE_HOST)
    global _d
    _d = d


def driver_open() -> bool:
    """True once :func:`open_driver` succeeded."""
    return bool(_state)


class PackState:
    """The argument block of one kernel signature (see ``_native_launch.c``'s ``PackState``)."""

    __slots__ = (
        "_ptrs", "_words", "address", "maps", "meta", "n_ptrs", "ptr_offset", "scalars", "view",
    )  # fmt: skip

    def __init__(
        self,
        storage: Any,
        params: Any,
        ptr_offset: int,
        n_ptrs: int,
        scalars: Sequence[tuple[int, int]],
        metadata: tuple[int, int] | None,
        tensor_maps: Sequence[int],
    ) -> None:
        try:
            self.view = memoryview(storage).cast("B")
            raw = memoryview(params).cast("B")
        except TypeError:
            raise InvalidArgument("storage must be a writable buffer and params a buffer") from None
        if self.view.readonly:
            raise InvalidArgument("storage must be a writable buffer and params a buffer")
        self.ptr_offset, self.n_ptrs = int(ptr_offset), int(n_ptrs)
        if self.n_ptrs < 0:
            raise InvalidArgument(f"n_ptrs must be >= 0, got {n_ptrs}")
        self._inside(self.ptr_offset, 8 * self.n_ptrs, "the pointers")
        self._check_params(raw)
        self.address = int(np.frombuffer(raw, np.uint8).ctypes.data)
        self._ptrs = struct.Struct(f"<{self.n_ptrs}Q")
        self.scalars = [self._slot(s, "scalars") for s in scalars]
        self.maps = [self._slot((off, 128), "tensor_maps") for off in tensor_maps]
        self.meta = None if metadata is None else self._slot(metadata, "metadata")
        self._words: Any = None
        if self.meta is not None and self.meta[1] % 4 == 0 and self.meta[0] % 4 == 0:
            off, size = self.meta
            self._words = self.view[off : off + size].cast("I")

    def _inside(self, off: int, n: int, what: str) -> None:
        if off < 0 or n < 0 or off > len(self.view) - n:
            raise InvalidArgument(
                f"{what} at offset {off} ({n} bytes) lies outside the {len(self.view)}-byte "
                "argument storage"
            )

    def _check_params(self, raw: memoryview) -> None:
        if len(raw) < 8 or len(raw) % 8:
            raise InvalidArgument(
                "the parameter array must be a whole number of 8-byte addresses, got "
                f"{len(raw)} bytes"
            )
        lo = int(np.frombuffer(self.view, np.uint8).ctypes.data) if len(self.view) else 0
        for i, p in enumerate(np.frombuffer(raw, np.uint64).tolist()):
            if p and not lo <= p < lo + len(self.view):
                raise InvalidArgument(f"parameter {i} points outside the argument storage")

    def _slot(self, pair: Any, what: str) -> tuple[int, int]:
        try:
            off, size = (int(v) for v in pair)
        except (TypeError, ValueError):
            raise InvalidArgument(f"{what} must hold (offset, size) pairs, got {pair!r}") from None
        self._inside(off, size, f"a {what} slot")
        return off, size

    def put(self, data: Any, slot: tuple[int, int], what: str, exact: bool) -> None:
        """Copy ``data``'s bytes into ``slot``."""
        try:
            src = memoryview(data).cast("B")
        except TypeError:
            raise InvalidArgument(f"{what} must be bytes-like, got {data!r}") from None
        off, cap = slot
        if len(src) > cap or (exact and len(src) != cap):
            raise InvalidArgument(f"{what} has {len(src)} bytes; its parameter slot holds {cap}")
        self.view[off : off + len(src)] = src

    def fill_pointers(self, pointers: Sequence[int]) -> None:
        """Write the buffer pointers."""
        try:
            self._ptrs.pack_into(self.view, self.ptr_offset, *pointers)
        except (struct.error, TypeError):
            if len(pointers) != self.n_ptrs:
                raise InvalidArgument(
                    f"{len(pointers)} buffer pointers given; the signature has {self.n_ptrs}"
                ) from None
            for p in pointers:
                _u64(p, "a buffer pointer")
            raise

    def fill(self, items: Sequence[Any], slots: list[tuple[int, int]], what: str) -> None:
        """Write a group of scalars or tensor maps."""
        if len(items) != len(slots):
            raise InvalidArgument(f"{len(items)} {what} given; the signature has {len(slots)}")
        exact = what == "tensor maps"
        view = self.view
        for item, slot in zip(items, slots, strict=True):
            if type(item) is bytes:  # the usual case, without a memoryview
                off, cap = slot
                n = len(item)
                if n <= cap and (n == cap or not exact):
                    view[off : off + n] = item
                    continue
            self.put(item, slot, what, exact)

    def put_metadata(self, data: Any) -> None:
        """Write the metadata words (a ``uint32`` array of the slot's length)."""
        if self.meta is None:
            raise InvalidArgument("metadata given, but the signature has none")
        words = self._words
        if words is not None and type(data) is np.ndarray and data.dtype == np.uint32:
            try:
                words[:] = data
                return
            except (ValueError, TypeError):
                pass  # the wrong length: put() says so
        self.put(data, self.meta, "metadata", True)


def launch(
    state: PackState,
    function: Any,
    gx: int,
    gy: int,
    gz: int,
    bx: int,
    by: int,
    bz: int,
    shared: int,
    stream: Any,
    pointers: Sequence[int],
    scalars: Sequence[Any] | None,
    metadata: Any,
    tensor_maps: Sequence[bytes] | None,
) -> Any:
    """Fill the argument block and launch; the ``CUresult``."""
    if type(state) is not PackState:
        raise InvalidArgument(f"state must be a PackState, got {state!r}")
    if not function:
        raise InvalidArgument(f"function must be a loaded kernel, got {function!r}")
    state.fill_pointers(pointers)
    if scalars is not None:
        state.fill(scalars, state.scalars, "scalar groups")
    if metadata is not None:
        state.put_metadata(metadata)
    if tensor_maps is not None:
        state.fill(tensor_maps, state.maps, "tensor maps")
    try:
        return _d.cuLaunchKernel(
            function, gx, gy, gz, bx, by, bz, shared, stream, state.address, 0
        )[0]
    except Exception:
        names = ("grid x", "grid y", "grid z", "block x", "block y", "block z")
        dims = [(v, w, 32) for v, w in zip((gx, gy, gz, bx, by, bz), names, strict=True)]
        _refuse([(function, "function", 0), *dims, (shared, "shared memory bytes", 32),
                 (stream, "stream", 0)])  # fmt: skip
        raise


def event_record(event: Any, stream: Any) -> Any:
    """``cuEventRecord``."""
    try:
        return _d.cuEventRecord(event, stream)[0]
    except Exception:
        _refuse([(event, "event", 0), (stream, "stream", 0)])
        raise


def event_query(event: Any) -> Any:
    """``cuEventQuery``."""
    try:
        return _d.cuEventQuery(event)[0]
    except Exception:
        _refuse([(event, "event", 0)])
        raise


def stream_wait_event(stream: Any, event: Any) -> Any:
    """``cuStreamWaitEvent(stream, event, 0)``."""
    try:
        return _d.cuStreamWaitEvent(stream, event, 0)[0]
    except Exception:
        _refuse([(stream, "stream", 0), (event, "event", 0)])
        raise


def memcpy_async(to_device: bool, device: int, host: int, nbytes: int, stream: Any) -> Any:
    """``cuMemcpyHtoDAsync``/``cuMemcpyDtoHAsync`` between ``device`` and ``host``."""
    if not host and nbytes:
        _u64(nbytes, "nbytes")
        raise InvalidArgument("host address must not be 0")
    try:
        if to_device:
            return _d.cuMemcpyHtoDAsync(device, host, nbytes, stream)[0]
        return _d.cuMemcpyDtoHAsync(host, device, nbytes, stream)[0]
    except Exception:
        _refuse([(device, "device address", 64), (host, "host address", 64),
                 (nbytes, "nbytes", 64), (stream, "stream", 0)])  # fmt: skip
        raise


def param_sizes(function: Any) -> tuple[Any, tuple[int, ...] | None] | None:
    """``(CUresult, sizes)`` of the kernel's parameters, or None where the driver cannot
    say (no ``cuFuncGetParamCount``)."""
    if not function:
        raise InvalidArgument(f"function must be a loaded kernel, got {function!r}")
    _u64(function, "function")
    _need_driver()
    d = cu()
    if not hasattr(d, "cuFuncGetParamCount") or not hasattr(d, "cuFuncGetParamInfo"):
        return None
    try:
        err, count = d.cuFuncGetParamCount(function)
    except RuntimeError:  # cuda.bindings has it, the driver (before CUDA 13.1) not
        return None
    if err:
        return err, None
    sizes = []
    for index in range(int(count)):
        res = d.cuFuncGetParamInfo(function, index)
        if res[0]:
            return res[0], None
        sizes.append(int(res[2]))
    return 0, tuple(sizes)


def is_pinned(address: int) -> bool:
    """True for page-locked host memory (``cuPointerGetAttributes``, which does not fail
    on ordinary memory, unlike ``cuPointerGetAttribute``)."""
    _u64(address, "address")
    _need_driver()
    err, values = cu().cuPointerGetAttributes(1, [_state["attr"]], address)
    return not err and int(values[0]) == _state["host"]


def address(data: Any) -> int:
    """The address of a contiguous buffer's first byte."""
    try:
        return int(np.frombuffer(data, np.uint8).ctypes.data)
    except (TypeError, ValueError):
        raise InvalidArgument(f"need a contiguous bytes-like object, got {data!r}") from None


def copy_into(dst: Any, src: Any, threads: int) -> None:
    """Copy ``src`` into the start of ``dst``; the GIL is released from 1 MiB (ctypes),
    and copies of 16 MiB and more are split over up to ``threads`` threads."""
    count = _u32(threads, "threads")
    try:
        out = memoryview(dst).cast("B")
        data = memoryview(src).cast("B")
    except TypeError:
        raise InvalidArgument("dst must be a writable buffer and src bytes-like") from None
    if out.readonly:
        raise InvalidArgument(f"dst must be a writable buffer, got {dst!r}")
    if len(data) > len(out):
        raise InvalidArgument(f"src has {len(data)} bytes, dst only {len(out)}")
    if len(data) < _BIG:
        out[: len(data)] = data
        return
    _parallel(address(out), address(data), len(data), count if len(data) >= _SPLIT else 1)


def _parallel(dst: int, src: int, n: int, threads: int) -> None:
    threads = max(1, min(threads, 16))
    step = -(-(n // threads) // 4096) * 4096
    spans = [(at, min(step, n - at)) for at in range(0, n, step)] if step else [(0, n)]
    workers = [
        threading.Thread(target=ctypes.memmove, args=(dst + at, src + at, k)) for at, k in spans[1:]
    ]
    for w in workers:
        w.start()
    at, k = spans[0]
    ctypes.memmove(dst + at, src + at, k)
    for w in workers:
        w.join()
