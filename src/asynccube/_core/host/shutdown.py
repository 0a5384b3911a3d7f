"""The host server's close: every worker thread finishes its queued tasks and exits,
then the server frees its memory; errors nobody awaited (held by the workers or for a
stream) fail the close's completion, so they are not lost."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence

from .worker import HostCompletion, HostStream

__all__ = ["CloseState", "close_workers"]


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


Free = Callable[[], list[BaseException]]
"""Frees the server's memory once its workers have exited; returns the errors still
held for its streams."""


def close_workers(workers: Sequence[HostStream], free: Free) -> HostCompletion[None]:
    """Stop ``workers`` (each after its queued tasks); once the last has exited, call
    ``free`` and complete, failing with the first error of any (the others noted)."""
    done: HostCompletion[None] = HostCompletion()
    state = CloseState(len(workers))
    for worker in workers:
        worker.stop(functools.partial(_worker_exited, worker, state, done, free))
    if not workers:
        _finish_close(state, done, free)
    return done


def _worker_exited(
    worker: HostStream, state: CloseState, done: HostCompletion[None], free: Free
) -> None:
    if state.exited(worker.take_error()):
        _finish_close(state, done, free)


def _finish_close(state: CloseState, done: HostCompletion[None], free: Free) -> None:
    errors = state.errors + free()  # work nobody awaited
    if errors:
        first = errors[0]
        for other in errors[1:]:
            first.add_note(f"also unobserved at close: {type(other).__name__}: {other}")
        done.set_error(first)
    else:
        done.set_result(None)
