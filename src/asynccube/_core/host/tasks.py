"""The tasks the host server queues on its worker threads.

Each wraps a piece of work: ``guarded`` holds its error for the logical stream that
queued it, ``completing`` resolves a completion (or fails it with that stream's held
error), ``recorded`` times it for the timeline.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from ..channel.held import HeldErrors
from ..errors import AsyncCubeError, ExecutionError
from ..profiling.records import KernelRecorder, RecordKind
from ..values.stream_id import StreamId
from .worker import Afterwards, HostCompletion

__all__ = ["completing", "failed", "guarded", "recorded", "wrapped"]

T = TypeVar("T")


def guarded(
    fn: Callable[[], object],
    held: HeldErrors,
    stream: StreamId,
    what: str,
    written: Sequence[int] = (),
    launch: tuple[str, Sequence[int]] | None = None,
) -> Callable[[], None]:
    """``fn`` as a worker task whose error is held for the logical ``stream``; the
    buffers it writes (memory ids ``written``) are tainted if it fails, and their taints
    cleared if it succeeds. Whatever ``fn`` raises, a ``BaseException`` such as
    ``SystemExit`` or ``KeyboardInterrupt`` included, fails the command, never the
    worker thread (see :func:`wrapped`). A kernel's launch (``launch``: its id, and the
    memory ids it binds) is skipped when one of those carries a failure, as it would
    run: ``written`` carry it then (:meth:`~..channel.held.HeldErrors.skip`)."""

    def task() -> None:
        if launch is not None and held._tainted and held.skip(launch[0], launch[1], written):
            return
        try:
            fn()
        except AsyncCubeError as exc:
            failed(held, stream, written, exc)
        except BaseException as exc:
            failed(held, stream, written, wrapped(exc, f"{what} failed on {stream}"))
        else:
            if held._tainted:
                held.clear(written)

    return task


def wrapped(exc: BaseException, what: str) -> ExecutionError:
    """``exc``, raised by user code on a worker thread, as the :class:`ExecutionError`
    that the awaiting call raises (its ``__cause__``: ``exc``). A ``BaseException`` that
    is not an ``Exception`` (``SystemExit``, ``KeyboardInterrupt``, ``GeneratorExit``)
    is wrapped too: raised on the event loop as it is, it would stop the loop (asyncio
    and trio let those through to end the program), although it only ended the kernel;
    a real Ctrl-C or ``sys.exit()`` reaches the main thread, never a worker."""
    err = ExecutionError(f"{what}: {type(exc).__name__}: {exc}")
    if not isinstance(exc, Exception):
        err.add_note(
            f"{type(exc).__name__} is a BaseException; raised by host code in a worker "
            "thread, it fails only that command (the worker goes on): see the errors guide"
        )
    err.__cause__ = exc
    return err


def failed(held: HeldErrors, stream: StreamId, written: Sequence[int], exc: BaseException) -> None:
    """Hold ``exc`` for ``stream`` and taint the buffers ``written``."""
    held.hold(stream, exc)
    held.taint(written, exc)


def completing(
    done: HostCompletion[T],
    fn: Callable[[], T],
    held: HeldErrors,
    read: Sequence[int] = (),
) -> Callable[[], Afterwards]:
    """A worker task completing ``done`` with ``fn()``; it fails with
    :class:`~..errors.TaintedBuffer` if a buffer it reads (memory ids ``read``) was last
    written by a failed command. ``done.held_mark`` tells which errors were held for its
    stream by then: the channel raises those with it. ``done`` is settled once the
    worker counts the task finished (:class:`~.worker.Afterwards`)."""

    def run() -> Afterwards:
        done.held_mark = held.mark()
        error = held.check(read) if read else None
        if error is not None:
            return Afterwards(done.set_error, error)
        try:
            value = fn()
        except BaseException as exc:
            return Afterwards(done.set_error, exc)
        return Afterwards(done.set_result, value)

    return run


def recorded(
    fn: Callable[[], T],
    recorder: KernelRecorder,
    name: str,
    stream: int,
    kind: RecordKind,
    nbytes: int | None,
) -> Callable[[], T]:
    """``fn`` wrapped to record when it was queued, started and ended."""
    queued = time.perf_counter_ns()

    def timed() -> T:
        start = time.perf_counter_ns()
        try:
            return fn()
        finally:
            recorder.record(name, stream, kind, queued, start, time.perf_counter_ns(), nbytes)

    return timed
