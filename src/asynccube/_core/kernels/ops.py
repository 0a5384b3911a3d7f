"""The operators and functions of a kernel written once: how Python syntax names them,
the numpy ufunc that types them (and runs them on the host), and their CUDA C.

Each operation has a key, the name of its numpy ufunc (``"add"``, ``"exp"``), except
``"where"`` and the casts (``"cast:float32"``). :func:`c_expr` writes an operation's C
for the dtype numpy's loop computes it in, its operands already converted to it.
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np

from .dtypes import SUPPORTED

__all__ = [
    "BINARY",
    "BOOL_OPS",
    "CASTS",
    "COMPARE",
    "FUNCTIONS",
    "UNARY",
    "c_expr",
    "ufunc",
]

BINARY: Final = {
    "Add": "add",
    "Sub": "subtract",
    "Mult": "multiply",
    "Div": "divide",
    "FloorDiv": "floor_divide",
    "Mod": "remainder",
    "Pow": "power",
    "BitAnd": "bitwise_and",
    "BitOr": "bitwise_or",
    "BitXor": "bitwise_xor",
}
UNARY: Final = {"USub": "negative", "UAdd": "positive", "Invert": "invert", "Not": "logical_not"}
BOOL_OPS: Final = {"And": "logical_and", "Or": "logical_or"}
COMPARE: Final = {
    "Lt": "less",
    "LtE": "less_equal",
    "Gt": "greater",
    "GtE": "greater_equal",
    "Eq": "equal",
    "NotEq": "not_equal",
}

_FLOAT_UNARY: Final = {
    "exp": "exp",
    "exp2": "exp2",
    "expm1": "expm1",
    "log": "log",
    "log2": "log2",
    "log10": "log10",
    "log1p": "log1p",
    "sqrt": "sqrt",
    "cbrt": "cbrt",
    "sin": "sin",
    "cos": "cos",
    "tan": "tan",
    "arcsin": "asin",
    "arccos": "acos",
    "arctan": "atan",
    "sinh": "sinh",
    "cosh": "cosh",
    "tanh": "tanh",
    "arcsinh": "asinh",
    "arccosh": "acosh",
    "arctanh": "atanh",
    "floor": "floor",
    "ceil": "ceil",
    "trunc": "trunc",
    "rint": "rint",
    "absolute": "fabs",
}
_FLOAT_BINARY: Final = {
    "arctan2": "atan2",
    "hypot": "hypot",
    "fmin": "fmin",
    "fmax": "fmax",
    "copysign": "copysign",
}
_ALIASES: Final = {
    "abs": "absolute",
    "pow": "power",
    "asin": "arcsin",
    "acos": "arccos",
    "atan": "arctan",
    "atan2": "arctan2",
    "asinh": "arcsinh",
    "acosh": "arccosh",
    "atanh": "arctanh",
}
CASTS: Final = tuple(dt.name for dt in SUPPORTED)
"""The casts an expression may call: one per supported dtype, by its numpy name."""

FUNCTIONS: Final[dict[str, tuple[str, int]]] = {
    **{name: (name, 1) for name in _FLOAT_UNARY},
    **{name: (name, 1) for name in ("sign", "square", "isnan", "isinf", "isfinite")},
    **{name: (name, 2) for name in _FLOAT_BINARY},
    **{name: (name, 2) for name in ("minimum", "maximum", "power", "fmod")},
    **{name: (name, 1) for name in ("logical_not",)},
    **{name: (name, 2) for name in ("logical_and", "logical_or", "logical_xor")},
    **{alias: (key, 2 if key in ("power", "arctan2") else 1) for alias, key in _ALIASES.items()},
    **{name: (f"cast:{name}", 1) for name in CASTS},
    "where": ("where", 3),
}
"""Function name -> (operation key, number of arguments)."""

_INFIX: Final = {
    "add": "+",
    "subtract": "-",
    "multiply": "*",
    "divide": "/",
    "bitwise_and": "&",
    "bitwise_or": "|",
    "bitwise_xor": "^",
    "less": "<",
    "less_equal": "<=",
    "greater": ">",
    "greater_equal": ">=",
    "equal": "==",
    "not_equal": "!=",
    "logical_and": "&&",
    "logical_or": "||",
    "logical_xor": "!=",
}


def ufunc(key: str) -> np.ufunc:
    """The numpy ufunc of an operation key (not ``where`` or a cast)."""
    fn: np.ufunc = getattr(np, key)
    return fn


def _float_fn(name: str, dt: np.dtype[Any]) -> str:
    return name + ("f" if dt.itemsize <= 4 else "")


def _signed(dt: np.dtype[Any]) -> bool:
    return dt.kind == "i"


def c_expr(key: str, dt: np.dtype[Any], args: list[str]) -> str:
    """The C of operation ``key`` computed in ``dt`` (its loop's input dtype)."""
    if key in _INFIX:
        if key.startswith("logical_"):
            args = [f"({a} != 0)" for a in args]
        return f"({args[0]} {_INFIX[key]} {args[1]})"
    if dt.kind == "f":
        return _float_op(key, dt, args)
    return _int_op(key, dt, args)


def _float_op(key: str, dt: np.dtype[Any], args: list[str]) -> str:
    joined = ", ".join(args)
    if key in _FLOAT_UNARY:
        return f"{_float_fn(_FLOAT_UNARY[key], dt)}({joined})"
    if key in _FLOAT_BINARY:
        return f"{_float_fn(_FLOAT_BINARY[key], dt)}({joined})"
    special = {
        "power": f"{_float_fn('pow', dt)}({joined})",
        "fmod": f"{_float_fn('fmod', dt)}({joined})",
        "floor_divide": f"ac_floordiv({joined})",
        "remainder": f"ac_mod({joined})",
        "isnan": f"isnan({joined})",
        "isinf": f"isinf({joined})",
        "isfinite": f"isfinite({joined})",
        "sign": f"ac_sign({joined})",
    }
    return special.get(key) or _common(key, args)


def _int_op(key: str, dt: np.dtype[Any], args: list[str]) -> str:
    joined = ", ".join(args)
    a = args[0]
    kind = "s" if _signed(dt) else "u"
    special = {
        "power": f"ac_ipow({joined})",
        "floor_divide": f"ac_floordiv_{kind}({joined})",
        "remainder": f"ac_mod_{kind}({joined})",
        "fmod": f"ac_fmod_{kind}({joined})",
        "absolute": f"({a} < 0 ? -{a} : {a})" if _signed(dt) else a,
        "sign": f"(({a} > 0) - ({a} < 0))",
        "isnan": "false",
        "isinf": "false",
        "isfinite": "true",
        "invert": f"(!{a})" if dt.kind == "b" else f"(~{a})",
        "fmin": f"ac_min({joined})",
        "fmax": f"ac_max({joined})",
    }
    if key in ("floor", "ceil", "trunc"):
        return a
    return special.get(key) or _common(key, args)


def _common(key: str, args: list[str]) -> str:
    a = args[0]
    table = {
        "negative": f"(-{a})",
        "positive": f"(+{a})",
        "square": f"({a} * {a})",
        "logical_not": f"(!{a})",
        "minimum": f"ac_min({', '.join(args)})",
        "maximum": f"ac_max({', '.join(args)})",
    }
    if key not in table:  # pragma: no cover - numpy has no loop the table lacks
        raise KeyError(f"no C for {key!r}")
    return table[key]
