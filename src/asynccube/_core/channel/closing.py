"""How a channel ends (the states of :class:`~.channel.Channel`, its close and its
death), as functions over the channel, which keeps thin methods for them.

``close`` refuses new commands and queues the server's close after what is queued;
once the server has closed, the close's future raises every error nobody awaited
(combined). ``close(cancel_pending=True)`` first drops the commands not yet issued to
the server (:func:`drop_unissued`); a close past its ``abandon_after`` stops waiting
for the server (:func:`abandon`). A death (a command raised, the actor was cancelled)
fails every pending awaitable at once, drops what is queued and closes the server."""

from __future__ import annotations

import asyncio
import enum
import weakref
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from ..errors import AsyncCubeError, ClientClosedError
from ..server.protocol import Completion
from .completion import CompletionWatcher
from .held import HeldErrors, combine, detach_frames
from .settle import Op

__all__ = ["Ending", "State", "abandon", "awaited", "begin_close", "die", "drop_unissued"]


class State(enum.Enum):
    """Life cycle of a channel."""

    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"
    DEAD = "dead"


def awaited(pending: Awaitable[None]) -> Awaitable[None]:
    """A queued command that is an awaitable already started inline."""
    return pending


class Ending(Protocol):
    """What the close and death see of a channel (it imports them: no circle)."""

    state: State
    server: Any
    loop: asyncio.AbstractEventLoop
    watcher: CompletionWatcher
    _stop: bool
    _death: BaseException | None
    _cancelled: tuple[type[BaseException], ...]
    _close_fut: asyncio.Future[Any] | None
    _queue: deque[tuple[Op, tuple[Any, ...]]]
    _wakeup: asyncio.Future[None] | None
    _pending: set[asyncio.Future[Any]]
    _unclaimed: weakref.WeakSet[asyncio.Future[Any]]
    _held: HeldErrors
    _activate: Callable[[], None] | None

    def send(self, op: Op, *args: Any) -> None:
        """Run or queue a command."""
        ...

    def _unusable(self) -> AsyncCubeError:
        """The error a call on the closed or dead channel raises."""
        ...


def begin_close(channel: Ending) -> asyncio.Future[Any]:
    """Refuse new commands; queue the close after what is already queued."""
    channel.state = State.CLOSING
    fut: asyncio.Future[Any] = channel.loop.create_future()  # the client's own: plain
    channel._pending.add(fut)
    channel._close_fut = fut
    channel.send(_close, channel, fut)
    return fut


def _close(channel: Ending, fut: asyncio.Future[Any]) -> None:
    channel._stop = True
    try:
        completion = channel.server.close()
    except BaseException as exc:
        _closed(channel, fut, exc)
        return
    channel.watcher.watch(completion, lambda c: _closed(channel, fut, _error_of(c)))


def _closed(channel: Ending, fut: asyncio.Future[Any], error: BaseException | None) -> None:
    channel.state = State.CLOSED
    channel.watcher.shutdown()
    _finish_close(channel, fut, error)


def _finish_close(channel: Ending, fut: asyncio.Future[Any], error: BaseException | None) -> None:
    """Settle the close's future: with every error nobody awaited (``error``, the
    server's close's, first), or None."""
    leftovers = _unretrieved(channel) + channel._held.drain()
    if error is not None:
        detach_frames(error)  # the server's close's own: its frames would keep the server
        leftovers.insert(0, error)
    channel._pending.discard(fut)
    if fut.done():  # the close was cancelled: report them to the loop, not lose them
        for exc in leftovers:
            channel.loop.call_exception_handler(
                {"message": "asynccube: an error nobody awaited, at close", "exception": exc}
            )
        return
    if leftovers:
        fut.set_exception(combine(leftovers, "also unobserved at close"))
    else:
        fut.set_result(None)


