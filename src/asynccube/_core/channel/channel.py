"""The channel: one actor task drains a queue of commands into the server.

An idle actor with nothing queued lets the caller run its command at once (same thread,
same order; the server's batch ends with the loop iteration; past the batch budget of
such work in one iteration, 1 ms unless ``streaming.batch_us`` says otherwise, commands
go to the actor; what a server's ``FastLaunch`` or ``FastSync``
runs inline on the same conditions, ``cuda/fast.py``, is not counted). Otherwise
commands wait in a deque for the actor, which runs them in batches, yielding after each
budget's worth of work. A fire-and-forget command's error is held for its stream and
raised by the next awaited command there; awaited commands resolve a future through
the completion watcher, on the backend's loop (:mod:`.backend`: asyncio's own, or
trio's adapter): :mod:`.settle`, the channel's base. If the actor dies, every pending
and later awaitable fails at once with ClientDeadError (after a sticky device error,
with that DeviceError): :mod:`.closing`, with the close.

A command whose stream and buffers are known (sent with :meth:`Channel.send_tracked`,
on a channel given a :class:`~.footprint.Footprint`) also runs at once, within the
budget, and the one-call routes take theirs, while only such commands are queued and
none of them is on its stream or binds its buffers. Its :class:`~.footprint.Tracked`
record is made only when it waits in the queue (or an exclusive block holds it).
"""

from __future__ import annotations

import asyncio
import functools
import sys
import time
import weakref
from collections import deque
from collections.abc import Callable, Collection, Iterable
from typing import Any

from ..errors import (
    AsyncCubeError,
    ClientClosedError,
    ClientDeadError,
    InvalidArgument,
    LoopMismatchError,
)
from ..server.protocol import ComputeServer
from .awaitable import ClientFuture
from .backend import backend_of, current_library
from .closing import State, begin_close, die
from .closing import awaited as _awaited
from .completion import CompletionWatcher, LaterFuture, settle_later
from .exclusive import SCOPE, Block, Gate
from .footprint import Footprint, Tracked
from .held import HeldErrors
from .settle import PRUNE_AT, Op, Settling

__all__ = ["BATCH_SECONDS", "Channel", "State"]

BATCH_SECONDS = 0.001
"""The default budget of commands per loop iteration (``streaming.batch_us``: 1000)."""


