"""The collectives' NCCL path: CUDA clients of distinct devices, NCCL found.

One engine (:func:`nccl_run`) for every collective, given each client's buffers and
the NCCL call of every rank. Commands queued at the call, on the caller's stream, like
``to_client``'s peer copy: on each client a *prepare* (its stream resolved as a
kernel's would be: it waits for the buffers' earlier work on other streams), then on
the first client the *issue* (once every side is prepared; the communicators are made
in a worker thread the first time): every device's call in one NCCL group, handed to
the communicator set's issue thread and back through ``call_soon_threadsafe`` (or, for
a kind of call NCCL issued fast last time, issued in place: see
:mod:`..cuda.collective`); then on each client an *after* step that waits for the
issue, so the client's later commands are queued on its stream behind the collective
(stream order: no host round trip). A failure is held for the caller's stream on
every client (:class:`~asynccube.CollectiveError`); one NCCL raised taints the buffers
each client's call writes.

The usual case takes one step instead (:func:`_run_now`): every client's actor idle
with nothing queued or guarded, no buffer tainted, the communicators made, and a kind
of call NCCL issued fast last time with nothing on the set's issue thread. The whole
collective then runs at the call, on the calling thread, through the first client's
``Channel.send`` (as ``to_client``'s peer copy runs both sides at once): every side
prepared with its device current, the group issued in place (under the last client's
context: NCCL needs none), then each client's pending streams flushed to one event each,
the last client first (the other clients' batch ends run there and then, their device
current: none is left for the loop iteration's end), the first client's context current
again at the end; no future, no command per client. Each client's stream sees the same
order the commands would give it: nothing was queued before. No buffer is held: each
one's last use is the collective (:func:`~..cuda.collective.prepare` stamped it before
the group was issued), so a handle dropped from now on keeps its slice until its stream
passes it. The events let the awaitable settle in one look (:meth:`FastSync.collective
<..cuda.fast_sync.FastSync.collective>`); :data:`Settle` is what it is given.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable, Sequence
from time import perf_counter
from typing import TYPE_CHECKING, Any

from ..values.stream_id import StreamId
from ..values.types import Binding
from .staged_reduce import failed

if TYPE_CHECKING:
    from .client import ComputeClient

__all__ = ["Rank", "Settle", "given_back", "nccl_run"]

Rank = tuple["ComputeClient", tuple[Binding, ...], tuple[Binding, ...]]
"""One client's part: (client, the buffers its call binds, first one first; those of
them it writes: tainted when NCCL fails)."""
Issue = Callable[[Any, Any, list[tuple[Any, Any]]], None]
"""The group of every rank's call, on the issue thread: ``(cuda.collective, the
communicator set, [(server, prepared side), ...] in rank order)``."""
Outcome = tuple[BaseException | None, bool]
"""(the error, or None; whether the buffers may have been touched: tainted then)."""
Settle = list[tuple["ComputeClient", list[Any], list[tuple[Any, int]]]]
"""A one-step collective's events, for its awaitable: each client, the events recorded
after the collective on its streams with work not known done, and their marks (each
stream wrapper with its cursor then)."""


_collective: Any = None


def _cuda() -> Any:
    global _collective
    if _collective is None:
        from ..cuda import collective

        _collective = collective
    return _collective


class _Job:
    """One collective on its way: what the issue and the after steps share."""

    __slots__ = ("issue", "issued", "key", "path", "ranks", "sides", "stream", "what")

    def __init__(
        self,
        ranks: Sequence[Rank],
        issue: Issue,
        path: str,
        what: str,
        first: ComputeClient,
        key: Hashable | None,
        stream: StreamId | None = None,
    ) -> None:
        self.ranks, self.issue, self.path, self.what, self.key = ranks, issue, path, what, key
        self.stream = StreamId.current() if stream is None else stream
        self.sides: list[asyncio.Future[Any]] = []
        for client, _, _ in ranks:
            side: asyncio.Future[Any] = first.loop.create_future()
            client._channel.track(side)  # fails at once if that client dies before it
            self.sides.append(side)
        self.issued: asyncio.Future[Outcome] = first.loop.create_future()
        first._channel.track(self.issued)


def nccl_run(
    ranks: Sequence[Rank],
    issue: Issue,
    path: str,
    what: str,
    key: Hashable | None = None,
    stream: StreamId | None = None,
) -> Settle | None:
    """Queue the collective ``what`` over NCCL on every client (see above). ``key``:
    its kind (the collective, type, operation and size class: calls of one kind take
    the same path in NCCL), or None to always issue on the set's thread; ``stream``:
    the caller's (None: looked up). Returns the one step's events (:data:`Settle`), or
    None (the commands' route, or no events: the awaitable syncs each client)."""
    if stream is None:
        stream = StreamId.current()
    settle: list[Settle] = []
    if _run_now(ranks, issue, what, key, stream, settle):
        return settle[0] if settle else None
    first = ranks[0][0]
    job = _Job(ranks, issue, path, what, first, key, stream)
    for i, (client, _, _) in enumerate(ranks):
        client._channel.send(_prepare, job, i)
    first._channel.send(_issue_when_prepared, first, job)
    for i, (client, _, _) in enumerate(ranks):
        client._channel.send(_after_issue, job, i)
    return None


def _run_now(
    ranks: Sequence[Rank],
    issue: Issue,
    what: str,
    key: Hashable | None,
    stream: StreamId,
    settle: list[Settle],
) -> bool:
    """Run the whole collective now, in one step (see above), if it may: True once done
    (its failure held on every client; ``settle`` given its events), False for the
    commands' route."""
    for client, bindings, _ in ranks:
        channel = client._channel
        if not channel.quiet() or not channel.can_run_now():
            return False
        tainted = channel.tainted_ids()
        if tainted and any(b.memory.id in tainted for b in bindings):
            return False  # the route holds that failure for every client
    cuda = _cuda()
    comms = cuda.cached([c.server for c, _, _ in ranks])
    if comms is None or not comms.inline_ready(key):
        return False
    ranks[0][0]._channel.send(_now, ranks, issue, what, key, comms, cuda, stream, settle)
    return True


def _now(
    ranks: Sequence[Rank],
    issue: Issue,
    what: str,
    key: Hashable | None,
    comms: Any,
    cuda: Any,
    stream: StreamId,
    settle: list[Settle],
) -> None:
    """The whole collective, run by the first client's ``send`` at once (its device
    current): every side prepared, the group issued in place, each client's pending
    streams flushed (:func:`_flushed`). Never raises (the channel would die): failures
    are held as the route's after steps hold them."""
    sides: list[Any] = []
    try:
        for i, (client, bindings, _) in enumerate(ranks):
            if i:  # the first's device is current (its send made it)
                client._channel.activate()
            sides.append(cuda.prepare(client.server, bindings, stream))
    except BaseException as exc:
        _ended(ranks)
        _hold_all(ranks, stream, what, exc, False)
        return
    prepared = [(c.server, s) for (c, _, _), s in zip(ranks, sides, strict=True)]
    try:
        ran = comms.run_inline(key, lambda: issue(cuda, comms, prepared))
    except BaseException as exc:
        _ended(ranks)
        _hold_all(ranks, stream, what, exc, True)
        return
    if not ran:  # the set is being destroyed (a client closing): as the route does
        _hand_over(ranks, issue, what, key, comms, sides, stream)
        return
    flushed = _flushed(ranks)
    if flushed is not None:
        settle.append(flushed)


def _flushed(ranks: Sequence[Rank]) -> Settle | None:
    """After the group: each client's streams with work not known done flushed to an
    event each, the last client first (its context is the one NCCL left current), each
    other client's batch end run there and then (its device current); the first
    client's context current at the end, as the caller had it. None where a flush
    failed (the awaitable then syncs each client, which meets that error again)."""
    out: Settle = []
    ok = all(c._fast_sync is not None for c, _, _ in ranks)  # CUDA servers' streams
    for client, _, _ in reversed(ranks):
        channel = client._channel
        channel.activate()  # a switch only where another context is current
        if ok:
            try:
                server: Any = client.server  # a CUDA server's (FastSync above)
                events, marks = server._streams.flush_pending()
                out.append((client, events, marks))
            except Exception:  # a driver error: met again by the sync
                ok = False
        if client is not ranks[0][0]:
            _end_batch_here(channel)
    if ok:
        return out[::-1]
    given_back(out)
    return None


def _end_batch_here(channel: Any) -> None:
    """The batch end the loop iteration's end would run for ``channel``, run now (its
    device current): nothing is left for a switch to its device later."""
    try:
        channel.server.end_batch()
    except Exception:  # the loop's batch end meets it again (as without this step)
        channel.ran_inline()
        return
    if channel._stop:  # a stopping actor is woken to see it
        channel.ran_inline()


def given_back(settle: Settle) -> None:
    """Return a :data:`Settle`'s events to their servers' pools."""
    for client, events, _ in settle:
        server: Any = client.server
        give = server._events.give
        for event in events:
            give(event)


def _ended(ranks: Sequence[Rank]) -> None:
    """Every other client's batch ends with the loop iteration too (the first's
    ``send`` ends its own); the first's device is made current again."""
    for client, _, _ in ranks[1:]:
        client._channel.ran_inline()
    ranks[0][0]._channel.activate()


def _hold_all(
    ranks: Sequence[Rank], stream: StreamId, what: str, exc: BaseException, touched: bool
) -> None:
    """Hold the collective's failure ``exc`` on every client (see :func:`_hold`)."""
    for rank in ranks:
        _hold(rank, len(ranks), stream, what, exc, touched)


def _hold(
    rank: Rank, count: int, stream: StreamId, what: str, exc: BaseException, touched: bool
) -> None:
    """Hold the failure ``exc`` of a collective of ``count`` clients on ``rank``'s client
    for ``stream``, tainting what its call writes where NCCL may have touched it."""
    client, _, written = rank
    error = failed(exc, client, count, touched, what)
    if touched and written:
        client._channel.taint(stream, list(written), error)
    client._channel.hold(stream, error)


def _hand_over(
    ranks: Sequence[Rank],
    issue: Issue,
    what: str,
    key: Hashable | None,
    comms: Any,
    sides: list[Any],
    stream: StreamId,
) -> None:
    """The prepared collective through the route's issue and after steps (the set
    refused to run it in place)."""
    first = ranks[0][0]
    job = _Job(ranks, issue, "", what, first, key, stream)
    for fut, side in zip(job.sides, sides, strict=True):
        fut.set_result(side)
    _issue(first, comms, job)
    for i, (client, _, _) in enumerate(ranks):
        client._channel.send(_after_issue, job, i)
    _ended(ranks)


def _prepare(job: _Job, i: int) -> None:
    client, bindings, _ = job.ranks[i]
    side = job.sides[i]
    try:
        tainted = client._channel._held.check([b.memory.id for b in bindings])
        if tainted is not None:
            raise tainted
        side.set_result(_cuda().prepare(client.server, bindings, job.stream))
    except BaseException as exc:
        side.set_exception(exc)
        side.exception()  # retrieved: the issue looks at it


def _issue_when_prepared(first: ComputeClient, job: _Job) -> Any:
    comms = _cuda().cached([c.server for c, _, _ in job.ranks])
    if comms is not None and all(s.done() for s in job.sides):
        _issue(first, comms, job)
        return None
    return _issue_later(first, job)


async def _issue_later(first: ComputeClient, job: _Job) -> None:
    backend = first._channel.backend
    servers = [c.server for c, _, _ in job.ranks]
    try:
        for side in job.sides:
            if not side.done():
                await backend.wait(side)
        comms = _cuda().cached(servers)
        if comms is None and not _side_error(job.sides):
            comms = await first._jobs.run(_cuda().init_job(job.path, servers))
    except BaseException as exc:
        _settle(job.issued, (exc, False))
        if isinstance(exc, backend.cancelled):
            raise
        return
    _issue(first, comms, job)


def _side_error(sides: Sequence[asyncio.Future[Any]]) -> BaseException | None:
    for side in sides:
        exc = side.exception()
        if exc is not None:
            return exc
    return None


def _issue(first: ComputeClient, comms: Any, job: _Job) -> None:
    """Hand the group to the set's issue thread; its outcome comes back to the loop
    (one hop there, one back). Nothing here calls NCCL."""
    exc = _side_error(job.sides)
    if exc is not None:
        _settle(job.issued, (exc, False))
        return
    prepared = [(c.server, s.result()) for (c, _, _), s in zip(job.ranks, job.sides, strict=True)]
    cuda, issue, loop, issued, key = _cuda(), job.issue, first.loop, job.issued, job.key
    try:  # in place where NCCL was fast for this kind and nothing is queued before it
        ran = comms.run_inline(key, lambda: issue(cuda, comms, prepared))
    except BaseException as error:
        ran = True
        _settle(issued, (error, True))
    if ran:
        _settle(issued, (None, False))  # (no-op after a failure: settled already)
        first._channel.activate()  # NCCL made each device current in turn
        return

    def call() -> None:
        start = perf_counter()
        issue(cuda, comms, prepared)
        comms.timed(key, perf_counter() - start)

    def done(error: BaseException | None) -> None:
        try:
            loop.call_soon_threadsafe(_settle, issued, (error, error is not None))
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass

    try:
        comms.submit(call, done)
    except BaseException as error:  # destroyed (a client of the set closed): not run
        _settle(issued, (error, False))


def _settle(issued: asyncio.Future[Outcome], outcome: Outcome) -> None:
    if not issued.done():
        issued.set_result(outcome)


def _after_issue(job: _Job, i: int) -> Any:
    if job.issued.done():
        _after(job, i)
        return None
    return _after_later(job, i)


async def _after_later(job: _Job, i: int) -> None:
    client = job.ranks[i][0]
    await client._channel.backend.wait(job.issued)  # tracked by the first client's channel
    client._channel.activate()
    _after(job, i)


def _after(job: _Job, i: int) -> None:
    client, bindings, _ = job.ranks[i]
    issued = job.issued
    outcome = issued.exception() or issued.result()
    if isinstance(outcome, BaseException):  # the first client died before the issue
        outcome = (outcome, False)
    exc, touched = outcome
    if exc is None:
        _cuda().finish(client.server, job.sides[i].result(), bindings)
        return
    _hold(job.ranks[i], len(job.ranks), job.stream, job.what, exc, touched)
