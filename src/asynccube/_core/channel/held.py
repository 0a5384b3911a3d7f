"""Errors of work, held per logical stream (``StreamId``), and the buffers they taint.

An error in ``execute``/``write``/``create`` work is raised at the next awaited call on
the same *logical* stream, never on another one that happens to share a worker thread,
a device stream slot or a pool index with it. Both servers report errors here with the
failing ``StreamId``: the channel for errors raised while a command is issued, and the
host server's workers for errors raised while the work runs. The store is thread-safe.

Order: every held error gets a sequence number (``mark()`` reads the last one given), so
an awaited command takes exactly the errors held before its own point in the stream
(``take(stream, upto)``), and an error given back by an awaitable nobody awaited
(``restore``) goes back to its place, to be raised by the next awaited call there.

Taints: a failed command marks the buffers it would have written (``taint``); a read of
one raises :class:`~.errors.TaintedBuffer` naming the failure (``check``), on any stream
and any number of times, until a later successful write clears it (``clear``).
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Iterable

from ..errors import TaintedBuffer
from ..values.stream_id import StreamId

__all__ = ["HeldErrors", "combine", "detach_frames"]

_SEQ = "_asynccube_seq"
"""The attribute of a held error that keeps its sequence number."""


class HeldErrors:
    """Errors held for each :class:`StreamId` until an awaited command on it takes them,
    and the buffers (memory ids) that failed commands left tainted."""

    __slots__ = ("_held", "_lock", "_seq", "_tainted")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[StreamId, list[BaseException]] = {}
        self._seq = 0
        self._tainted: dict[int, str] = {}
        """Memory id -> what failed in the command that last wrote it (a string: the
        error itself gets the frames of whoever it is raised to; read by the compiled
        hot path: a non-empty dict makes its routes decline)."""

    def __bool__(self) -> bool:
        return bool(self._held)

    def mark(self) -> int:
        """The sequence number of the last error held so far (any thread)."""
        return self._seq

    def hold(self, stream: StreamId, exc: BaseException) -> None:
        """Keep ``exc`` for the next awaited command on ``stream`` (any thread). It keeps
        no frames (see :func:`detach_frames`)."""
        detach_frames(exc, "raised by a command that was not awaited")
        with self._lock:
            self._seq += 1
            setattr(exc, _SEQ, self._seq)
            self._held.setdefault(stream, []).append(exc)

    def restore(self, stream: StreamId, exc: BaseException) -> None:
        """Give ``exc`` back to ``stream`` (an awaitable that carried it was dropped
        unawaited): held again in its place, or last if it never was."""
        detach_frames(exc, "raised by a call whose result was never awaited")
        with self._lock:
            seq = getattr(exc, _SEQ, None)
            if seq is None:
                self._seq += 1
                seq = self._seq
                setattr(exc, _SEQ, seq)
            errors = self._held.setdefault(stream, [])
            at = len(errors)
            while at and getattr(errors[at - 1], _SEQ, 0) > seq:
                at -= 1
            errors.insert(at, exc)

    def take(self, stream: StreamId, upto: int | None = None) -> BaseException | None:
        """Every error held for ``stream`` (up to sequence ``upto``), cleared, as one:
        the first, the later ones attached (see :func:`combine`)."""
        if not self._held:  # cheap check first: the common case holds nothing
            return None
        with self._lock:
            errors = self._held.get(stream)
            if not errors:
                return None
            if upto is None or getattr(errors[-1], _SEQ, 0) <= upto:
                del self._held[stream]
                taken = errors
            else:
                taken = [e for e in errors if getattr(e, _SEQ, 0) <= upto]
                errors[:] = [e for e in errors if getattr(e, _SEQ, 0) > upto]
        return combine(taken, f"also failed on {stream}") if taken else None

    def drain(self) -> list[BaseException]:
        """Every error still held, in stream order, cleared (for ``close()``)."""
        with self._lock:
            held, self._held = self._held, {}
        return [exc for stream in sorted(held) for exc in held[stream]]

    # -- taints -------------------------------------------------------------------------

    def taint(self, ids: Iterable[int], error: BaseException) -> None:
        """Mark the buffers ``ids`` as last written by a command that failed with
        ``error`` (any thread, in the order the commands ran)."""
        first = str(error).splitlines()[0] if str(error) else ""
        why = f"{type(error).__name__}: {first}"
        tainted = self._tainted
        for memory_id in ids:
            tainted[memory_id] = why

    def clear(self, ids: Iterable[int]) -> None:
        """The buffers ``ids`` were written by a command that succeeded."""
        tainted = self._tainted
        if tainted:
            for memory_id in ids:
                tainted.pop(memory_id, None)

    def forget(self, memory_id: int) -> None:
        """The buffer ``memory_id`` is gone (its last handle was dropped)."""
        if self._tainted:
            self._tainted.pop(memory_id, None)

    def check(self, ids: Iterable[int]) -> TaintedBuffer | None:
        """A :class:`TaintedBuffer` error if one of the buffers ``ids`` is tainted."""
        tainted = self._tainted
        if not tainted:
            return None
        for memory_id in ids:
            error = tainted.get(memory_id)
            if error is not None:
                return _tainted_error(memory_id, error)
        return None


def _tainted_error(memory_id: int, why: str) -> TaintedBuffer:
    return TaintedBuffer(
        f"buffer {memory_id} was last written by a command that failed ({why}); its "
        "bytes are not what any successful command wrote. Write it again (client.write, "
        "or a kernel that succeeds) before reading it"
    )


def combine(errors: list[BaseException], why: str) -> BaseException:
    """The first of ``errors``, with each later one attached as a note (``why``: how
    they relate) and listed in its ``__notes__``; the order is the order they occurred."""
    first = errors[0]
    for other in errors[1:]:
        first.add_note(f"{why}: {type(other).__name__}: {other}")
    return first


def detach_frames(exc: BaseException, why: str = "raised") -> None:
    """Replace the traceback of ``exc`` (and of its causes) by a note naming where it
    was raised. A traceback keeps each of its frames alive, and through ``f_back`` each
    frame's callers, all with their locals: the arguments of the command that failed,
    whose handles would keep their memory until the error is taken, maybe never (the
    stream of a cancelled task), or until the garbage collector breaks the cycle that a
    frame holding its own error makes."""
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
            error.add_note(f"{why}, at:\n{where}")
            error.__traceback__ = None
        error = error.__cause__ or error.__context__
