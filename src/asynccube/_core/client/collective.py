"""``ac.all_reduce``: the element-wise reduction of one buffer per client, written back
into every one of them (in place), ordered on each client's stream like any command.

Everything is checked and queued at the call, on the calling task's stream of every
client; the returned awaitable completes once the result is in every buffer (a
``sync`` of each client, through the completion machinery: the loop never blocks), and
raises what failed there. Later commands of the same task on each client come after the
reduction without awaiting it. Not awaited, it warns like any client awaitable, and
each client's failure stays held for that client's stream (its next awaited call
raises it).

Paths (:mod:`.nccl_reduce`, :mod:`.staged_reduce`): CUDA clients of distinct devices
with NCCL found and a dtype NCCL has: ``ncclAllReduce`` on each client's stream (one
CUDA client alone: a one-rank communicator); anything else: the staged path (reads,
numpy, writes). One host client alone, or ``count=0``: the identity (only the sync).
"""

from __future__ import annotations

import asyncio
import enum
import sys
import warnings
from collections.abc import Awaitable, Generator, Sequence
from typing import Any, Final

import numpy as np

from ..channel.held import combine
from ..errors import InvalidArgument, InvalidHandle
from ..values.stream_id import StreamId
from ..values.types import Binding, Handle
from .client import ComputeClient
from .nccl_reduce import nccl_reduce
from .staged_reduce import staged

__all__ = ["DTYPES", "ReduceOp", "all_reduce"]

DTYPES: Final = (
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
)
"""The element types ``all_reduce`` takes (numpy names)."""


class ReduceOp(enum.StrEnum):
    """The reductions of :func:`all_reduce` (plain strings work too: ``"sum"``)."""

    SUM = "sum"
    PROD = "prod"
    MIN = "min"
    MAX = "max"


Pair = tuple[ComputeClient, Binding]


def all_reduce(
    pairs: Sequence[tuple[ComputeClient, Handle | Binding]],
    dtype: Any,
    op: ReduceOp | str = ReduceOp.SUM,
    *,
    count: int | None = None,
) -> Awaitable[None]:
    """Reduce one buffer per client element-wise and write the result into each.

    ``pairs``: ``(client, handle)`` for each client taking part (one client at most
    once; CUDA clients of distinct devices); ``dtype``: a numpy dtype or its name
    (int8..int64, uint8..uint64, float16, float32, float64); ``op``: ``"sum"``,
    ``"prod"``, ``"min"`` or ``"max"`` (or a :class:`ReduceOp`); ``count``: elements
    from the start of each buffer (default: the buffer's size // itemsize). Every
    buffer must have the same size. Queued at once on every client, on the calling
    task's stream; await the result to see it done (and any failure). Bad input raises
    :class:`InvalidArgument` (or :class:`InvalidHandle`, :class:`ClientClosedError`)
    before anything is queued.
    """
    if not isinstance(pairs, (list, tuple)) or not pairs:
        raise InvalidArgument(
            f"all_reduce needs a non-empty list of (client, handle) pairs, got {pairs!r:.80}"
        )
    checked = [_pair(i, p) for i, p in enumerate(pairs)]
    for client, _ in checked:
        client._channel.check()  # closed, another loop, a capture: raises now
    _distinct(checked)
    kind, name = _dtype(dtype), _op(op)
    n = _count(checked, kind, count)
    path = _nccl_path(checked, kind.name)
    if path is not None and n:
        nccl_reduce(checked, kind.name, name, n, path)
    elif n and (len(checked) > 1):
        staged(checked, kind, name, n)
    caller = sys._getframe(1)
    origin = (caller.f_code.co_filename, caller.f_lineno)
    return _Collective([client for client, _ in checked], origin)


def _pair(i: int, pair: object) -> Pair:
    if not isinstance(pair, (tuple, list)) or len(pair) != 2:
        raise InvalidArgument(f"all_reduce's pairs[{i}] must be (client, handle), got {pair!r:.80}")
    client, handle = pair
    if not isinstance(client, ComputeClient):
        raise InvalidArgument(
            f"all_reduce's pairs[{i}][0] must be a client, got {type(client).__name__}"
        )
    if isinstance(handle, Handle):
        handle = handle.binding()
    if not isinstance(handle, Binding):
        raise InvalidArgument(
            f"all_reduce's pairs[{i}][1] must be a Handle or Binding, got {type(handle).__name__}"
        )
    return client, handle


