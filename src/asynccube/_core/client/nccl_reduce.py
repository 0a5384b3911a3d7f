"""``all_reduce``'s NCCL path: CUDA clients of distinct devices, NCCL found.

Commands queued at the call, on the caller's stream, like ``to_client``'s peer copy:
on each client a *prepare* (its stream resolved as a kernel's would be: it waits for
the buffer's earlier work on other streams), then on the first client the *issue* (every
device's ``ncclAllReduce`` in one NCCL group, once every side is prepared; the
communicators are made in a worker thread the first time), then on each client an
*after* step that waits for the issue, so the client's later commands are queued on its
stream behind the reduction (stream order: no host round trip). When every actor is
idle (the usual case) all of it runs inline in the caller. A failure is held for the
caller's stream on every client (:class:`~asynccube.CollectiveError`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..values.stream_id import StreamId
from ..values.types import Binding
from .staged_reduce import failed

if TYPE_CHECKING:
    from .client import ComputeClient

__all__ = ["nccl_reduce"]

Pair = tuple["ComputeClient", Binding]
Outcome = tuple[BaseException | None, bool]
"""(the error, or None; whether the buffers may have been touched: tainted then)."""


def _cuda() -> Any:
    from ..cuda import collective

    return collective


def nccl_reduce(pairs: Sequence[Pair], dtype: str, op: str, count: int, path: str) -> None:
    """Queue the NCCL all-reduce of ``count`` elements on every client (see above)."""
    stream = StreamId.current()
    first = pairs[0][0]
    sides: list[asyncio.Future[Any]] = []
    for client, _ in pairs:
        side: asyncio.Future[Any] = first.loop.create_future()
        client._channel.track(side)  # fails at once if that client dies before it
        sides.append(side)
    issued: asyncio.Future[Outcome] = first.loop.create_future()
    first._channel.track(issued)
    for (client, binding), side in zip(pairs, sides, strict=True):
        client._channel.send(_prepare, client, binding, side, stream)
    job = (pairs, sides, issued, count, dtype, op, path)
    first._channel.send(_issue_when_prepared, first, job)
    for (client, binding), side in zip(pairs, sides, strict=True):
        client._channel.send(_after_issue, client, binding, side, issued, stream, len(pairs))


def _prepare(
    client: ComputeClient, binding: Binding, side: asyncio.Future[Any], stream: StreamId
) -> None:
    try:
        tainted = client._channel._held.check([binding.memory.id])
        if tainted is not None:
            raise tainted
        side.set_result(_cuda().prepare(client.server, binding, stream))
    except BaseException as exc:
        side.set_exception(exc)
        side.exception()  # retrieved: the issue looks at it


def _issue_when_prepared(first: ComputeClient, job: tuple[Any, ...]) -> Any:
    pairs, sides = job[0], job[1]
    comms = _cuda().cached([c.server for c, _ in pairs])
    if comms is not None and all(s.done() for s in sides):
        _issue(first, comms, job)
        return None
    return _issue_later(first, job)


async def _issue_later(first: ComputeClient, job: tuple[Any, ...]) -> None:
    pairs, sides, issued, path = job[0], job[1], job[2], job[6]
    backend = first._channel.backend
    try:
        for side in sides:
            if not side.done():
                await backend.wait(side)
        comms = _cuda().cached([c.server for c, _ in pairs])
        if comms is None and not _side_error(sides):
            comms = await first._jobs.run(_cuda().init_job(path, [c.server for c, _ in pairs]))
    except BaseException as exc:
        _settle(issued, (exc, False))
        if isinstance(exc, backend.cancelled):
            raise
        return
    first._channel.activate()
    _issue(first, comms, job)


def _side_error(sides: Sequence[asyncio.Future[Any]]) -> BaseException | None:
    for side in sides:
        exc = side.exception()
        if exc is not None:
            return exc
    return None


def _issue(first: ComputeClient, comms: Any, job: tuple[Any, ...]) -> None:
    pairs, sides, issued, count, dtype, op = job[:6]
    exc = _side_error(sides)
    if exc is not None:
        _settle(issued, (exc, False))
        return
    try:
        prepared = [(c.server, s.result()) for (c, _), s in zip(pairs, sides, strict=True)]
        _cuda().issue(comms, prepared, count, dtype, op)
    except BaseException as error:
        _settle(issued, (error, True))
    else:
        _settle(issued, (None, False))
    first._channel.activate()  # NCCL sets each device current in turn


def _settle(issued: asyncio.Future[Outcome], outcome: Outcome) -> None:
    if not issued.done():
        issued.set_result(outcome)


def _after_issue(
    client: ComputeClient,
    binding: Binding,
    side: asyncio.Future[Any],
    issued: asyncio.Future[Outcome],
    stream: StreamId,
    n: int,
) -> Any:
    if issued.done():
        _after(client, binding, side, issued, stream, n)
        return None
    return _after_later(client, binding, side, issued, stream, n)


async def _after_later(
    client: ComputeClient,
    binding: Binding,
    side: asyncio.Future[Any],
    issued: asyncio.Future[Outcome],
    stream: StreamId,
    n: int,
) -> None:
    await client._channel.backend.wait(issued)  # tracked by the first client's channel
    client._channel.activate()
    _after(client, binding, side, issued, stream, n)


def _after(
    client: ComputeClient,
    binding: Binding,
    side: asyncio.Future[Any],
    issued: asyncio.Future[Outcome],
    stream: StreamId,
    n: int,
) -> None:
    outcome = issued.exception() or issued.result()
    if isinstance(outcome, BaseException):  # the first client died before the issue
        outcome = (outcome, False)
    exc, touched = outcome
    if exc is None:
        _cuda().finish(client.server, side.result(), binding)
        return
    error = failed(exc, client, n, touched)
    if touched:
        client._channel.taint(stream, [binding], error)
    client._channel.hold(stream, error)
