"""How a channel's commands settle (the base of :class:`~.channel.Channel`).

A fire-and-forget command's error is held for its stream (``fire``, ``hold``), and the
buffers it would have written are tainted (``fire_writing``). An awaited command's
future (``request``: a :class:`~.awaitable.ClientFuture`) is resolved from a server
``Completion`` through the completion watcher (``await_completion``) or from a value
(``call``). It first waits for the work queued before it on its stream, then raises
every error held there up to that point, once (``_settle``), so no error is raised
early and none is left for a later call. Errors keep no frames. The channel keeps every
future not settled yet in ``_pending``, to fail them all at once if its actor dies; a
failed one nobody retrieved is kept (weakly) in ``_unclaimed`` for ``close()``.
"""

from __future__ import annotations

import asyncio
import functools
import weakref
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from ..errors import AsyncCubeError, Unknown
from ..server.protocol import Completion, OffLoop
from ..values.stream_id import StreamId
from .awaitable import new_future
from .completion import CompletionWatcher
from .held import HeldErrors, combine, detach_frames

__all__ = ["PRUNE_AT", "Op", "Settling"]

Op = Callable[..., Awaitable[None] | None]
PRUNE_AT = 256
"""Pending futures past which the settled ones are pruned in bulk (then twice as many)."""


