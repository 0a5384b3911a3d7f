"""Completion pipes of the pure-Python twin (the compiled module's ``_native_notify.c``):
libc's ``close`` as a driver host function, called through its C entry point."""

from __future__ import annotations

import ctypes
from typing import Any

from ...errors import InvalidArgument
from ._twin_args import _need_driver, _u32, _u64, state

__all__ = ["host_func_entry", "libc_close_address", "notify_close", "notify_drain", "notify_spin"]

host_func_entry = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)


def libc_close_address() -> int:
    try:  # the process's own namespace holds libc (no ldconfig subprocess)
        libc = ctypes.CDLL(None)
    except OSError:
        libc = ctypes.CDLL("libc.so.6")
    address = ctypes.cast(libc.close, ctypes.c_void_p).value
    if not address:
        raise OSError("libc close() not found")
    return address


def notify_close(stream: Any, fd: int) -> int:
    """Make the driver's thread close ``fd`` once ``stream`` gets there: libc's
    ``close`` as a host function, called through the C entry point (no Python, no GIL)."""
    if stream is not None:
        _u64(stream, "stream")
    if _u32(fd, "fd") > 2**31 - 1:
        raise InvalidArgument(f"fd out of range: {fd}")
    _need_driver()
    return int(state["host_func"](int(stream), state["close"], fd))


def notify_spin(stream: Any, fd: int, spin_ns: int) -> int:
    """As :func:`notify_close` (the compiled module closes ``fd`` from a spinning C thread
    within ``spin_ns``, then from a host function; Python cannot spin off the GIL, so the
    twin leaves it all to the host function: the same result, later)."""
    _u64(spin_ns, "spin_ns")
    return notify_close(stream, fd)


def notify_drain(timeout: float) -> bool:
    """True: the twin has no spinning thread holding events (see ``_native_notify.c``)."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise InvalidArgument(f"timeout must be a number of seconds, got {timeout!r}")
    if not timeout >= 0:
        raise InvalidArgument(f"timeout must be >= 0, got {timeout!r}")
    return True
