"""The collectives across clients, ordered on each client's stream like any command:
``ac.all_reduce`` (the element-wise reduction of one buffer per client, written back
into each), ``ac.broadcast`` (one client's buffer copied into every other's),
``ac.all_gather`` (every client's input, side by side, in every output) and
``ac.reduce_scatter`` (the reduction of every input, each client receiving its chunk).

Everything is checked (:mod:`.collective_checks`) and queued at the call, on the
calling task's stream of every client; the returned awaitable completes once the
result is in every buffer (a ``sync`` of each client, through the completion
machinery: the loop never blocks; for a collective run in one step, one look at the
events the call recorded), and raises what failed there. Later commands of the
same task on each client come after the collective without awaiting it. Not awaited,
it warns like any client awaitable, and each client's failure stays held for that
client's stream (its next awaited call raises it).

Paths (:mod:`.nccl_reduce`, :mod:`.staged_reduce`): CUDA clients of distinct devices
with NCCL found (and, for a reduction, a dtype NCCL has): NCCL on each client's stream
(one CUDA client alone: a one-rank communicator); anything else: the staged path
(reads, numpy, writes). Nothing to move (one host client of ``all_reduce`` or
``broadcast``, a count or size of 0): the sync only.
"""

from __future__ import annotations

import asyncio
import sys
import warnings
from collections.abc import Awaitable, Generator, Sequence
from typing import Any

import numpy as np

from ..channel.held import combine
from ..errors import InvalidArgument
from ..values.stream_id import StreamId
from ..values.types import Binding, Handle
from .client import ComputeClient
from .collective_checks import (
    DTYPES,
    ReduceOp,
    apart,
    check_count,
    check_kind,
    check_op,
    entries,
    one_size,
)
from .nccl_reduce import Rank, Settle, given_back, nccl_run
from .staged_reduce import Staged, reduce_arrays, staged_run

__all__ = ["DTYPES", "ReduceOp", "all_gather", "all_reduce", "broadcast", "reduce_scatter"]

Buffer = Handle | Binding