def _distinct(pairs: list[Pair]) -> None:
    seen: dict[int, int] = {}
    devices: dict[str, int] = {}
    for i, (client, binding) in enumerate(pairs):
        if id(client) in seen:
            raise InvalidArgument(
                f"all_reduce got the same {client.device} client twice (pairs[{seen[id(client)]}] "
                f"and pairs[{i}]); give each client once, with one buffer"
            )
        seen[id(client)] = i
        if not client.server.owns(binding):  # type: ignore[attr-defined]
            raise InvalidHandle(
                f"all_reduce's pairs[{i}] handle {binding!r} does not belong to its "
                f"{client.device} client (it is another client's, or a closed one's)"
            )
        if client.properties.kind == "cuda":
            if client.device in devices:
                raise InvalidArgument(
                    f"all_reduce got two clients of {client.device} (pairs["
                    f"{devices[client.device]}] and pairs[{i}]); NCCL reduces across devices, "
                    "one rank per device: open one client per device"
                )
            devices[client.device] = i


def _dtype(dtype: object) -> np.dtype[Any]:
    kind: np.dtype[Any] | None
    try:
        kind = np.dtype(dtype)  # type: ignore[call-overload]
    except TypeError:
        kind = None
    if kind is None or kind.name not in DTYPES or not kind.isnative:
        raise InvalidArgument(
            f"all_reduce does not reduce dtype {dtype!r}; use one of {', '.join(DTYPES)}"
        )
    return kind


def _op(op: object) -> str:
    try:
        return ReduceOp(op).value  # type: ignore[arg-type]  # checked: ValueError
    except ValueError:
        raise InvalidArgument(
            f"all_reduce's op must be one of {', '.join(o.value for o in ReduceOp)} "
            f"(or an ac.ReduceOp), got {op!r}"
        ) from None


def _count(pairs: list[Pair], kind: np.dtype[Any], count: object) -> int:
    sizes = {b.size for _, b in pairs}
    if len(sizes) > 1:
        listed = ", ".join(f"{c.device}: {b.size}" for c, b in pairs)
        raise InvalidArgument(
            f"all_reduce needs buffers of one size, got {listed} bytes; pass handles of "
            "the same size (with_offset_end trims one)"
        )
    size = sizes.pop()
    if size % kind.itemsize:
        raise InvalidArgument(
            f"all_reduce's buffers hold {size} bytes, not a whole number of {kind.name} "
            f"({kind.itemsize} bytes each); pass count= or buffers of whole elements"
        )
    if count is None:
        return size // kind.itemsize
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise InvalidArgument(f"all_reduce's count must be an int >= 0, got {count!r}")
    if count * kind.itemsize > size:
        raise InvalidArgument(
            f"all_reduce's count={count} {kind.name} needs {count * kind.itemsize} bytes, "
            f"but the buffers hold {size}; pass count <= {size // kind.itemsize}"
        )
    return count


def _nccl_path(pairs: list[Pair], dtype: str) -> str | None:
    """The NCCL library's path where NCCL takes this reduction, else None."""
    if any(c.properties.kind != "cuda" for c, _ in pairs):
        return None
    from ..cuda import nccl

    if dtype not in nccl.DTYPES:
        return None
    return nccl.find_library()


class _Collective:
    """What :func:`all_reduce` returns. Awaiting it queues a sync on each client (for
    the stream of the call) and awaits them in turn, raising the first failure (the
    others attached as notes). Never awaited, it warns, as any client awaitable does,
    and each client's failure stays held for that client's stream: its next awaited
    call there raises it."""

    __slots__ = ("_clients", "_futures", "_origin", "_stream")

    def __init__(self, clients: list[ComputeClient], origin: tuple[str, int]) -> None:
        self._clients = clients
        self._stream = StreamId.current()
        self._origin = origin
        self._futures: list[asyncio.Future[None]] | None = None

    def __await__(self) -> Generator[Any, None, None]:
        if self._futures is None:
            self._futures = [self._sync(c) for c in self._clients]
            for fut in self._futures[1:]:  # awaited in turn: a cancel stops at the first
                fut.add_done_callback(_looked_at)
        return self._wait(self._futures).__await__()

    def _sync(self, client: ComputeClient) -> asyncio.Future[None]:
        """``client.sync()``'s route for the call's stream (no fast path): completes once
        the work queued so far is done; raises the errors held for the stream."""
        channel = client._channel
        channel.check()
        return channel.request(channel.await_completion, self._stream, client.server.sync)

    @staticmethod
    async def _wait(futures: list[asyncio.Future[None]]) -> None:
        errors: list[BaseException] = []
        for fut in futures:
            try:
                await fut
            except Exception as exc:
                errors.append(exc)
        if errors:
            raise combine(errors, "also failed on another client")

    def __del__(self) -> None:
        if getattr(self, "_futures", True) is None:
            filename, line = self._origin
            warnings.warn(
                f"the awaitable returned by all_reduce() at {filename}:{line} was never "
                "awaited; await it (each client's failure stays held for its stream)",
                RuntimeWarning,
                stacklevel=2,
            )


def _looked_at(fut: asyncio.Future[None]) -> None:
    """Nothing: marks a client future as looked at (its error, unretrieved, still goes
    back to its stream)."""
