"""The life cycle of a client: ``close`` (once; again is a no-op; ``cancel_pending`` drops
what is not yet issued, ``abandon_after`` bounds the wait for what is), ``async with``'s exit,
and the ResourceWarning of a client dropped while still open."""

from __future__ import annotations

import asyncio
import sys
import warnings
from collections.abc import Awaitable, Callable
from types import FrameType
from typing import Any

from ..channel.channel import Channel, State
from ..channel.closing import abandon, drop_unissued
from ..errors import InvalidArgument
from .jobs import JobThread

__all__ = ["Lifecycle", "close_within", "warn_unclosed"]


class Lifecycle:
    """A client's close: begun once, then awaited by every ``close()`` call."""

    __slots__ = ("_channel", "_closing", "_jobs", "opened_at")

    def __init__(self, channel: Channel, jobs: JobThread) -> None:
        self._channel = channel
        self._jobs = jobs
        self._closing: asyncio.Future[Any] | None = None
        self.opened_at = _caller()
        """``file:line`` of the user's call that opened the client (for the warning)."""
        # A client dropped unclosed says so itself (``warn_unclosed``), naming where it
        # was opened; asyncio's "Task was destroyed but it is pending!" for its actor
        # (the only way an actor is destroyed pending) would only add noise.
        if hasattr(channel.actor, "_log_destroy_pending"):
            channel.actor._log_destroy_pending = False

    async def close(
        self,
        release: Callable[[], None],
        cancel_pending: bool = False,
        abandon_after: float | None = None,
    ) -> None:
        """See :meth:`ComputeClient.close`; ``release`` runs first (the client's graphs)."""
        check_close_args(cancel_pending, abandon_after)
        channel = self._channel
        if not self._ended():  # from another loop: refused before any change, so the
            channel.check_loop()  # owner's client stays usable (once ended: a no-op)
        if channel.state is State.OPEN:
            release()
            if cancel_pending:
                drop_unissued(channel)
            self._closing = channel.begin_close()
        try:
            closing = self._closing
            if closing is not None and not closing.done() and abandon_after is not None:
                await channel.backend.wait(closing, within=abandon_after)
                if not closing.done():
                    _warn_abandoned(abandon(channel, closing), abandon_after)
                    return  # the actor ends by itself once what holds it ends
            if closing is not None and not closing.done():
                await channel.backend.shield(closing)
            await channel.wait_actor()
        finally:
            self._jobs.close()

    def _ended(self) -> bool:
        """True once the close (or death) is over: nothing left to await."""
        closing = self._closing
        return (
            self._channel.state in (State.CLOSED, State.DEAD)
            and (closing is None or closing.done())
            and self._channel.actor_done()
        )


def check_close_args(cancel_pending: object, abandon_after: object) -> None:
    """Refuse ``close``'s arguments at the call (InvalidArgument) unless valid."""
    if not isinstance(cancel_pending, bool):
        raise InvalidArgument(
            f"close(cancel_pending=...) must be True or False, got {cancel_pending!r}"
        )
    if abandon_after is None:
        return
    number = isinstance(abandon_after, int | float) and not isinstance(abandon_after, bool)
    if not number or not 0 <= abandon_after < float("inf"):  # type: ignore[operator]
        raise InvalidArgument(
            "close(abandon_after=...) must be a number of seconds >= 0 or None, got "
            f"{abandon_after!r}"
        )


def _warn_abandoned(failed: int, seconds: float) -> None:
    warnings.warn(
        f"close(abandon_after={seconds:g}): the work already issued to the device did not "
        f"finish within {seconds:g} s and was abandoned ({failed} awaitable(s) raise "
        "ClientClosedError); the server frees its memory once that work ends",
        RuntimeWarning,
        stacklevel=4,
    )


async def close_within(closing: Awaitable[None], exc: object) -> None:
    """Await ``closing`` at the end of an ``async with`` block that raised ``exc`` (or
    None): the block's own exception propagates, the close error noted on it."""
    try:
        await closing
    except Exception as error:
        if not isinstance(exc, BaseException):
            raise
        exc.add_note(f"closing the client also raised {type(error).__name__}: {error}")


def warn_unclosed(client: object, channel: Channel | None, opened_at: str) -> None:
    """The ResourceWarning of a client collected while its channel is still open (as
    an unclosed file's), naming the client and where it was opened."""
    if channel is not None and channel.state is State.OPEN:
        warnings.warn(
            f"unclosed {client!r} opened at {opened_at}: use `async with open_client() "
            "as client:` or `await client.close()` (in a notebook, close the client "
            "before running `client = await ac.connect()` again)",
            ResourceWarning,
            source=client,
            stacklevel=3,
        )


def _caller() -> str:
    """``file:line`` of the first frame outside asynccube (the user's call)."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if not frame.f_globals.get("__name__", "").startswith("asynccube."):
            return f"{frame.f_code.co_filename}:{frame.f_lineno}"
        frame = frame.f_back
    return "an unknown place"
