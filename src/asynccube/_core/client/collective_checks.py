"""The argument checks every collective makes at the call, before anything is queued:
the ``(client, handle, ...)`` entries, one client per entry and per CUDA device, the
handles' owners, the sizes, the dtype and the reduction. Each failure is an
:class:`~asynccube.InvalidArgument` (or :class:`~asynccube.InvalidHandle`) naming the
collective, the entry and the fix."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any, Final

import numpy as np

from ..errors import InvalidArgument, InvalidHandle
from ..values.bindings import NUMERIC_DTYPES
from ..values.types import Binding, Handle
from .client import ComputeClient

__all__ = [
    "DTYPES",
    "ReduceOp",
    "apart",
    "check_count",
    "check_kind",
    "check_op",
    "entries",
    "one_size",
]

DTYPES: Final = NUMERIC_DTYPES
"""The element types ``all_reduce`` and ``reduce_scatter`` take (numpy names)."""


class ReduceOp(enum.StrEnum):
    """The reductions of :func:`all_reduce` and :func:`reduce_scatter` (plain strings
    work too: ``"sum"``)."""

    SUM = "sum"
    PROD = "prod"
    MIN = "min"
    MAX = "max"


_SHAPES: Final = {2: ("pairs", "(client, handle)"), 3: ("triples", "(client, input, output)")}


def entries(name: str, items: object, width: int) -> list[tuple[Any, ...]]:
    """``items`` checked: a non-empty list of ``width``-tuples (client, handles...), each
    handle a :class:`Binding` now; one client at most once, each handle its client's,
    CUDA clients of distinct devices; every client open and on this loop."""
    label, shape = _SHAPES[width]
    if not isinstance(items, (list, tuple)) or not items:
        raise InvalidArgument(
            f"{name} needs a non-empty list of {shape} {label}, got {items!r:.80}"
        )
    checked = [_entry(name, label, shape, i, item, width) for i, item in enumerate(items)]
    for entry in checked:
        entry[0]._channel.check()  # closed, another loop, a capture: raises now
    _distinct(name, label, checked)
    return checked


def _entry(name: str, label: str, shape: str, i: int, item: object, width: int) -> tuple[Any, ...]:
    if not isinstance(item, (tuple, list)) or len(item) != width:
        raise InvalidArgument(f"{name}'s {label}[{i}] must be {shape}, got {item!r:.80}")
    client = item[0]
    if not isinstance(client, ComputeClient):
        raise InvalidArgument(
            f"{name}'s {label}[{i}][0] must be a client, got {type(client).__name__}"
        )
    out: list[Any] = [client]
    for j in range(1, width):
        handle = item[j]
        if isinstance(handle, Handle):
            handle = handle.binding()
        elif not isinstance(handle, Binding):
            raise InvalidArgument(
                f"{name}'s {label}[{i}][{j}] must be a Handle or Binding, got "
                f"{type(handle).__name__}"
            )
        out.append(handle)
    return tuple(out)


def _distinct(name: str, label: str, checked: list[tuple[Any, ...]]) -> None:
    seen: dict[int, int] = {}
    devices: dict[str, int] = {}
    for i, entry in enumerate(checked):
        client = entry[0]
        if id(client) in seen:
            raise InvalidArgument(
                f"{name} got the same {client.device} client twice ({label}["
                f"{seen[id(client)]}] and {label}[{i}]); give each client once"
            )
        seen[id(client)] = i
        server = client.server
        owns = server.owns
        for binding in entry[1:]:
            if not owns(binding):
                raise InvalidHandle(
                    f"{name}'s {label}[{i}] handle {binding!r} does not belong to its "
                    f"{client.device} client (it is another client's, or a closed one's)"
                )
        if server.properties.kind == "cuda":
            device = server.device
            if device in devices:
                raise InvalidArgument(
                    f"{name} got two clients of {device} ({label}["
                    f"{devices[device]}] and {label}[{i}]); NCCL works across "
                    "devices, one rank per device: open one client per device"
                )
            devices[device] = i


def one_size(name: str, what: str, clients: Sequence[Any], bindings: Sequence[Binding]) -> int:
    """The one size (bytes) of ``bindings``, else InvalidArgument listing them."""
    sizes = {b.size for b in bindings}
    if len(sizes) > 1:
        listed = ", ".join(f"{c.device}: {b.size}" for c, b in zip(clients, bindings, strict=True))
        raise InvalidArgument(
            f"{name} needs {what} of one size, got {listed} bytes; pass handles of the "
            "same size (with_offset_end trims one)"
        )
    return sizes.pop()


def apart(name: str, i: int, source: Binding, dest: Binding) -> None:
    """Refuse an input and an output that overlap (NCCL's result would be undefined)."""
    if source.memory.id != dest.memory.id:
        return
    a0 = source.offset_start or 0
    b0 = dest.offset_start or 0
    if a0 < b0 + dest.size and b0 < a0 + source.size:
        raise InvalidArgument(
            f"{name}'s triples[{i}] input and output overlap (the same buffer); give the "
            "output a buffer of its own"
        )


_KINDS: dict[object, tuple[np.dtype[Any], str]] = {}
"""``check_kind``'s answers by the dtype given (a name, a numpy type or dtype): asking
numpy costs more than the rest of a small collective's checks."""
_OPS: Final = {o.value: o.value for o in ReduceOp}


def check_kind(name: str, dtype: object) -> tuple[np.dtype[Any], str]:
    """``dtype`` as a numpy dtype of :data:`DTYPES` (native byte order), and its name."""
    try:
        return _KINDS[dtype]
    except (KeyError, TypeError):  # not asked yet, or unhashable
        pass
    kind: np.dtype[Any] | None
    try:
        kind = np.dtype(dtype)  # type: ignore[call-overload]
    except TypeError:
        kind = None
    if kind is None or kind.name not in DTYPES or not kind.isnative:
        raise InvalidArgument(
            f"{name} does not reduce dtype {dtype!r}; use one of {', '.join(DTYPES)}"
        )
    try:
        if len(_KINDS) >= 64:  # bounded: a caller making new dtype objects each call
            _KINDS.clear()
        _KINDS[dtype] = (kind, kind.name)
    except TypeError:  # unhashable (a list of fields would have failed above)
        pass
    return kind, kind.name


def check_op(name: str, op: object) -> str:
    """``op``'s name, one of :class:`ReduceOp`'s."""
    try:
        return _OPS[op]  # type: ignore[index]  # a str or a ReduceOp (a str too)
    except (KeyError, TypeError):
        raise InvalidArgument(
            f"{name}'s op must be one of {', '.join(o.value for o in ReduceOp)} "
            f"(or an ac.ReduceOp), got {op!r}"
        ) from None


def check_count(name: str, count: object, unit: str, size: int, itemsize: int) -> int:
    """``count`` (None: all of ``size`` bytes) as a number of ``unit`` of ``itemsize``
    bytes that fits in ``size`` bytes."""
    if count is None:
        return size // itemsize
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise InvalidArgument(f"{name}'s count must be an int >= 0, got {count!r}")
    if count * itemsize > size:
        raise InvalidArgument(
            f"{name}'s count={count} {unit} needs {count * itemsize} bytes, but the "
            f"buffers hold {size}; pass count <= {size // itemsize}"
        )
    return count