class Settling:
    """The settling half of :class:`~.channel.Channel` (see above): the futures not
    settled yet are its own; the channel holds the rest of the state and runs the
    commands (``send``, ``_die``)."""

    __slots__ = ("_clears_at_call", "_future_class", "_pending", "_prune_at", "_taint_in_order",
                 "_unclaimed")  # fmt: skip
    _pending: set[asyncio.Future[Any]]
    """Awaitables not settled yet (see ``Channel.__init__``)."""
    _prune_at: int
    _future_class: type[asyncio.Future[Any]]
    """The class of the awaitables the client returns (asyncio's or trio's)."""
    _unclaimed: weakref.WeakSet[asyncio.Future[Any]]
    """Failed awaitables whose error may still be unretrieved (``close()`` raises them)."""
    _clears_at_call: bool
    """The server reports a command's failure when it is issued (CUDA): a command issued
    without error clears the taints of its buffers then. Otherwise (the host server's
    workers) the server clears and taints them itself, as the work runs."""
    _taint_in_order: Callable[[StreamId, list[Any], BaseException], None] | None
    """The server's ``taint``: marks buffers tainted in stream order (after the work
    queued before), or None to mark them at once."""
    loop: asyncio.AbstractEventLoop
    backend: Any
    _cancelled: tuple[type[BaseException], ...]
    watcher: CompletionWatcher
    _held: HeldErrors
    server: Any
    _wakeup: asyncio.Future[None] | None

    def send(self, op: Op, *args: Any) -> None:
        """Run or queue a command (the channel's)."""
        raise NotImplementedError

    def _die(self, exc: BaseException) -> None:
        raise NotImplementedError

    def request(self, op: Op, *args: Any) -> asyncio.Future[Any]:
        """Queue a command whose last argument is the future it resolves; return it."""
        fut = self._pending_future()
        self.send(op, *args, fut)
        return fut

    def _pending_future(self) -> asyncio.Future[Any]:
        """A client future for a request, failed at once if the actor dies."""
        fut = new_future(self._future_class, self.loop, self._held)
        pending = self._pending
        if len(pending) >= self._prune_at:
            pending.difference_update([f for f in pending if f.done()])
            self._prune_at = max(PRUNE_AT, 2 * len(pending))
        pending.add(fut)
        return fut

    def track(self, fut: asyncio.Future[Any]) -> None:
        """Fail ``fut`` at once if the actor dies before settling it (a future that a
        command of this channel sets and another client's command awaits). Forgotten
        once done (a done callback), so no done future is kept for a prune to find."""
        self._pending.add(fut)
        fut.add_done_callback(self._pending.discard)

    def settled(self, fut: asyncio.Future[Any]) -> None:
        """Forget ``fut``, a request's future its command settled itself (not through
        ``call``/``await_completion``), so nothing keeps its result alive."""
        self._pending.discard(fut)

    def future_factory(self) -> Callable[[], asyncio.Future[Any]]:
        """Makes client futures (for the servers' fast routes: no frame of its own, so
        a future still names the user's line that asked for it)."""
        return functools.partial(new_future, self._future_class, self.loop, self._held)

    def new_future(self) -> asyncio.Future[Any]:
        """A client future."""
        return new_future(self._future_class, self.loop, self._held)

    def fire(self, stream: StreamId, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args, stream)``; hold any error for ``stream``."""
        try:
            fn(*args, stream)
        except BaseException as exc:
            self.hold(stream, exc)

    def fire_writing(
        self, stream: StreamId, written: list[Any], fn: Callable[..., Any], *args: Any
    ) -> None:
        """``fire`` for a command that writes the bindings ``written``: if it fails,
        they are tainted; if it is issued without error on a server that reports
        failures then, their taints are cleared."""
        try:
            fn(*args, stream)
        except BaseException as exc:
            self.hold(stream, exc)
            self.taint(stream, written, exc)
            return
        if self._clears_at_call and self._held._tainted:
            self._held.clear(_ids(written))

    def taint(self, stream: StreamId, written: list[Any], exc: BaseException) -> None:
        """Mark the bindings ``written`` (those of this client) as last written by a
        command that failed."""
        owns = getattr(self.server, "owns", None)
        if owns is not None:
            written = [b for b in written if _owned(owns, b)]
        if not written:
            return
        if self._taint_in_order is not None:
            try:
                self._taint_in_order(stream, written, exc)
                return
            except BaseException as failed:  # e.g. a binding of another client
                exc.add_note(f"its buffers were tainted at once: {failed!r}")
        self._held.taint(_ids(written), exc)

    def hold(self, stream: StreamId, exc: BaseException) -> None:
        """Keep ``exc`` for the next awaited command on ``stream`` (or die if sticky).

        A held error keeps no frames: its traceback becomes a note naming where it was
        raised (see :func:`.held.detach_frames`).
        """
        if getattr(exc, "sticky", False):
            self._die(exc)
            return
        detach_frames(exc, "raised by a command that was not awaited")
        if not isinstance(exc, AsyncCubeError):
            wrapped = Unknown(f"{type(exc).__name__}: {exc}")
            wrapped.__cause__ = exc
            exc = wrapped
        self._held.hold(stream, exc)

    def take_held(self, stream: StreamId, upto: int | None = None) -> BaseException | None:
        """Every error held for ``stream`` (up to sequence ``upto``), cleared, as one."""
        return self._held.take(stream, upto)

    def await_completion(
        self,
        stream: StreamId,
        fn: Callable[..., Completion[Any]],
        *args: Any,
    ) -> None:
        """Run ``fn(*args[:-1], stream)`` and resolve the future ``args[-1]`` from it once
        done, or fail it with the errors held for ``stream`` by then (see ``_settle``)."""
        *call_args, fut = args
        if fut.done():
            self._pending.discard(fut)
            return
        try:
            completion = fn(*call_args, stream)
        except BaseException as exc:
            self._settle(fut, stream, self._held.mark(), None, exc)
            return
        mark = self._held.mark()
        # A caller running this inline awaits it next: worth a short spin (the watcher's).
        inline = self._wakeup is not None
        self.watcher.watch(completion, lambda c: self._resolve(fut, stream, mark, c), inline)

    def call(self, stream: StreamId, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args[:-1], stream)`` and resolve the future ``args[-1]`` with it (or
        with the errors held for ``stream`` so far)."""
        *call_args, fut = args
        if fut.done():
            self._pending.discard(fut)
            return
        try:
            value = fn(*call_args, stream)
        except BaseException as exc:
            self._settle(fut, stream, self._held.mark(), None, exc)
            return
        self._settle(fut, stream, self._held.mark(), value, None)

    def refuse(self, fut: asyncio.Future[Any], stream: StreamId, error: BaseException) -> None:
        """Fail the awaited command of ``fut`` without running it (with the errors held
        for ``stream`` so far first)."""
        self._settle(fut, stream, self._held.mark(), None, error)

    def _resolve(
        self, fut: asyncio.Future[Any], stream: StreamId, mark: int, completion: Completion[Any]
    ) -> None:
        # A host completion marks the errors held when its work ran (its worker's view).
        mark = max(mark, getattr(completion, "held_mark", 0))
        try:
            value = completion.result()
        except BaseException as exc:
            self._settle(fut, stream, mark, None, exc)
            return
        if type(value) is OffLoop:  # its work in a worker thread, then settled here
            self.loop.create_task(self._off_loop(fut, stream, mark, value))
            return
        self._settle(fut, stream, mark, value, None)

    async def _off_loop(
        self, fut: asyncio.Future[Any], stream: StreamId, mark: int, value: OffLoop[Any]
    ) -> None:
        """Run ``value.work`` in a worker thread, then ``value.finish`` here, and settle
        ``fut`` with the outcome (see :class:`~..server.protocol.OffLoop`)."""
        error: BaseException | None = None
        try:
            await self.backend.run_sync(value.work)
        except BaseException as exc:  # its error, or the loop's teardown cancelling it
            error = exc
        try:
            result = value.finish()
        except BaseException as exc:
            error = error or exc
            result = None
        if isinstance(error, self._cancelled):  # torn down: nobody waits any more
            raise error
        self._settle(fut, stream, mark, result, error)

    def _settle(
        self,
        fut: asyncio.Future[Any],
        stream: StreamId,
        mark: int,
        value: Any,
        error: BaseException | None,
    ) -> None:
        """Settle ``fut``: with the errors held for ``stream`` up to ``mark`` (they
        happened before it, in stream order), its own error attached; else with its own
        error; else with ``value``."""
        if error is not None:  # its traceback holds the frame that caught it, whose
            detach_frames(error)  # locals (``fut``) hold it in turn: a cycle to break
        held = self._held.take(stream, mark) if self._held else None
        if held is not None:
            if error is not None and error is not held:
                combine([held, error], "and then this call itself failed")
            error = held
        if error is None:
            self._pending.discard(fut)
            if not fut.done():
                fut.set_result(value)
            return
        if fut.done():
            self._pending.discard(fut)
            if held is not None:  # nobody will see it there (cancelled): back to the stream
                self._held.restore(stream, held)
            return
        self._fail(fut, error, stream)

    def _fail(
        self, fut: asyncio.Future[Any], exc: BaseException, stream: StreamId | None = None
    ) -> None:
        """Fail ``fut`` with ``exc``; unretrieved, it goes back to ``stream`` (by default
        the calling task's: a fast route fails a future in its caller's task)."""
        if getattr(exc, "sticky", False):
            self._die(exc)
        self._pending.discard(fut)
        if not fut.done():
            detach_frames(exc)  # a traceback's frames would keep the command's buffers
            if hasattr(fut, "_ac_from"):
                fut._ac_stream = StreamId.current() if stream is None else stream  # type: ignore[attr-defined]
            fut.set_exception(exc)
            self._unclaimed.add(fut)


def _owned(owns: Callable[[Any], bool], binding: Any) -> bool:
    try:
        return owns(binding)
    except Exception:  # not a binding at all: the command's own error says so
        return False


def _ids(bindings: Iterable[Any]) -> list[int]:
    return [b.memory.id for b in bindings]
