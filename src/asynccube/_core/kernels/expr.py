"""An expression of a kernel written once, parsed with :mod:`ast` into a small tree.

``"y = a * x + b"`` (one or more assignments, separated by ``;`` or new lines) for an
elementwise kernel, or a bare expression (``"x * x"``) for a reduction's map. The tree
has three kinds of node: :class:`Arg` (a named argument, or an output assigned by an
earlier statement), :class:`Const` (a literal) and :class:`Call` (an operator, a
function, ``where`` or a cast, by its key in :mod:`.ops`). Anything else is refused with
a :class:`~asynccube.KernelDefinitionError` naming it.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Final

from ..errors import KernelDefinitionError
from .ops import BINARY, BOOL_OPS, COMPARE, FUNCTIONS, UNARY

__all__ = ["Arg", "Call", "Const", "Node", "Program", "parse_expression", "parse_program"]


@dataclass(frozen=True, slots=True)
class Arg:
    """A named value: an argument, or (``local``) an output an earlier statement set."""

    name: str
    local: bool = False


@dataclass(frozen=True, slots=True)
class Const:
    """A literal: ``bool`` (a numpy bool), ``int`` or ``float`` (weak, as in numpy)."""

    value: bool | int | float


@dataclass(frozen=True, slots=True)
class Call:
    """An operation: ``op`` is its key in :data:`.ops.OPS` (``"add"``, ``"exp"``,
    ``"where"``, ``"cast:float32"``...)."""

    op: str
    args: tuple[Node, ...]


Node = Arg | Const | Call


@dataclass(frozen=True, slots=True)
class Program:
    """Parsed statements: ``(target, value)`` pairs, the argument names read (in order
    of first use) and the outputs (in order of assignment)."""

    text: str
    statements: tuple[tuple[str, Node], ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


_RESERVED: Final = frozenset({"where", "True", "False", "None"})


def parse_program(text: str) -> Program:
    """Parse ``"y = expr; z = expr"`` (KernelDefinitionError naming what is wrong)."""
    tree = _parse(text, "exec")
    assert isinstance(tree, ast.Module)
    if not tree.body:
        raise KernelDefinitionError(f"{text!r} has no statement: write e.g. 'y = a * x + b'")
    reader = _Reader(text)
    statements = [reader.statement(node) for node in tree.body]
    outputs = tuple(target for target, _ in statements)
    return Program(text, tuple(statements), tuple(reader.inputs), outputs)


def parse_expression(text: str) -> tuple[Node, tuple[str, ...]]:
    """Parse a bare expression: the tree and the argument names it reads."""
    tree = _parse(text, "eval")
    assert isinstance(tree, ast.Expression)
    reader = _Reader(text)
    return reader.node(tree.body), tuple(reader.inputs)


def _parse(text: str, mode: str) -> ast.AST:
    if not isinstance(text, str):
        raise KernelDefinitionError(f"an expression must be a str, got {type(text).__name__}")
    try:
        return ast.parse(text.strip(), mode=mode)
    except SyntaxError as error:
        raise KernelDefinitionError(
            f"{text!r} is not a valid expression: {error.msg} (column {error.offset})"
        ) from None


class _Reader:
    """Turns :mod:`ast` nodes into the tree, recording the names read and assigned."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.inputs: list[str] = []
        self.assigned: list[str] = []

    def fail(self, node: ast.AST, what: str) -> KernelDefinitionError:
        part = ast.get_source_segment(self.text.strip(), node) or ast.dump(node)
        return KernelDefinitionError(f"in {self.text!r}: {what} ({part!r})")

    def statement(self, node: ast.stmt) -> tuple[str, Node]:
        if not isinstance(node, ast.Assign | ast.AugAssign):
            raise self.fail(node, "only assignments 'name = expression' may appear")
        if isinstance(node, ast.AugAssign):  # y += x  ->  y = y + x
            target = self.target(node.target)
            value: Node = Call(
                self.binary_op(node, node.op), (self.name(target), self.node(node.value))
            )
        else:
            if len(node.targets) != 1:
                raise self.fail(node, "assign one name per statement")
            target = self.target(node.targets[0])
            value = self.node(node.value)
        if target in self.assigned:
            raise self.fail(node, f"{target!r} is assigned twice")
        self.assigned.append(target)
        return target, value

    def target(self, node: ast.expr) -> str:
        if not isinstance(node, ast.Name):
            raise self.fail(node, "the target of an assignment must be a plain name")
        return self.checked_name(node, node.id)

    def checked_name(self, node: ast.AST, name: str) -> str:
        if name in _RESERVED or name in FUNCTIONS:
            raise self.fail(node, f"{name!r} is a function name, not an argument")
        return name

    def name(self, name: str) -> Arg:
        if name in self.assigned:
            return Arg(name, local=True)
        if name not in self.inputs:
            self.inputs.append(name)
        return Arg(name)

    def node(self, node: ast.expr) -> Node:
        method = getattr(self, f"n_{type(node).__name__.lower()}", None)
        if method is None:
            raise self.fail(node, f"{type(node).__name__} expressions are not supported")
        result: Node = method(node)
        return result

    def n_name(self, node: ast.Name) -> Node:
        if node.id in ("True", "False"):
            return Const(node.id == "True")
        return self.name(self.checked_name(node, node.id))

    def n_constant(self, node: ast.Constant) -> Node:
        if isinstance(node.value, bool | int | float):
            return Const(node.value)
        raise self.fail(node, f"a {type(node.value).__name__} literal is not a number")

    def binary_op(self, node: ast.AST, op: ast.operator) -> str:
        key = BINARY.get(type(op).__name__)
        if key is None:
            raise self.fail(node, f"the operator {type(op).__name__} is not supported")
        return key

    def n_binop(self, node: ast.BinOp) -> Node:
        key = self.binary_op(node, node.op)
        return Call(key, (self.node(node.left), self.node(node.right)))

    def n_unaryop(self, node: ast.UnaryOp) -> Node:
        key = UNARY.get(type(node.op).__name__)
        if key is None:  # pragma: no cover - every unary operator has a key
            raise self.fail(node, f"the operator {type(node.op).__name__} is not supported")
        return Call(key, (self.node(node.operand),))

    def n_boolop(self, node: ast.BoolOp) -> Node:
        key = BOOL_OPS[type(node.op).__name__]
        values = [self.node(v) for v in node.values]
        out = values[0]
        for value in values[1:]:
            out = Call(key, (out, value))
        return out

    def n_compare(self, node: ast.Compare) -> Node:
        left = self.node(node.left)
        parts: list[Node] = []
        for op, right_node in zip(node.ops, node.comparators, strict=True):
            key = COMPARE.get(type(op).__name__)
            if key is None:
                raise self.fail(node, f"the comparison {type(op).__name__} is not supported")
            right = self.node(right_node)
            parts.append(Call(key, (left, right)))
            left = right
        out = parts[0]
        for part in parts[1:]:
            out = Call("logical_and", (out, part))
        return out

    def n_ifexp(self, node: ast.IfExp) -> Node:
        return Call("where", (self.node(node.test), self.node(node.body), self.node(node.orelse)))

    def n_call(self, node: ast.Call) -> Node:
        if not isinstance(node.func, ast.Name):
            raise self.fail(node, "call a function by its plain name, e.g. exp(x)")
        spec = FUNCTIONS.get(node.func.id)
        if spec is None:
            known = ", ".join(sorted(FUNCTIONS))
            raise self.fail(node, f"unknown function {node.func.id!r} (known: {known})")
        key, arity = spec
        if node.keywords or len(node.args) != arity:
            raise self.fail(node, f"{node.func.id} takes {arity} positional argument(s)")
        return Call(key, tuple(self.node(a) for a in node.args))
