"""Typing a kernel's tree for the dtypes bound at a call, by numpy's own rules.

Each operation takes the loop numpy would pick for it (``ufunc.resolve_dtypes``, which
treats Python ``int``/``float`` as weak, NEP 50): so a kernel computes what the same
numpy expression computes, in the same dtypes. Operations between weak scalars only
stay weak, as Python computes them (``a * b * x`` with Python floats ``a``, ``b`` and a
float32 ``x`` is float32). A mix numpy has no loop for is a KernelDefinitionError.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from ..errors import KernelDefinitionError
from .dtypes import SUPPORTED, Ty, strong, ty_name
from .expr import Arg, Call, Const, Node
from .ops import ufunc

__all__ = ["Typed", "TypeContext", "type_node"]

_WEAK_OPS: Final = frozenset(
    {
        "add",
        "subtract",
        "multiply",
        "divide",
        "floor_divide",
        "remainder",
        "power",
        "negative",
        "positive",
        "bitwise_and",
        "bitwise_or",
        "bitwise_xor",
        "invert",
    }
)
"""Operators that Python computes itself between Python scalars (the result stays weak)."""


@dataclass(frozen=True, slots=True)
class Typed:
    """A node with its type: ``loop`` is the dtypes the operation's operands are
    converted to (empty for a leaf or a cast); ``array`` is true where the value
    varies per element (it depends on an array)."""

    node: Node
    ty: Ty
    args: tuple[Typed, ...] = ()
    loop: tuple[np.dtype[Any], ...] = ()
    array: bool = False

    @property
    def dtype(self) -> np.dtype[Any]:
        """The node's dtype (a weak scalar's: float64 or int64)."""
        return strong(self.ty)


@dataclass(slots=True)
class TypeContext:
    """What typing sees: the type of each name, which names are arrays, and (filled
    in) each weak ``int`` argument's dtypes it is converted to, for the call's range
    check."""

    text: str
    types: Mapping[str, Ty]
    arrays: frozenset[str]
    int_targets: dict[str, set[np.dtype[Any]]] = field(default_factory=dict)

    def fail(self, what: str) -> KernelDefinitionError:
        return KernelDefinitionError(f"in {self.text!r}: {what}")


def type_node(node: Node, ctx: TypeContext) -> Typed:
    """``node`` typed in ``ctx`` (KernelDefinitionError for a mix numpy cannot type)."""
    if isinstance(node, Arg):
        return Typed(node, ctx.types[node.name], array=node.name in ctx.arrays)
    if isinstance(node, Const):
        ty: Ty = np.dtype(np.bool_) if isinstance(node.value, bool) else type(node.value)
        return Typed(node, ty)
    args = tuple(type_node(a, ctx) for a in node.args)
    if node.op.startswith("cast:"):
        return Typed(node, np.dtype(node.op[5:]), args, (), args[0].array)
    if node.op == "where":
        return _where(node, args, ctx)
    return _ufunc(node, args, ctx)


def _where(node: Call, args: tuple[Typed, ...], ctx: TypeContext) -> Typed:
    _, a, b = args
    ty: Ty
    if not isinstance(a.ty, np.dtype) and not isinstance(b.ty, np.dtype):
        ty = float if float in (a.ty, b.ty) else int
    else:
        ty = np.result_type(_rep(a.ty), _rep(b.ty))
    _check_supported(ty, "where", args, ctx)
    out = strong(ty)
    _note_ints(args[1:], (out, out), ctx)
    return Typed(node, ty, args, (np.dtype(np.bool_), out, out), any(t.array for t in args))


def _rep(ty: Ty) -> Any:
    """What stands for ``ty`` in ``np.result_type`` (a Python value stays weak)."""
    return ty if isinstance(ty, np.dtype) else ty(0)


def _ufunc(node: Call, args: tuple[Typed, ...], ctx: TypeContext) -> Typed:
    fn = ufunc(node.op)
    try:
        resolved = fn.resolve_dtypes((*(a.ty for a in args), *(None,) * fn.nout))
    except (TypeError, ValueError) as error:
        types = ", ".join(ty_name(a.ty) for a in args)
        raise ctx.fail(
            f"numpy defines no {node.op} for ({types}): {error}; cast an operand, e.g. float32(x)"
        ) from None
    loop, out = tuple(resolved[: fn.nin]), resolved[fn.nin]
    ty: Ty = out
    if node.op in _WEAK_OPS and not any(isinstance(a.ty, np.dtype) for a in args):
        ty = float if out.kind == "f" else int
    _check_supported(ty, node.op, args, ctx)
    _note_ints(args, loop, ctx)
    return Typed(node, ty, args, loop, any(a.array for a in args))


def _check_supported(ty: Ty, op: str, args: tuple[Typed, ...], ctx: TypeContext) -> None:
    if isinstance(ty, np.dtype) and ty not in SUPPORTED:
        types = ", ".join(ty_name(a.ty) for a in args)
        raise ctx.fail(f"{op} of ({types}) is {ty}, which kernels do not support")


def _note_ints(args: tuple[Typed, ...], loop: tuple[np.dtype[Any], ...], ctx: TypeContext) -> None:
    """A weak int meeting a narrower integer dtype must fit it (numpy refuses it
    otherwise): a literal is checked now, an argument at each call."""
    for arg, dt in zip(args, loop, strict=True):
        if arg.ty is not int or dt.kind not in "iu" or (dt.itemsize == 8 and dt.kind == "i"):
            continue
        node = arg.node
        if isinstance(node, Const):
            check_int_range(f"the literal {node.value}", int(node.value), dt, ctx.text)
        elif isinstance(node, Arg):
            ctx.int_targets.setdefault(node.name, set()).add(dt)


def check_int_range(what: str, value: int, dt: np.dtype[Any], text: str) -> None:
    """KernelDefinitionError unless ``value`` fits the integer dtype ``dt``."""
    info = np.iinfo(dt)
    if not info.min <= value <= info.max:
        raise KernelDefinitionError(
            f"in {text!r}: {what} is out of bounds for {dt} ({info.min}..{info.max}), "
            "which it meets there (numpy refuses it too)"
        )
