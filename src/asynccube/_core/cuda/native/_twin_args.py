"""Argument checks shared by the pure-Python twin's modules (:mod:`._twin`,
:mod:`._twin_notify`), as ``_native.c``'s are by the compiled module's parts: the same
messages and the same :class:`~asynccube._core.errors.InvalidArgument`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...errors import InvalidArgument

__all__ = ["_need_driver", "_refuse", "_u32", "_u64", "state"]

state: dict[str, Any] = {}
"""What ``open_driver`` resolved (empty until then): the host-function entry point,
libc's ``close``, the pointer attribute and memory type codes."""


def _need_driver() -> None:
    if not state:
        raise RuntimeError("the CUDA driver is not open (call open_driver())")


def _refuse(checks: Sequence[tuple[object, str, int]]) -> None:
    """After a call failed with an exception: raise what the compiled module raises for
    the same arguments (``InvalidArgument``, or "driver not open"); each check is
    ``(value, what, bits)``, ``bits`` 0 for a handle (None allowed)."""
    for value, what, bits in checks:
        if bits == 0 and value is None:
            continue
        (_u32 if bits == 32 else _u64)(value, what)
    _need_driver()


def _u64(value: object, what: str) -> int:
    if value is None or isinstance(value, float):
        raise InvalidArgument(f"{what} must be an int or a driver handle, got {value!r}")
    try:
        out: int = int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        raise InvalidArgument(f"{what} must be an int or a driver handle, got {value!r}") from None
    if not 0 <= out < 1 << 64:
        raise InvalidArgument(f"{what} must be an int in [0, 2**64), got {value!r}")
    return out


def _u32(value: object, what: str) -> int:
    out = _u64(value, what)
    if out >= 1 << 32:
        raise InvalidArgument(f"{what} must fit in 32 bits, got {value!r}")
    return out