def all_reduce(
    pairs: Sequence[tuple[ComputeClient, Buffer]],
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
    name = "all_reduce"
    checked = entries(name, pairs, 2)
    clients = [e[0] for e in checked]
    (kind, tname), reduce = check_kind(name, dtype), check_op(name, op)
    size = one_size(name, "buffers", clients, [e[1] for e in checked])
    n = check_count(name, count, tname, _whole(name, size, kind), kind.itemsize)
    path = _nccl_path(clients, tname)
    stream = StreamId.current()
    settle: Settle | None = None
    if path is not None and n:
        ranks: list[Rank] = [(c, (b,), (b,)) for c, b in checked]

        def issue(cuda: Any, comms: Any, sides: list[Any]) -> None:
            cuda.issue(comms, sides, n, tname, reduce)

        settle = nccl_run(ranks, issue, path, name, (name, tname, reduce, n.bit_length()), stream)
    elif n and len(checked) > 1:
        nbytes = n * kind.itemsize

        def compute(arrays: list[Any]) -> list[Any]:
            return [reduce_arrays(arrays, kind, reduce, n)] * len(arrays)

        reads = [(c, b, nbytes) for c, b in checked]
        staged_run(Staged(reads, checked, compute, nbytes * len(checked), name))
    return _Collective(clients, _origin(), name, stream, settle)


def broadcast(
    pairs: Sequence[tuple[ComputeClient, Buffer]],
    *,
    root: int = 0,
    count: int | None = None,
) -> Awaitable[None]:
    """Copy the first ``count`` bytes of ``pairs[root]``'s buffer into every other one.

    ``pairs``: ``(client, handle)`` for each client taking part (one client at most
    once; CUDA clients of distinct devices), every buffer of the same size; ``root``:
    the index in ``pairs`` of the client whose buffer is copied; ``count``: bytes from
    the start of each buffer (default: the whole buffer). Queued at once on every
    client, on the calling task's stream, like :func:`all_reduce` (through
    ``ncclBroadcast`` between GPUs, else read and written); await the result to see it
    done. Bad input raises :class:`InvalidArgument` (or :class:`InvalidHandle`,
    :class:`ClientClosedError`) before anything is queued.
    """
    name = "broadcast"
    checked = entries(name, pairs, 2)
    clients = [e[0] for e in checked]
    if isinstance(root, bool) or not isinstance(root, int) or not 0 <= root < len(checked):
        raise InvalidArgument(
            f"broadcast's root must be an index into pairs (0 to {len(checked) - 1}), got {root!r}"
        )
    size = one_size(name, "buffers", clients, [e[1] for e in checked])
    nbytes = check_count(name, count, "bytes", size, 1)
    path = _nccl_path(clients, "uint8")
    stream = StreamId.current()
    settle: Settle | None = None
    if path is not None and nbytes:
        ranks: list[Rank] = [
            (c, (b,), () if i == root else (b,)) for i, (c, b) in enumerate(checked)
        ]

        def issue(cuda: Any, comms: Any, sides: list[Any]) -> None:
            cuda.broadcast(comms, sides, nbytes, root)

        settle = nccl_run(ranks, issue, path, name, (name, root, nbytes.bit_length()), stream)
    elif nbytes and len(checked) > 1:

        def compute(arrays: list[Any]) -> list[Any]:
            data = np.frombuffer(arrays[0], np.uint8, count=nbytes)
            return [None if i == root else data for i in range(len(checked))]

        reads = [(checked[root][0], checked[root][1], nbytes)]
        writes = [(c, None if i == root else b) for i, (c, b) in enumerate(checked)]
        staged_run(Staged(reads, writes, compute, 0, name))
    return _Collective(clients, _origin(), name, stream, settle)


def all_gather(
    triples: Sequence[tuple[ComputeClient, Buffer, Buffer]],
) -> Awaitable[None]:
    """Gather every client's input into every client's output, side by side.

    ``triples``: ``(client, input, output)`` for each client taking part (one client at
    most once; CUDA clients of distinct devices). Every input holds the same ``S``
    bytes, every output ``len(triples) * S``; the i-th chunk of each output (bytes
    ``i * S`` to ``(i + 1) * S``) receives ``triples[i]``'s input. Queued at once on
    every client, on the calling task's stream, like :func:`all_reduce` (through
    ``ncclAllGather`` between GPUs, else read and written); await the result to see it
    done. Bad input raises :class:`InvalidArgument` (or :class:`InvalidHandle`,
    :class:`ClientClosedError`) before anything is queued.
    """
    name = "all_gather"
    checked = entries(name, triples, 3)
    clients, n = [e[0] for e in checked], len(checked)
    chunk = one_size(name, "inputs", clients, [e[1] for e in checked])
    _outputs(name, checked, n * chunk, f"{n} x {chunk}")
    path = _nccl_path(clients, "uint8")
    stream = StreamId.current()
    settle: Settle | None = None
    if path is not None and chunk:
        ranks: list[Rank] = [(c, (i, o), (o,)) for c, i, o in checked]

        def issue(cuda: Any, comms: Any, sides: list[Any]) -> None:
            cuda.all_gather(comms, sides, chunk)

        settle = nccl_run(ranks, issue, path, name, (name, chunk.bit_length()), stream)
    elif chunk:

        def compute(arrays: list[Any]) -> list[Any]:
            out = np.concatenate([np.frombuffer(a, np.uint8, count=chunk) for a in arrays])
            return [out] * n

        reads = [(c, i, chunk) for c, i, _ in checked]
        writes = [(c, o) for c, _, o in checked]
        staged_run(Staged(reads, writes, compute, n * chunk, name))
    return _Collective(clients, _origin(), name, stream, settle)


def reduce_scatter(
    triples: Sequence[tuple[ComputeClient, Buffer, Buffer]],
    dtype: Any,
    op: ReduceOp | str = ReduceOp.SUM,
) -> Awaitable[None]:
    """Reduce every client's input element-wise; client i's output receives chunk i.

    ``triples``: ``(client, input, output)`` for each client taking part (one client at
    most once; CUDA clients of distinct devices). Every input holds ``len(triples)``
    chunks of ``S`` bytes (whole elements of ``dtype``), every output ``S`` bytes; the
    output of ``triples[i]`` receives the reduction of the i-th chunk of every input.
    ``dtype`` and ``op`` as for :func:`all_reduce`. Queued at once on every client, on
    the calling task's stream (through ``ncclReduceScatter`` between GPUs, else read,
    reduced with numpy and written); await the result to see it done. Bad input raises
    :class:`InvalidArgument` (or :class:`InvalidHandle`, :class:`ClientClosedError`)
    before anything is queued.
    """
    name = "reduce_scatter"
    checked = entries(name, triples, 3)
    clients, n = [e[0] for e in checked], len(checked)
    (kind, tname), reduce = check_kind(name, dtype), check_op(name, op)
    size = one_size(name, "inputs", clients, [e[1] for e in checked])
    if size % (n * kind.itemsize):
        raise InvalidArgument(
            f"reduce_scatter's inputs hold {size} bytes, not {n} chunks (one per client) "
            f"of whole {tname} ({kind.itemsize} bytes each); pass inputs of "
            f"{n} x k x {kind.itemsize} bytes"
        )
    chunk = size // n
    _outputs(name, checked, chunk, f"{size} / {n}")
    count = chunk // kind.itemsize
    path = _nccl_path(clients, tname)
    stream = StreamId.current()
    settle: Settle | None = None
    if path is not None and count:
        ranks: list[Rank] = [(c, (i, o), (o,)) for c, i, o in checked]

        def issue(cuda: Any, comms: Any, sides: list[Any]) -> None:
            cuda.reduce_scatter(comms, sides, count, tname, reduce)

        key = (name, tname, reduce, count.bit_length())
        settle = nccl_run(ranks, issue, path, name, key, stream)
    elif count:

        def compute(arrays: list[Any]) -> list[Any]:
            out = reduce_arrays(arrays, kind, reduce, n * count)
            return [out[i * count : (i + 1) * count] for i in range(n)]

        reads = [(c, i, size) for c, i, _ in checked]
        writes = [(c, o) for c, _, o in checked]
        staged_run(Staged(reads, writes, compute, n * size, name))
    return _Collective(clients, _origin(), name, stream, settle)


def _whole(name: str, size: int, kind: np.dtype[Any]) -> int:
    if size % kind.itemsize:
        raise InvalidArgument(
            f"{name}'s buffers hold {size} bytes, not a whole number of {kind.name} "
            f"({kind.itemsize} bytes each); pass count= or buffers of whole elements"
        )
    return size


def _outputs(name: str, checked: list[tuple[Any, ...]], size: int, how: str) -> None:
    """Every output holds ``size`` bytes and overlaps no input of its client."""
    for i, (client, source, dest) in enumerate(checked):
        if dest.size != size:
            raise InvalidArgument(
                f"{name}'s outputs must hold {how} = {size} bytes, got {dest.size} bytes "
                f"for {client.device} (triples[{i}]); pass outputs of {size} bytes"
            )
        apart(name, i, source, dest)


_nccl: Any = None
""":mod:`..cuda.nccl`, once a collective of CUDA clients asked (not imported before)."""


def _nccl_path(clients: list[ComputeClient], dtype: str) -> str | None:
    """The NCCL library's path where NCCL takes this collective, else None."""
    for client in clients:
        if client.properties.kind != "cuda":
            return None
    global _nccl
    if _nccl is None:
        from ..cuda import nccl

        _nccl = nccl
    if dtype not in _nccl.DTYPES:
        return None
    return _nccl.find_library()  # type: ignore[no-any-return]


def _origin() -> tuple[str, int]:
    """The file and line of the public function's caller."""
    caller = sys._getframe(2)
    return caller.f_code.co_filename, caller.f_lineno


class _Collective:
    """What a collective returns. Awaiting it syncs each client (for the stream of the
    call: :meth:`_sync`) and awaits them in turn, raising the first failure (the others
    attached as notes). A collective run in one step (:mod:`.nccl_reduce`) recorded an
    event after it on each client's streams with work not known done: awaited from the
    calling task, with no failure held on any client, one look at those events settles
    it (one future: ``FastSync.collective``; the work the call was issued behind is done,
    work issued since is left to its own await), every client's sync otherwise. Never
    awaited, it warns, as any client awaitable does, and each client's failure stays held
    for that client's stream: its next awaited call there raises it."""

    __slots__ = ("_awaited", "_clients", "_futures", "_name", "_origin", "_settle", "_stream")

    def __init__(
        self,
        clients: list[ComputeClient],
        origin: tuple[str, int],
        name: str,
        stream: StreamId,
        settle: Settle | None = None,
    ) -> None:
        self._clients = clients
        self._stream = stream
        self._origin = origin
        self._name = name
        self._settle = settle
        self._futures: list[asyncio.Future[None]] | None = None
        self._awaited = False

    def __await__(self) -> Generator[Any, None, None]:
        if self._futures is None:
            self._awaited = True  # no warning, even where a client closed since the call
            settle, self._settle = self._settle, None
            try:
                for client in self._clients:  # raised before any sync is made
                    client._channel.check()
                own = StreamId.current() == self._stream
                done = _one_look(settle) if own and settle is not None else None
            finally:
                if settle is not None:
                    given_back(settle)
            if done is not None:
                self._futures = [done]
            else:
                self._futures = [self._sync(c, own) for c in self._clients]
                for fut in self._futures[1:]:  # awaited in turn: a cancel stops at the first
                    fut.add_done_callback(_looked_at)
        return self._wait(self._futures).__await__()

    def _sync(self, client: ComputeClient, own: bool) -> asyncio.Future[None]:
        """A sync of ``client`` for the call's stream: completes once the work queued so
        far is done; raises the errors held for the stream. ``own``: awaited from the
        calling task (the usual case): ``client.sync()`` itself, with its one-call route, the
        client's device made current first (that route asks it); from another task, the
        route alone, for the call's stream."""
        channel = client._channel  # checked by the caller: open, on its loop
        if own:
            channel.activate()
            return client.sync()
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
        settle = getattr(self, "_settle", None)
        if settle is not None:
            given_back(settle)
        if not getattr(self, "_awaited", True):
            filename, line = self._origin
            warnings.warn(
                f"the awaitable returned by {self._name}() at {filename}:{line} was never "
                "awaited; await it (each client's failure stays held for its stream)",
                RuntimeWarning,
                stacklevel=2,
            )


def _one_look(settle: Settle) -> asyncio.Future[None] | None:
    """The one-step collective's events all reached, at one look: a future that awaiting
    suspends once (see :class:`_Collective`); else None."""
    parts = []
    for client, events, marks in settle:
        fast = client._fast_sync
        if fast is None or client._graph_registry is not None:
            return None
        parts.append((fast, events, marks))
    return parts[0][0].collective(parts)  # type: ignore[no-any-return]


def _looked_at(fut: asyncio.Future[None]) -> None:
    """Nothing: marks a client future as looked at (its error, unretrieved, still goes
    back to its stream)."""
