"""The host server's profiles: wall-clock timestamps taken once all queued work is done,
and the duration between two of them."""

from __future__ import annotations

import time

from ..values.types import ProfileDuration, TimingMethod
from .worker import HostCompletion

__all__ = ["duration", "timestamp"]


def timestamp(barrier: HostCompletion[None]) -> HostCompletion[int]:
    """The clock (``perf_counter_ns``) once ``barrier`` (a sync) completes, or its error."""
    stamp: HostCompletion[int] = HostCompletion()

    def take() -> None:
        try:
            barrier.result()
            stamp.set_result(time.perf_counter_ns())
        except BaseException as exc:
            stamp.set_error(exc)

    barrier.add_done_callback(take)
    return stamp


def duration(
    start: HostCompletion[int], end: HostCompletion[int]
) -> HostCompletion[ProfileDuration]:
    """The profile from ``start`` to ``end`` once both are taken (or the first error)."""
    done: HostCompletion[ProfileDuration] = HostCompletion()

    def finish() -> None:
        try:
            done.set_result(ProfileDuration(start.result(), end.result(), TimingMethod.FULL))
        except BaseException as exc:
            done.set_error(exc)

    end.add_done_callback(finish)
    return done
