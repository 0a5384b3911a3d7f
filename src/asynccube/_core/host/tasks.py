"""The tasks the host server queues on its worker threads.

Each wraps a piece of work: ``guarded`` holds its error for the logical stream that
queued it, ``completing`` resolves a completion (or fails it with that stream's held
error), ``recorded`` times it for the timeline; ``CloseState`` counts workers exiting.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from ..channel.held import HeldErrors
from ..errors import AsyncCubeError, ExecutionError
from ..profiling.records import KernelRecorder, RecordKind
from ..values.stream_id import StreamId
from .worker import HostCompletion

__all__ = ["CloseState", "completing", "failed", "guarded", "read_count", "recorded"]

T = TypeVar("T")


def guarded(
    fn: Callable[[], object],
    held: HeldErrors,
    stream: StreamId,
    what: str,
    written: Sequence[int] = (),
) -> Callable[[], None]:
    """``fn`` as a worker task whose error is held for the logical ``stream``; the
    buffers it writes (memory ids ``written``) are tainted if it fails, and their taints
    cleared if it succeeds."""

    def task() -> None:
        try:
            fn()
        except AsyncCubeError as exc:
            failed(held, stream, written, exc)
        except Exception as exc:
            err = ExecutionError(f"{what} failed on {stream}: {type(exc).__name__}: {exc}")
            err.__cause__ = exc
            failed(held, stream, written, err)
        else:
            if held._tainted:
                held.clear(written)

    return task


def failed(held: HeldErrors, stream: StreamId, written: Sequence[int], exc: BaseException) -> None:
    """Hold ``exc`` for ``stream`` and taint the buffers ``written``."""
    held.hold(stream, exc)
    held.taint(written, exc)


def completing(
    done: HostCompletion[T],
    fn: Callable[[], T],
    held: HeldErrors,
    read: Sequence[int] = (),
) -> Callable[[], None]:
    """A worker task completing ``done`` with ``fn()``; it fails with
    :class:`~..errors.TaintedBuffer` if a buffer it reads (memory ids ``read``) was last
    written by a failed command. ``done.held_mark`` tells which errors were held for its
    stream by then: the channel raises those with it."""

    def run() -> None:
        done.held_mark = held.mark()
        error = held.check(read) if read else None
        if error is not None:
            done.set_error(error)
            return
        try:
            done.set_result(fn())
        except BaseException as exc:
            done.set_error(exc)

    return run


class CloseState:
    """Counts workers still running at close and the errors they held."""

    __slots__ = ("errors", "lock", "remaining")

    def __init__(self, workers: int) -> None:
        self.remaining = workers
        self.errors: list[BaseException] = []
        self.lock = threading.Lock()

    def exited(self, error: BaseException | None) -> bool:
        """Record one worker's exit; True for the last."""
        with self.lock:
            if error is not None:
                self.errors.append(error)
            self.remaining -= 1
            return self.remaining == 0


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


def read_count(view: npt.NDArray[np.uint8]) -> tuple[int, int, int]:
    """A dynamic cube count: the ``uint32`` triple at the start of ``view``."""
    x, y, z = (int(v) for v in view[:12].view(np.uint32))
    return x, y, z
