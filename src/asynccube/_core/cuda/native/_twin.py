"""The pure-Python twin of the compiled hot path (``_native.c``), on ``cuda.bindings``.

Same functions, same arguments, same checks and the same exceptions as the C module:
each driver call returns its ``CUresult`` (an int-like), bad arguments raise
:class:`~asynccube._core.errors.InvalidArgument`. :mod:`.hotpath` picks one of the two
once, at import.
"""

from __future__ import annotations

import ctypes
import sys
import threading
from typing import Any, Final

import numpy as np

from ...errors import InvalidArgument
from ..driver import cu
from ._twin_args import _need_driver, _refuse, _u32, _u64, state
from ._twin_fast import FastLaunch
from ._twin_launch import PackState, launch
from ._twin_notify import (
    host_func_entry,
    libc_close_address,
    notify_close,
    notify_drain,
    notify_spin,
)

__all__ = [
    "FastLaunch", "PackState", "address", "bytes_at", "copy_into", "copy_stats", "ctx_set",
    "driver_open",
    "event_query", "event_record", "is_pinned", "launch", "memcpy_async", "memcpy_peer",
    "notify_close", "notify_drain", "notify_spin", "open_driver", "param_sizes",
    "stream_check", "stream_query", "stream_wait_event",
]  # fmt: skip

_BIG: Final = 256 << 10
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
    _state["d"] = d
    global _d
    _d = d


def driver_open() -> bool:
    """True once :func:`open_driver` succeeded."""
    return bool(_state)


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


def stream_query(stream: Any) -> Any:
    """``cuStreamQuery``."""
    try:
        return _d.cuStreamQuery(stream)[0]
    except Exception:
        _refuse([(stream, "stream", 0)])
        raise


def stream_check(stream: Any) -> tuple[int, int, int, int]:
    """``(ctx_err, context, capture_err, status)``: ``cuStreamGetCtx``, then (when that
    succeeded) ``cuStreamIsCapturing``, of ``stream``."""
    try:
        ctx_err, context = _d.cuStreamGetCtx(stream)
    except Exception:
        _refuse([(stream, "stream", 0)])
        raise
    if int(ctx_err):
        return int(ctx_err), 0, 0, 0
    capture_err, status = _d.cuStreamIsCapturing(stream)
    return 0, int(context), int(capture_err), int(status)


def ctx_set(context: Any) -> Any:
    """``cuCtxSetCurrent``."""
    try:
        return _d.cuCtxSetCurrent(context)[0]
    except Exception:
        _refuse([(context, "context", 0)])
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


def memcpy_peer(
    dst: int, dst_context: Any, src: int, src_context: Any, nbytes: int, stream: Any
) -> Any:
    """``cuMemcpyPeerAsync(dst, dst_context, src, src_context, nbytes, stream)`` (the
    compiled module's None, for a driver without it, never comes from cuda.bindings)."""
    try:
        return _d.cuMemcpyPeerAsync(dst, dst_context, src, src_context, nbytes, stream)[0]
    except Exception:
        _refuse([(dst, "destination address", 64), (dst_context, "destination context", 0),
                 (src, "source address", 64), (src_context, "source context", 0),
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
    """Copy ``src`` into the start of ``dst``; the GIL is released from 256 KiB (ctypes),
    and copies of 16 MiB and more are split over up to ``threads`` threads. (The
    compiled module also splits copies of 256 KiB to 16 MiB over its copy helpers; the
    twin has none: those run on the calling thread, see :func:`copy_stats`.)"""
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


def bytes_at(addr: int, nbytes: int, threads: int) -> bytes:
    """A new ``bytes`` holding the ``nbytes`` at ``addr`` (``ctypes.string_at``, which
    holds the GIL: the twin has no copy helpers)."""
    at, n = _u64(addr, "address"), _u64(nbytes, "nbytes")
    _u32(threads, "threads")
    if not at and n:
        raise InvalidArgument("address must not be 0")
    if n > sys.maxsize:
        raise InvalidArgument(f"nbytes too large: {n}")
    return ctypes.string_at(at, n)


def copy_stats() -> tuple[int, int]:
    """``(copies through the copy helpers, pieces they copied)``: always ``(0, 0)`` in
    the twin, which has no copy helpers (a Python thread would need the GIL to start each
    piece, which the busy loop thread holds)."""
    return 0, 0


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
