"""The life cycle of a client: ``close`` (once; again is a no-op), ``async with``'s exit,
and the ResourceWarning of a client dropped while still open."""

from __future__ import annotations

import asyncio
import sys
import warnings
from collections.abc import Awaitable, Callable
from types import FrameType
from typing import Any

from ..channel.channel import Channel, State
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

    async def close(self, release: Callable[[], None]) -> None:
        """See :meth:`ComputeClient.close`; ``release`` runs first (the client's graphs)."""
        channel = self._channel
        if not self._ended():  # from another loop: refused before any change, so the
            channel.check_loop()  # owner's client stays usable (once ended: a no-op)
        if channel.state is State.OPEN:
            release()
            self._closing = channel.begin_close()
        try:
            if self._closing is not None and not self._closing.done():
                await channel.backend.shield(self._closing)
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
