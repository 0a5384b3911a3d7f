"""Errors of fire-and-forget work, held per logical stream (``StreamId``).

An error in ``execute``/``write``/``create`` work is raised at the next awaited call on
the same *logical* stream, never on another one that happens to share a worker thread,
a device stream slot or a pool index with it. Both servers report errors here with the
failing ``StreamId``: the channel for errors raised while a command is issued, and the
host server's workers for errors raised while the work runs. The store is thread-safe.
"""

from __future__ import annotations

import threading
import traceback

from .stream_id import StreamId

__all__ = ["HeldErrors"]


class HeldErrors:
    """Errors held for each :class:`StreamId` until an awaited command on it takes them."""

    __slots__ = ("_held", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[StreamId, list[BaseException]] = {}

    def __bool__(self) -> bool:
        return bool(self._held)

    def hold(self, stream: StreamId, exc: BaseException) -> None:
        """Keep ``exc`` for the next awaited command on ``stream`` (any thread)."""
        with self._lock:
            self._held.setdefault(stream, []).append(exc)

    def take(self, stream: StreamId) -> BaseException | None:
        """The first error held for ``stream`` (later ones attached as notes), cleared."""
        if not self._held:  # cheap check first: the common case holds nothing
            return None
        with self._lock:
            errors = self._held.pop(stream, None)
        if not errors:
            return None
        first = errors[0]
        for other in errors[1:]:
            first.add_note(f"also failed on {stream}: {type(other).__name__}: {other}")
        return first

    def drain(self) -> list[BaseException]:
        """Every error still held, in stream order, cleared (for ``close()``)."""
        with self._lock:
            held, self._held = self._held, {}
        return [exc for stream in sorted(held) for exc in held[stream]]


def detach_frames(exc: BaseException) -> None:
    """Replace the traceback of ``exc`` (and of its causes) by a note naming where it
    was raised. A traceback keeps each of its frames alive, and through ``f_back`` each
    frame's callers, all with their locals: the arguments of the command that failed,
    whose handles would keep their memory until the error is taken, maybe never (the
    stream of a cancelled task)."""
    seen: set[int] = set()
    error: BaseException | None = exc
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        tb = error.__traceback__
        if tb is not None:
            where = "\n".join(  # no source lines: reading files would block the loop
                f'  File "{frame.f_code.co_filename}", line {line}, in {frame.f_code.co_name}'
                for frame, line in traceback.walk_tb(tb)
            )
            error.add_note(f"raised by a command that was not awaited, at:\n{where}")
            error.__traceback__ = None
        error = error.__cause__ or error.__context__
