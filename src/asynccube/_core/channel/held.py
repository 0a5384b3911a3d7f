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

Taints: a failed command marks the buffers it would have written (``taint``): they carry
its failure. A launch binding a buffer that carries one is skipped, and the buffers it
would have written carry the same failure, with a skip record (``skip``: cubecl-runtime's
``ErrorGraph``). A read of a carrier raises the root error's type, also a
:class:`~.errors.TaintedBuffer`, naming the root and the skipped kernels from it to that
buffer (``check``), on any stream and any number of times, until a later successful write
clears it (``clear``). A failure's record is counted by the buffers carrying it and
freed with the last (``forget``, ``clear``).
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Iterable

from ..errors import TaintedBuffer, carried_error
from ..values.stream_id import StreamId

__all__ = ["SKIP_RECORDS", "Failure", "HeldErrors", "combine", "detach_frames"]

_SEQ = "_asynccube_seq"
"""The attribute of a held error that keeps its sequence number."""


class HeldErrors:
    """Errors held for each :class:`StreamId` until an awaited command on it takes them,
    and the buffers (memory ids) that failed commands left tainted."""

    __slots__ = ("_failures", "_held", "_lock", "_seq", "_tainted")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[StreamId, list[BaseException]] = {}
        self._seq = 0
        self._tainted: dict[int, tuple[Failure, int]] = {}
        """Memory id -> the failure it carries, and the skip record it got it from (0:
        the failed command wrote it); read by the compiled hot path: a non-empty dict
        makes its routes decline, so the Python route applies the rules."""
        self._failures = 0
        """How many :class:`Failure` records some buffer carries."""

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
        ``error`` (any thread, in the order the commands ran): they carry a new failure."""
        failure = Failure(error)
        with self._lock:
            for memory_id in ids:
                self._carry(memory_id, failure, 0)

    def skip(self, kernel: str, bound: Iterable[int], written: Iterable[int]) -> bool:
        """Whether a launch of ``kernel`` binding the buffers ``bound`` must be skipped:
        one of them carries a failure. Then the buffers ``written`` carry it too, with a
        skip record (one that carries a failure already keeps its own: the launch did
        not change its bytes), and the launch must not run (any thread, in the order the commands
        run; callers test ``_tainted`` first: with nothing tainted, nothing to do)."""
        with self._lock:
            tainted = self._tainted
            for memory_id in bound:
                carried = tainted.get(memory_id)
                if carried is not None:
                    break
            else:
                return False
            targets = [t for t in written if t not in tainted]  # the others keep theirs
            if targets:
                failure, parent = carried
                record = failure.record(kernel, memory_id, parent)
                for target in targets:
                    self._carry(target, failure, record)
        return True

    def clear(self, ids: Iterable[int]) -> None:
        """The buffers ``ids`` were written by a command that succeeded."""
        if self._tainted:
            with self._lock:
                for memory_id in ids:
                    self._drop(memory_id)

    def forget(self, memory_id: int) -> None:
        """The buffer ``memory_id`` is gone (its last handle was dropped)."""
        if self._tainted:
            with self._lock:
                self._drop(memory_id)

    def check(self, ids: Iterable[int]) -> TaintedBuffer | None:
        """The error a read of the buffers ``ids`` raises if one of them carries a
        failure: of the root error's type (and :class:`TaintedBuffer`), naming the root
        and the skipped kernels from it to that buffer, in order."""
        tainted = self._tainted
        if not tainted:
            return None
        with self._lock:  # a worker may be adding to the failure's skip records
            for memory_id in ids:
                carried = tainted.get(memory_id)
                if carried is not None:
                    failure, record = carried
                    return carried_error(failure.kind, failure.describe(memory_id, record))
        return None

    def failures(self) -> int:
        """How many failures are held: each lives while some buffer carries it."""
        return self._failures

    def _carry(self, memory_id: int, failure: Failure, record: int) -> None:
        """``memory_id`` carries ``failure`` from now on (under the lock)."""
        self._drop(memory_id)  # first: ``failure`` is a new one, or carried elsewhere
        if not failure.carriers:
            self._failures += 1
        failure.carriers += 1
        self._tainted[memory_id] = (failure, record)

    def _drop(self, memory_id: int) -> None:
        """``memory_id`` carries no failure any more; a failure nothing carries is
        freed (under the lock)."""
        carried = self._tainted.pop(memory_id, None)
        if carried is not None:
            failure = carried[0]
            failure.carriers -= 1
            if not failure.carriers:
                self._failures -= 1
                failure.records.clear()


SKIP_RECORDS = 16
"""The newest skip records a failure keeps (as cubecl-runtime's ``ErrorGraph``)."""


class Failure:
    """The record of one failed command, shared by every buffer that carries it: the
    root error's type and text (not the error: it is raised on its own stream, and its
    frames would keep their buffers alive), and the newest :data:`SKIP_RECORDS` launches
    skipped because of it. ``carriers``: how many buffers carry it (the record lives
    exactly as long as one does)."""

    __slots__ = ("carriers", "dropped", "kind", "last", "records", "why")

    def __init__(self, error: BaseException) -> None:
        first = str(error).splitlines()[0] if str(error) else ""
        self.kind = type(error)
        self.why = f"{type(error).__name__}: {first}"
        self.carriers = 0
        self.dropped = 0
        self.last = 0
        self.records: dict[int, tuple[str, int, int]] = {}
        """Skip record number -> (kernel id, the memory it needed, which carried this
        failure; the record that memory got it from, 0: the failed command itself)."""

    def record(self, kernel: str, memory_id: int, parent: int) -> int:
        """A new skip record: ``kernel`` skipped, it needed ``memory_id`` (which got
        this failure from record ``parent``); past the limit the oldest is dropped."""
        self.last += 1
        records = self.records
        records[self.last] = (kernel, memory_id, parent)
        if len(records) > SKIP_RECORDS:
            del records[next(iter(records))]
            self.dropped += 1
        return self.last

    def describe(self, memory_id: int, record: int) -> str:
        """What a read of ``memory_id`` (which got this failure from ``record``) says:
        the root, and the skipped kernels from it to that buffer, in order."""
        path: list[str] = []
        while record:
            step = self.records.get(record)
            if step is None:
                path.append(
                    f"... ({self.dropped} older skip records of this failure dropped: "
                    f"the newest {SKIP_RECORDS} are kept)"
                )
                break
            kernel, needed, record = step
            path.append(f"skipped `{kernel}`: it needed memory {needed}, which carried the failure")
        fix = (
            "Write it again (client.write) before reading it or binding it to a launch "
            "(a launch binding it is skipped)"
        )
        if not path:
            return (
                f"buffer {memory_id} was last written by a command that failed ({self.why}); "
                f"its bytes are not what any successful command wrote. {fix}"
            )
        return (
            f"buffer {memory_id} carries the failure of a command that failed ({self.why}): "
            f"{'; '.join(reversed(path))}. Its bytes are not what any successful command "
            f"wrote. {fix}"
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