def _unretrieved(channel: Ending) -> list[BaseException]:
    """The errors of failed awaitables still alive that nobody retrieved (claimed
    now: they are raised by ``close()``, and not given back when dropped)."""
    errors = []
    for fut in list(channel._unclaimed):
        if fut.done() and not fut.cancelled() and fut._log_traceback:
            error = fut.exception()
            if error is not None:
                errors.append(error)
    channel._unclaimed.clear()
    return errors


def die(channel: Ending, exc: BaseException) -> None:
    """End the channel with ``exc`` (once): fail every pending awaitable, drop what is
    queued, stop the actor and close the server."""
    if channel.state is State.DEAD:
        return
    channel._death = exc
    channel.state = State.DEAD
    channel._stop = True
    for op, args in channel._queue:
        if op is awaited:
            args[0].close()  # a started-inline command that will never run
    channel._queue.clear()
    wakeup, channel._wakeup = channel._wakeup, None
    if wakeup is not None and not wakeup.done():
        wakeup.set_result(None)  # the sleeping actor sees _stop and ends
    # Cancelled while closing (the loop's teardown, a second Ctrl-C): the close asked
    # for is done by the death (the server is closed below), so it does not fail.
    closing = channel._close_fut if isinstance(exc, channel._cancelled) else None
    error = channel._unusable()
    for fut in list(channel._pending):
        if not fut.done() and fut is not closing:
            fut.set_exception(error)
    channel._pending.clear()
    channel.watcher.shutdown()
    _shutdown_server(channel)
    if closing is not None:
        _finish_close(channel, closing, None)


def _shutdown_server(channel: Ending) -> None:
    try:
        if channel._activate is not None:
            channel._activate()
        channel.server.close()
    except BaseException as exc:  # the server is broken; the death cause is kept
        if channel._death is not None:
            channel._death.add_note(f"closing the server after death also failed: {exc!r}")


def _error_of(completion: Completion[Any]) -> BaseException | None:
    try:
        completion.result()
    except BaseException as exc:
        return exc
    return None


def drop_unissued(channel: Ending) -> int:
    """Drop the commands still queued, not yet issued to the server (a command under
    way, awaiting a compile or a job, is left to finish); the awaitables they would have
    settled raise :class:`~asynccube.ClientClosedError`, and an argument with an
    ``on_dropped(channel)`` method (a command whose other half waits on another
    client's channel) is told. Returns how many were dropped."""
    kept: list[tuple[Op, tuple[Any, ...]]] = []
    dropped = 0
    for op, args in channel._queue:
        if op is awaited:
            kept.append((op, args))
            continue
        dropped += 1
        for arg in args:
            if isinstance(arg, asyncio.Future) and arg in channel._pending and not arg.done():
                channel._pending.discard(arg)
                arg.set_exception(
                    ClientClosedError("dropped at close(cancel_pending=True): never issued")
                )
            elif hasattr(arg, "on_dropped"):  # a command shared with another client's
                arg.on_dropped(channel)  # (to_client's copy): the other side is told
    channel._queue.clear()
    channel._queue.extend(kept)
    return dropped


def abandon(channel: Ending, closing: asyncio.Future[Any]) -> int:
    """Stop waiting for the server's close (its ``abandon_after`` passed): every awaitable
    still pending raises :class:`~asynccube.ClientClosedError`, and the client is
    closed. The server's close goes on by itself and frees its memory once the work
    already issued ends; if the close command has not run yet (a command under way
    holds the queue), the server is closed now. Returns the awaitables failed."""
    channel.state = State.CLOSED
    failed = 0
    for fut in list(channel._pending):
        if fut is not closing and not fut.done():
            error = ClientClosedError("abandoned at close: not done within abandon_after")
            fut.set_exception(error)
            failed += 1
    channel._pending.clear()
    if not channel._stop:  # the close command never ran: nothing would close the server
        channel._stop = True
        channel._queue.clear()
        wakeup, channel._wakeup = channel._wakeup, None
        if wakeup is not None and not wakeup.done():
            wakeup.set_result(None)
        _shutdown_server(channel)
    if not closing.done():
        closing.set_result(None)  # the server's own end reports to the loop, if any
    return failed
