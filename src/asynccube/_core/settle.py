"""How a channel's commands settle (the base of :class:`~.channel.Channel`).

A fire-and-forget command's error is held for its stream (``fire``, ``hold``) and
raised by the next awaited command there (``take_held``). An awaited command's future
(``request``) is resolved from a server ``Completion`` through the completion watcher
(``await_completion``) or from a value (``call``); the channel keeps every future not
settled yet in ``_pending``, to fail them all at once if its actor dies.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from .completion import CompletionWatcher
from .errors import AsyncCubeError, Unknown
from .held import HeldErrors, detach_frames
from .server import Completion
from .stream_id import StreamId

__all__ = ["PRUNE_AT", "Op", "Settling"]

Op = Callable[..., Awaitable[None] | None]
PRUNE_AT = 256
"""Pending futures past which the settled ones are pruned in bulk (then twice as many)."""


class Settling:
    """The settling half of :class:`~.channel.Channel` (see above): the futures not
    settled yet are its own; the channel holds the rest of the state and runs the
    commands (``send``, ``_die``)."""

    __slots__ = ("_pending", "_prune_at")
    _pending: set[asyncio.Future[Any]]
    """Awaitables not settled yet (see ``Channel.__init__``)."""
    _prune_at: int
    loop: asyncio.AbstractEventLoop
    watcher: CompletionWatcher
    _held: HeldErrors
    _wakeup: asyncio.Future[None] | None

    def send(self, op: Op, *args: Any) -> None:
        """Run or queue a command (the channel's)."""
        raise NotImplementedError

    def _die(self, exc: BaseException) -> None:
        raise NotImplementedError

    def request(self, op: Op, *args: Any) -> asyncio.Future[Any]:
        """Queue a command whose last argument is the future it resolves; return it."""
        fut: asyncio.Future[Any] = self.loop.create_future()
        pending = self._pending
        if len(pending) >= self._prune_at:
            pending.difference_update([f for f in pending if f.done()])
            self._prune_at = max(PRUNE_AT, 2 * len(pending))
        pending.add(fut)
        self.send(op, *args, fut)
        return fut

    def track(self, fut: asyncio.Future[Any]) -> None:
        """Fail ``fut`` at once if the actor dies before settling it (a future that a
        command of this channel sets and another client's command awaits)."""
        self._pending.add(fut)

    def fire(self, stream: StreamId, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args, stream)``; hold any error for ``stream``."""
        try:
            fn(*args, stream)
        except BaseException as exc:
            self.hold(stream, exc)

    def hold(self, stream: StreamId, exc: BaseException) -> None:
        """Keep ``exc`` for the next awaited command on ``stream`` (or die if sticky).

        A held error keeps no frames: its traceback becomes a note naming where it was
        raised (see :func:`.held.detach_frames`).
        """
        if getattr(exc, "sticky", False):
            self._die(exc)
            return
        detach_frames(exc)
        if not isinstance(exc, AsyncCubeError):
            wrapped = Unknown(f"{type(exc).__name__}: {exc}")
            wrapped.__cause__ = exc
            exc = wrapped
        self._held.hold(stream, exc)

    def take_held(self, stream: StreamId) -> BaseException | None:
        """The first error held for ``stream`` (later ones as notes), cleared."""
        return self._held.take(stream)

    def await_completion(
        self,
        stream: StreamId,
        fn: Callable[..., Completion[Any]],
        *args: Any,
    ) -> None:
        """Run ``fn(*args[:-1], stream)`` and resolve the future ``args[-1]`` from it."""
        *call_args, fut = args
        if fut.done():
            self._pending.discard(fut)
            return
        held = self.take_held(stream)
        if held is not None:
            self._fail(fut, held)
            return
        try:
            completion = fn(*call_args, stream)
        except BaseException as exc:
            self._fail(fut, exc)
            return
        # A caller running this inline awaits it next: worth a short spin (the watcher's).
        inline = self._wakeup is not None
        self.watcher.watch(completion, lambda c: self._resolve(fut, c), inline)

    def call(self, stream: StreamId, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args[:-1], stream)`` and resolve the future ``args[-1]`` with it."""
        *call_args, fut = args
        if fut.done():
            self._pending.discard(fut)
            return
        held = self.take_held(stream)
        if held is not None:
            self._fail(fut, held)
            return
        try:
            value = fn(*call_args, stream)
        except BaseException as exc:
            self._fail(fut, exc)
            return
        self._pending.discard(fut)
        fut.set_result(value)

    def _resolve(self, fut: asyncio.Future[Any], completion: Completion[Any]) -> None:
        try:
            value = completion.result()
        except BaseException as exc:
            if fut.done():
                self._pending.discard(fut)
            else:
                self._fail(fut, exc)
            return
        self._pending.discard(fut)
        if not fut.done():
            fut.set_result(value)

    def _fail(self, fut: asyncio.Future[Any], exc: BaseException) -> None:
        if getattr(exc, "sticky", False):
            self._die(exc)
        self._pending.discard(fut)
        if not fut.done():
            fut.set_exception(exc)
