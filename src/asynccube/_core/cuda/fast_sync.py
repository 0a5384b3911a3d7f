"""``client.sync()`` in one call when the device is (nearly) done: :class:`FastSync`.

The route (``ComputeClient.sync`` -> ``Channel.request`` -> ``await_completion`` ->
``CudaServer.sync``) records an event on every stream with work not yet known done and
hands a completion to the watcher. When that work ends within a few µs (a sync right
after a short kernel), most of the cost is that machinery. ``FastSync`` polls each such
stream directly (``cuStreamQuery``, through the hot path) for up to 30 µs, as the
watcher's first spin does, and returns a future that awaiting suspends exactly once:
not a done one, so that tasks cancelled before the sync have unwound when it returns;
under asyncio it settles as its awaiting task suspends, so that task wakes in the next
loop iteration (:func:`..channel.completion.settle_soon`). The future is made before
the poll, while the device may still run. It runs only where the route would run the
sync inline with nothing else to do first: the channel open, called on its loop, no
capture, the actor idle with nothing queued, no error held (the route raises it), no
graphs to release, the device's context current as ``driver.set_current`` left it.
Anything else, a stream not done within the spin or a stream in error, returns None
and the route takes the sync (the server's collection of dropped handles, run first by
both, is idempotent); after a spin that ran out, the route's watcher does not spin
again (``CompletionWatcher.ran_out``).

Under asyncio (uvloop included), a sync whose streams are still busy at the call (a
kernel of more than a few µs just launched) is not spun on there: the call polls for at
most ``FIRST_LOOK_S`` (2 µs), then queues the poll for the loop iteration that wakes
its caller (``FastSync._poll``), so the device finishes while the loop goes round
instead of before it does. That callback, queued behind the wake-ups already queued
(those of tasks cancelled before the sync), polls the streams for up to 30 µs; done, it
marks them, settles the future and runs its callbacks at once (the awaiting task
resumes in that iteration: one suspension, as before, now overlapping the device's
work); not done (or a stream's error), it hands the sync to the route's completion
(:meth:`FastSync._hand_over`: events recorded then, watched, the errors held for the
task's stream raised as the route raises them); a poll that raises fails the sync with
that error. Such a future is among the channel's
pending ones (an actor's death fails it), and the server's ``close()`` first hands
every one not polled yet to the route (:meth:`FastSync.flush`, a ``before_close``
hook), on the loop thread, before any stream it would query is destroyed. Under trio
the call spins as the route would.

``fast_sync.foreign(work)`` does the same for ``client.wait(obj)``, once the client has
captured the work (``capture_foreign``): on the same conditions, the captured event
polled for up to 30 µs (``ForeignOps.foreign_done``); done, a done future (the route's
inline spin returns one too: awaiting it does not suspend, nothing having to unwind
first); else None, and the route waits (or raises the event's error).

``FastSync.collective(parts)`` settles the await of a collective run in one step
(``client/nccl_reduce.py``) the same way, for all its clients at once: the events the
call recorded after it on each client's pending streams, polled for up to 30 µs from any
context (no switch to each client's device), then one future.

Plain Python over the hot path's ``stream_query`` and ``event_query``: the same code for
the compiled module and its twin.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, Final

from ..channel.completion import later_futures, settle_now, settle_soon
from ..values.stream_id import StreamId
from . import driver
from .native.hotpath import hot, poll_events

if TYPE_CHECKING:
    from ..channel.channel import Channel
    from ..channel.completion import CompletionWatcher
    from ..server.foreign import ForeignWork
    from .foreign import ForeignOps

__all__ = ["FastSync"]

SPIN_S: Final = 30e-6
"""How long the streams are polled (as ``CompletionWatcher``'s ``sync_spin_seconds``)."""
FIRST_LOOK_S = 2e-6
"""How long a sync polls at the call before its poll moves to the next loop iteration
(asyncio). A trivial kernel is often done within it, and the moved poll costs about
1.4 µs more host work than a sync settled at the call; kernels that run longer lose at
most this much. Chosen on an H200 with ``benchmarks/bench_sync.py`` (0, 2 and 4 µs tried,
alternated: 2 µs as good as 0 for kernels of 10 and 30 µs, closer to the old spin at
the call for a trivial one)."""
_NOT_READY: Final = 600  # CUDA_ERROR_NOT_READY
_get_running_loop = asyncio._get_running_loop


class FastSync:
    """``fast_sync() -> a resolved future, or None`` for one client (see above)."""

    __slots__ = ("_channel", "_context", "_done_future", "_new_future", "_on_loop", "_open",
                 "_overlap", "_server", "_waiting", "declined", "foreign_hits", "handed",
                 "hits", "overlapped")  # fmt: skip

    def __init__(self, server: ForeignOps, channel: Channel) -> None:
        from ..channel.channel import State

        self._server = server
        self._channel = channel
        self._open = State.OPEN
        self._context = server._ctx.context
        self._on_loop = None if channel.backend.name == "asyncio" else channel.backend.on_loop
        self._new_future = later_futures(channel)
        self._done_future = channel.future_factory()
        self._overlap = channel.backend.name == "asyncio"  # LaterFuture's loops (see above)
        self._waiting: dict[asyncio.Future[None], StreamId] = {}
        """Overlapped syncs not polled yet, with their callers' streams."""
        self.hits = 0
        """Syncs settled here: at the call, or by their poll in the next iteration."""
        self.declined = 0
        """Syncs left to the route at the call."""
        self.overlapped = 0
        """Syncs settled by their poll in the iteration that woke their caller."""
        self.handed = 0
        """Syncs whose poll (or the server's close) handed them to the route."""
        self.foreign_hits = 0
        server.before_close.append(self.flush)

    def __call__(self) -> asyncio.Future[None] | None:
        if not self._ready():
            self.declined += 1
            return None
        server = self._server
        server._collect()
        marks = _pending(server)
        fut = self._new_future()  # made now, while the device may still run
        c = self._channel
        if marks:
            status = _all_done(marks, FIRST_LOOK_S if self._overlap else SPIN_S)  # cuStreamQuery
            if status == _NOT_READY and self._overlap:  # polled as the loop goes round
                fut._ac_source = None  # type: ignore[attr-defined]  # settled by the poll
                c._pending.add(fut)  # an actor's death fails it
                self._waiting[fut] = StreamId.current()  # (the route's, if it comes to that)
                c.loop.call_soon(self._poll, fut, marks)
                c.ran_inline()
                return fut
            if not _done(status, c.watcher):
                fut._ac_seen = True  # type: ignore[attr-defined]  # never returned: no warning
                self.declined += 1
                return None
        server._streams.mark_done(marks)
        settle_soon(fut, c._later)  # awaiting it suspends exactly once (see settle_soon)
        c.ran_inline()  # (the end of the inline batch is its backstop)
        self.hits += 1
        return fut

    def _poll(self, fut: asyncio.Future[None], marks: list[tuple[Any, int]]) -> None:
        """The loop callback of an overlapped sync (see above)."""
        sid = self._waiting.pop(fut, None)
        if sid is None:
            return  # handed to the route already (the server's close)
        c = self._channel
        if fut.done():  # cancelled by its caller, or failed by the actor's death
            c._pending.discard(fut)
            return
        try:
            if getattr(driver._tls, "context", None) is not self._context:
                c.activate()
            status = _all_done(marks, SPIN_S)
            if status != 0:
                _done(status, c.watcher)  # a spin that ran out: the watcher won't spin again
                self._hand_over(fut, sid)
                return
            self._server._streams.mark_done(marks)
        except Exception as exc:  # the sync fails with it: its caller never hangs
            c._settle(fut, sid, c._held.mark(), None, exc)
            return
        c._pending.discard(fut)
        self.hits += 1
        self.overlapped += 1
        settle_now(fut)

    def _hand_over(self, fut: asyncio.Future[None], sid: StreamId) -> None:
        """An overlapped sync to the route's completion: events recorded now on every
        stream with work not known done, watched; settled with the errors held for the
        caller's stream, as the route's await settles it."""
        c = self._channel
        server: Any = self._server  # (a CudaServer: ForeignOps and its sync)
        self.handed += 1
        try:
            completion = server.sync(sid)
        except BaseException as exc:  # the sync's own error, as the route's
            c._settle(fut, sid, c._held.mark(), None, exc)
            return
        mark = c._held.mark()
        c.watcher.watch(completion, lambda done: c._resolve(fut, sid, mark, done))

    def flush(self) -> None:
        """Every overlapped sync not polled yet to the route (the server's close: before
        any stream its poll would query is destroyed)."""
        waiting, self._waiting = self._waiting, {}
        for fut, sid in waiting.items():
            if not fut.done():
                self._hand_over(fut, sid)

    def foreign(self, work: ForeignWork) -> asyncio.Future[None] | None:
        """``client.wait``'s captured ``work`` done within the spin: a done future; else
        None (see above)."""
        if not self._ready():
            return None
        if not _done(self._server.foreign_done(work, SPIN_S), self._channel.watcher):
            return None
        fut: asyncio.Future[None] = self._done_future()
        fut.set_result(None)
        self.foreign_hits += 1
        return fut

    def collective(self, parts: list[tuple[FastSync, list[Any], list[Any]]]) -> Any:
        """The await of a collective issued in one step (``client/nccl_reduce.py``):
        ``parts`` gives each client's ``FastSync`` (this one first), the events recorded
        after the collective on that client's streams with work not known done then, and
        their marks (the streams' cursors then). On every client's conditions above, its
        context aside (an event is queried from any context): the events polled for up
        to ``SPIN_S``; all reached, every stream marked done up to its mark (work issued
        since is not waited for: its own await does) and one future, on this client's
        channel, that awaiting suspends exactly once. Else None: each client's sync takes
        it (the events are the caller's to give back either way)."""
        for fast, _, _ in parts:
            if not fast._ready(anywhere=True):
                self.declined += 1
                return None
        fut = self._new_future()
        events = [e for _, evs, _ in parts for e in evs]
        status = _events_done(events) if events else 0
        if status:
            fut._ac_seen = True  # type: ignore[attr-defined]  # never returned: no warning
            for fast, _, _ in parts:
                _done(status, fast._channel.watcher)
            self.declined += 1
            return None
        for fast, _, marks in parts:
            fast._server._streams.mark_done(marks)
        c = self._channel
        settle_soon(fut, c._later)  # awaiting it suspends exactly once (see settle_soon)
        c.ran_inline()  # (the end of the inline batch is its backstop)
        self.hits += 1
        return fut

    def _ready(self, anywhere: bool = False) -> bool:
        c = self._channel
        if c.state is not self._open or c.guard is not None or not c.idle():
            return False
        if c._stop or c._held:
            return False
        if _get_running_loop() is not c.loop and (self._on_loop is None or not self._on_loop()):
            return False
        return anywhere or getattr(driver._tls, "context", None) is self._context


def _pending(server: Any) -> list[tuple[Any, int]]:
    """The server's streams with work not known done, with their cursors (the marks of
    ``MultiStream.flush_pending``)."""
    return [(w, w.cursor) for _, w in server._streams.streams.existing() if w.cursor != w.done]


def _events_done(events: list[Any]) -> int:
    """Poll ``events`` for up to ``SPIN_S``: 0 once all are reached, else the last
    status (``poll_events``)."""
    return poll_events(hot.event_query, events, SPIN_S)


def _done(status: int, watcher: CompletionWatcher) -> bool:
    """True for a poll that found the work done; after a spin that ran out, the route's
    watcher does not spin again (``ran_out``)."""
    if status == _NOT_READY:
        watcher.ran_out()
    return status == 0


def _all_done(marks: list[tuple[Any, int]], spin: float) -> int:
    """Poll the streams of ``marks`` (their wrappers) for up to ``spin`` seconds (0: one
    look at each): 0 once all finished, else the last status (``CUDA_ERROR_NOT_READY``
    once the spin ran out, or a stream's error: the route raises it). ``poll_events``
    over the streams, written out: a sync's hot path, where the list of streams and the
    extra call cost 0.1-0.25 µs a sync (over the no-op driver)."""
    end: float | None = None
    query = hot.stream_query  # cuStreamQuery
    for wrapper, _ in marks:
        while True:
            err = int(query(wrapper.stream))
            if err == 0:
                break
            if err != _NOT_READY:
                return err  # the route raises the stream's error
            now = time.perf_counter()
            if end is None:
                end = now + spin
            if now >= end:
                return err  # the route waits
    return 0
