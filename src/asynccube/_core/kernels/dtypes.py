"""The dtypes a kernel written once supports, their C types, and Python scalars.

A value's *type* is a numpy dtype (an array, a numpy scalar, the result of an
operation) or, for a Python ``int`` or ``float`` bound as a scalar or written as a
literal, the class itself: a *weak* scalar, as numpy 2 (NEP 50) treats it: it takes the
dtype of the arrays it meets (``2.0 * float32`` stays float32).
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np

from ..errors import InvalidArgument
from ..values.bindings import NUMERIC_DTYPES

__all__ = [
    "SUPPORTED",
    "Ty",
    "c_storage",
    "c_value",
    "param_dtype",
    "strong",
    "ty_name",
    "type_of_scalar",
]

Ty = np.dtype[Any] | type
"""A value's type: a dtype, or ``int``/``float`` for a weak Python scalar."""

SUPPORTED: Final[tuple[np.dtype[Any], ...]] = tuple(np.dtype(t) for t in ("bool", *NUMERIC_DTYPES))
"""Every dtype an array, a scalar or a result of a kernel written once may have."""

_VALUE: Final = {
    "b": "bool",
    "i1": "signed char",
    "i2": "short",
    "i4": "int",
    "i8": "long long",
    "u1": "unsigned char",
    "u2": "unsigned short",
    "u4": "unsigned int",
    "u8": "unsigned long long",
    "f2": "float",  # a float16 value is held in a float, rounded after each operation
    "f4": "float",
    "f8": "double",
}


def _code(dt: np.dtype[Any]) -> str:
    return "b" if dt.kind == "b" else f"{dt.kind}{dt.itemsize}"


def c_value(dt: np.dtype[Any]) -> str:
    """The C type a value of ``dt`` is computed in (float16: ``float``)."""
    return _VALUE[_code(dt)]


def c_storage(dt: np.dtype[Any]) -> str:
    """The C type of an element in memory (float16: its bits, ``unsigned short``)."""
    return "unsigned short" if dt == np.float16 else c_value(dt)


def strong(ty: Ty) -> np.dtype[Any]:
    """The dtype of ``ty``: a weak ``float`` is float64, a weak ``int`` int64."""
    if isinstance(ty, np.dtype):
        return ty
    return np.dtype(np.float64 if ty is float else np.int64)


def param_dtype(ty: Ty) -> np.dtype[Any]:
    """The dtype a scalar of type ``ty`` is passed as (``bool``: uint8, as the kernel ABI
    has no bool scalars)."""
    dt = strong(ty)
    return np.dtype(np.uint8) if dt == np.bool_ else dt


def ty_name(ty: Ty) -> str:
    """How an error message names ``ty``."""
    if isinstance(ty, np.dtype):
        return str(ty)
    return f"Python {ty.__name__}"


def type_of_scalar(name: str, value: object) -> Ty:
    """The type of a scalar argument: a Python int/float is weak, a bool or a numpy
    scalar has its dtype; anything else is refused naming the argument."""
    if isinstance(value, bool | np.bool_):
        return np.dtype(np.bool_)
    if isinstance(value, np.generic):
        if value.dtype in SUPPORTED:
            return value.dtype
        raise InvalidArgument(
            f"scalar argument {name!r} has dtype {value.dtype}, which kernels written "
            f"once do not support (supported: {', '.join(map(str, SUPPORTED))})"
        )
    if isinstance(value, int):
        return int
    if isinstance(value, float):
        return float
    raise InvalidArgument(
        f"argument {name!r} is a {type(value).__name__}: pass a Tensor (an array "
        "argument) or a Python/numpy number (a scalar argument)"
    )