class Channel(Settling):
    """Links a client to its server through one actor task on ``loop`` (see above)."""

    __slots__ = (
        "_activate",
        "_actor",
        "_batch_end_scheduled",
        "_blocked",
        "_cancelled",
        "_close_fut",
        "_death",
        "_exclusive",
        "_guards",
        "_held",
        "_inline_spent",
        "_later",
        "_queue",
        "_stop",
        "_wakeup",
        "_yielding",
        "backend",
        "budget",
        "exclusive_gate",
        "footprint",
        "guard",
        "loop",
        "server",
        "state",
        "watcher",
    )  # fmt: skip (slots: the hot path's FastLaunch reads several per launch)

    def __init__(
        self,
        server: ComputeServer,
        loop: asyncio.AbstractEventLoop,
        batch_seconds: float = BATCH_SECONDS,
    ) -> None:
        _check_budget(batch_seconds)
        self.server = server
        self.loop = loop
        self.budget = batch_seconds
        """Seconds of commands run in one loop iteration before yielding (see above)."""
        self.backend = backend_of(loop)
        self._cancelled = self.backend.cancelled
        self.state = State.OPEN
        self._queue: deque[tuple[Op, tuple[Any, ...]]] = deque()
        self._wakeup: asyncio.Future[None] | None = None
        # Per logical stream; shared with a server that reports errors from its workers.
        held = getattr(server, "held_errors", None)
        self._held = held if isinstance(held, HeldErrors) else HeldErrors()
        # Awaitables not settled yet, failed at once if the actor dies. The channel drops
        # each as it settles it (no done-callback: that is a loop handle per command);
        # those settled elsewhere (cancelled by their caller) are pruned in bulk.
        self._pending: set[asyncio.Future[Any]] = set()
        self._prune_at = PRUNE_AT
        self._future_class = getattr(loop, "client_future_class", ClientFuture)
        self._unclaimed = weakref.WeakSet()
        self._clears_at_call = not hasattr(server, "taint")
        self._taint_in_order = getattr(server, "taint", None)
        self._death: BaseException | None = None
        self._close_fut: asyncio.Future[Any] | None = None
        """The close's future, once ``begin_close`` made it (see :mod:`.closing`)."""
        self._stop = False
        self._batch_end_scheduled = False
        self._yielding = False
        """True while the actor yields between two slices of its batch (all run so far)."""
        self._blocked = False
        """True while the actor awaits a command's job (a compile): what is queued behind
        it cannot run before that job ends."""
        self._inline_spent = 0.0
        """Seconds of commands run inline in this loop iteration (reset at its end)."""
        self._later: list[LaterFuture[Any]] = []
        """Syncs' futures settled when the inline batch ends, unless a task awaiting
        them settled them first (their backstop: ``completion.settle_soon``)."""
        self.watcher = CompletionWatcher(loop, self.backend.checkpoint)
        self.guard: Callable[[str], None] | None = None
        """Set while a graph capture or an exclusive block is open: called by ``check``
        with the name of the client method calling it (see :mod:`.graph`,
        :mod:`.exclusive`); the servers' one-call routes decline while it is set."""
        self._guards: list[Callable[[str], None]] = []
        self._exclusive: Block | None = None
        """The active exclusive block: ``send`` asks it first (:mod:`.exclusive`)."""
        self.exclusive_gate: Gate | None = None
        """The turns of exclusive blocks (made by the first ``client.exclusive()``)."""
        self._activate: Callable[[], None] | None = getattr(server, "activate", None)
        self.footprint: Footprint | None = None
        """Set (by the client) where the server has one-call routes: the streams and
        buffers of the tracked commands queued (:meth:`send_tracked`, :mod:`.footprint`)."""
        self._actor = loop.create_task(self._run(), name="asynccube-actor")
        # An actor cancelled before it ever ran (a loop torn down at once) runs no
        # ``except``: its end is seen here, so nothing waits for it forever.
        self._actor.add_done_callback(self._actor_ended)

    # -- client side ------------------------------------------------------------------

    def check(self) -> None:
        """Raise unless the channel is open and called from its own loop."""
        if self.state is not State.OPEN:
            raise self._unusable()
        if asyncio._get_running_loop() is not self.loop and not self.backend.on_loop():
            raise self._mismatch()
        if self.guard is not None:
            self.guard(sys._getframe(1).f_code.co_name)

    def check_loop(self) -> None:
        """Raise LoopMismatchError unless called from the channel's own loop (whatever
        its state: ``close()`` asks this before it changes anything)."""
        if asyncio._get_running_loop() is not self.loop and not self.backend.on_loop():
            raise self._mismatch()

    def _mismatch(self) -> LoopMismatchError:
        if asyncio._get_running_loop() is None and current_library() is None:
            # A thread with no event loop: most often a sync handler that a web
            # framework runs in its thread pool.
            return LoopMismatchError(
                f"this client belongs to an event loop ({self.backend.name}) and was "
                "called from another thread, which runs none (a sync endpoint of a web "
                "framework runs in a thread pool, for one): make the handler "
                f"`async def` so it runs on the client's loop, or {self.backend.thread_hint}"
            )
        return LoopMismatchError(
            f"this client runs on another event loop or thread (it was opened under "
            f"{self.backend.name}); call it from its own loop, or "
            f"{self.backend.thread_hint}"
        )

    def in_actor(self) -> bool:
        """True while the actor runs the queue (a caller running a command inline sees
        False: the actor sleeps then)."""
        return self._wakeup is None

    def unusable(self) -> AsyncCubeError:
        """The error a call on this closed or dead channel raises."""
        return self._unusable()

    def idle(self) -> bool:
        """True when every sent command has run: nothing is queued, and the actor sleeps
        or yields between two slices of its batch (a command waiting on a worker-thread
        job, a compile say, keeps it busy)."""
        return not self._queue and (self._wakeup is not None or self._yielding)

    def _unusable(self) -> AsyncCubeError:
        if self.state is State.DEAD:
            if isinstance(self._death, AsyncCubeError):
                return self._death
            if isinstance(self._death, self._cancelled):
                why = "the event loop this client ran on has ended (its actor task was "
                err = ClientDeadError(why + "cancelled); open a new client on a running loop")
            else:
                err = ClientDeadError(f"the client's actor died: {self._death!r}")
            err.__cause__ = self._death
            return err
        return ClientClosedError("the client is closed; open a new one with open_client()")

    def send(self, op: Op, *args: Any) -> None:
        """Run a command: at once when the actor is idle and nothing is queued (the
        caller runs it exactly as the actor would, on the same thread, in the same
        order, and saves a loop iteration), else queued for the actor; a
        :class:`~.footprint.Tracked` one also at once when nothing queued is on its
        stream or binds its buffers, and everything queued is tracked. While an
        exclusive block is active, a command from outside its scope is held by it."""
        if self._exclusive is not None and self._exclusive.hold(op, args):
            return
        if self._wakeup is not None and not self._queue and self._inline_budget():
            self._run_inline(op, args)
            return
        if type(op) is Tracked:  # its stream and buffers known (:mod:`.footprint`)
            if self._ahead(op):
                self._run_inline(op, args)
                return
            op.enqueue()
        self._queue.append((op, args))
        self._wake()

    def quiet(self) -> bool:
        """True when nothing is queued and no capture or exclusive scope guards the
        calls: a command sent now is issued in call order with nothing ahead of it."""
        return not self._queue and self.guard is None

    def tainted_ids(self) -> Collection[int]:
        """The memory ids that carry a held failure (empty: none)."""
        return self._held._tainted.keys()

    def can_run_now(self) -> bool:
        """True when a command :meth:`send` gets now runs at once, on the calling thread:
        the actor sleeps, nothing is queued, no exclusive block is open, and the loop
        iteration's budget lasts."""
        return (
            self._wakeup is not None
            and not self._queue
            and self._exclusive is None
            and self._inline_budget()
        )

    def claim(self, op: Op, first: Any) -> bool:
        """Take ``op(first, ...)`` out of the queue to run it now, for another client's
        command of the same operation (``to_client``): True if it is the queue's head and
        the actor is between two commands (asleep, woken, or yielding between two slices
        of its batch; not awaiting a command's job), so that all this channel was sent
        before it ran and nothing after it has. The caller runs it (this server's device
        current); the server's batch ends with the loop iteration."""
        queue = self._queue
        if not queue or self._blocked or self._stop or self._exclusive is not None:
            return False
        head, args = queue[0]
        if head is not op or not args or args[0] is not first:
            return False
        queue.popleft()
        self.ran_inline()
        return True

    def send_tracked(self, op: Op, mids: list[int], stream: Any, *args: Any) -> None:
        """:meth:`send` of ``op(stream, *args)``, a command of ``stream`` (a StreamId)
        binding the buffers ``mids`` (memory ids): with a footprint, it also runs at once
        ahead of queued commands when none of them is on its stream or binds its buffers
        (:mod:`.footprint`); its :class:`~.footprint.Tracked` record is made only when it
        waits in the queue. Without a footprint, a plain :meth:`send`."""
        footprint = self.footprint
        if footprint is None:
            self.send(op, stream, *args)
            return
        if self._exclusive is not None:  # the block may hold it; else as below, in send
            self.send(Tracked(footprint, stream.value, mids, op), stream, *args)
            return
        if self._wakeup is not None and not self._queue and self._inline_budget():
            self._run_inline(op, (stream, *args))
            return
        queued = len(self._queue)
        if (
            queued
            and not self._blocked
            and self.guard is None
            and self._inline_budget()
            and footprint.clear_of(queued, stream.value, mids)
        ):
            self._run_inline(op, (stream, *args))
            return
        tracked = Tracked(footprint, stream.value, mids, op)
        tracked.enqueue()  # queued, counted in (send would check all of the above again)
        self._queue.append((tracked, (stream, *args)))
        self._wake()

    def request_tracked(
        self, op: Op, mids: list[int], stream: Any, *args: Any
    ) -> asyncio.Future[Any]:
        """:meth:`request` as :meth:`send_tracked` sends: ``op(stream, *args, fut)``."""
        fut = self._pending_future()
        self.send_tracked(op, mids, stream, *args, fut)
        return fut

    def _ahead(self, op: Tracked) -> bool:
        """True when ``op`` may run now, ahead of the queue: the actor awaits no command,
        no capture or exclusive block is open, the budget lasts, and nothing queued is a
        command it must wait for (:mod:`.footprint`)."""
        queued = len(self._queue)
        if not queued or self._blocked or self.guard is not None:
            return False
        return self._inline_budget() and op.clear(queued)

    def run_queued_inline(self) -> str | None:
        """Run every queued command now, on the calling thread, in order, as the actor
        would (for a synchronous caller that must be ordered after them: a DLPack
        export). Returns None once nothing is left queued, else why that cannot be done
        without blocking: the actor awaits a command's job (a compile), or a queued
        command must wait for one (it has started: it is left, at the queue's head, for
        the actor to finish, and what follows it stays queued). A command that raises
        kills the channel, as in the actor: its error is raised."""
        if self._blocked:
            return _BLOCKED
        if self._exclusive is not None and SCOPE.get() is not self._exclusive:
            return _HELD
        queue = self._queue
        if not queue:
            return None
        start = time.perf_counter()
        try:
            while queue and not self._stop:
                op, args = queue[0]
                if op is _awaited:  # started inline earlier; the actor awaits it next
                    return _BLOCKED
                queue.popleft()
                if self._activate is not None:
                    self._activate()
                pending = op(*args)
                if pending is not None:
                    queue.appendleft((_awaited, (pending,)))
                    self._wake()
                    return _BLOCKED
        except BaseException as exc:  # as in the actor: a bug kills the channel
            self._die(exc)
            error = self._unusable()
            if error is exc:
                raise
            raise error from exc
        finally:
            self._inline_spent += time.perf_counter() - start
            self.ran_inline()
        return None

    # -- guards and exclusive blocks (:mod:`.exclusive`) -------------------------------

    def add_guard(self, guard: Callable[[str], None]) -> None:
        """Call ``guard`` in ``check`` (a capture's, an exclusive block's) until removed."""
        self._guards.append(guard)
        self._set_guard()

    def remove_guard(self, guard: Callable[[str], None]) -> None:
        """Stop calling ``guard`` (compared with ``==``: bound methods are remade)."""
        self._guards.remove(guard)
        self._set_guard()

    def _set_guard(self) -> None:
        guards = tuple(self._guards)
        if len(guards) > 1:
            self.guard = functools.partial(_all_guards, guards)
        else:
            self.guard = guards[0] if guards else None

    def queue_held(self, held: Iterable[tuple[Op, tuple[Any, ...]]]) -> None:
        """Queue commands an exclusive block held, in order, for the actor."""
        self._queue.extend(held)
        if self._queue:
            self._wake()

    def _inline_budget(self) -> bool:
        """True while this loop iteration has run less than the batch budget inline."""
        return self._inline_spent < self.budget

    def _wake(self) -> None:
        wakeup = self._wakeup
        if wakeup is not None:
            self._wakeup = None
            if not wakeup.done():  # cancelled with the actor (a loop's teardown)
                wakeup.set_result(None)

    def _run_inline(self, op: Op, args: tuple[Any, ...]) -> None:
        start = time.perf_counter()
        try:
            if self._activate is not None:
                self._activate()
            pending = op(*args)
        except BaseException as exc:  # as in the actor: a bug kills the channel
            self._die(exc)
            return
        if pending is not None:  # it must wait (e.g. a compile): the actor takes over
            self._queue.append((_awaited, (pending,)))
            self._wake()
        self._inline_spent += time.perf_counter() - start
        self.ran_inline()

    def ran_inline(self) -> None:
        """End what ran inline, the channel's own commands or a server's one-call route
        (:mod:`.cuda.fast`): the server's batch ends with the loop iteration, and a
        stopping actor is woken to see ``_stop``."""
        if self._stop:
            self._wake()
        if not self._batch_end_scheduled:
            self._batch_end_scheduled = True
            self.loop.call_soon(self._end_inline_batch)

    def _end_inline_batch(self) -> None:
        self._batch_end_scheduled = False
        self._inline_spent = 0.0
        if self._later:
            later, self._later = self._later, []
            for fut in later:
                settle_later(fut)
        if self.state is not State.DEAD:
            self._end_batch()

    def activate(self) -> None:
        """Make the server's device current (a command resuming after an await: another
        client's commands may have run meanwhile)."""
        if self._activate is not None:
            self._activate()

    def _end_batch(self) -> None:
        if self._activate is not None:
            self._activate()
        self.server.end_batch()
        pending = self._pending
        if len(pending) >= self._prune_at:  # settled ones leave by themselves: a look
            pending.difference_update([f for f in pending if f.done()])  # now and then
            self._prune_at = max(PRUNE_AT, 2 * len(pending))  # (not every batch: O(n²))

    # -- actor side -------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            while not self._stop:
                if self._queue:
                    await self._drain()
                else:
                    self._wakeup = self.loop.create_future()
                    await self._wakeup
        except BaseException as exc:
            self._die(exc)
            if isinstance(exc, self._cancelled):
                raise

    def _actor_ended(self, actor: asyncio.Future[None]) -> None:
        if actor.cancelled() and self.state is not State.DEAD:  # before it ever ran
            self._die(asyncio.CancelledError())

    async def _drain(self) -> None:
        queue = self._queue
        clock = time.perf_counter
        deadline = clock() + self.budget
        activate = self._activate
        while queue and not self._stop:
            op, args = queue.popleft()
            if activate is not None:
                activate()
            pending = op(*args)
            if pending is not None:  # it waits (a compile, a worker, another client):
                self._end_batch()  # what is buffered goes now, as at any yield
                self._blocked = True
                try:
                    await pending
                finally:
                    self._blocked = False
            if clock() > deadline:
                self._end_batch()
                self._yielding = True
                try:
                    await self.backend.checkpoint()
                finally:
                    self._yielding = False
                deadline = clock() + self.budget
        self._end_batch()

    # -- close and death (:mod:`.closing`) ----------------------------------------------

    def begin_close(self) -> asyncio.Future[Any]:
        """Refuse new commands; queue the close after what is already queued."""
        return begin_close(self)

    def _die(self, exc: BaseException) -> None:
        die(self, exc)

    @property
    def actor(self) -> asyncio.Future[None]:
        """The actor task (asyncio's, or the trio adapter's)."""
        return self._actor

    def actor_done(self) -> bool:
        """True once the actor task has ended."""
        return self._actor.done()

    async def wait_actor(self) -> None:
        """Wait for the actor task to end (after close or death)."""
        if not self._actor.done():
            await self.backend.wait(self._actor)

    def kill_for_test(self, exc: BaseException) -> None:
        """Make the actor die with ``exc`` at its next command (tests only)."""

        def boom() -> None:
            raise exc

        self.send(boom)


def _check_budget(batch_seconds: object) -> None:
    if isinstance(batch_seconds, bool) or not isinstance(batch_seconds, int | float):
        raise InvalidArgument(f"batch_seconds must be a number, got {batch_seconds!r}")
    if not 1e-6 <= batch_seconds <= 1000:  # NaN fails too
        raise InvalidArgument(
            f"batch_seconds must be from 1e-6 to 1000 seconds, got {batch_seconds!r} "
            "(streaming.batch_us takes microseconds)"
        )


def _all_guards(guards: tuple[Callable[[str], None], ...], op: str) -> None:
    for guard in guards:
        guard(op)


_HELD = (
    "this task's commands are held by another task's exclusive block "
    "(client.exclusive()) until it ends"
)
_BLOCKED = (
    "a command queued before this call waits on a job in a worker thread (a kernel "
    "compile, or a large copy being staged)"
)
