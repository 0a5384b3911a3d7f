"""Profiling on the CUDA server: kernels and copies timed by CUDA events around them
(a :class:`~asynccube._core.profiling.records.KernelRecorder`), and device-timed profiles
(``start_profile``/``end_profile``) against an epoch event recorded when the server opened.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ..errors import ProfileError
from ..profiling.records import KernelRecord, RecordKind
from ..values.stream_id import StreamId
from ..values.types import ProfileDuration, ProfilingToken, TimingMethod
from .completion import CudaCompletion
from .driver import check, cu
from .native.hotpath import hot
from .state import ServerCore

__all__ = ["ProfileOps", "TimedOp"]


@dataclass(frozen=True, slots=True)
class TimedOp:
    """A recorded operation whose events the device may not have reached yet."""

    name: str
    stream: int
    kind: RecordKind
    queued: int
    start: Any
    end: Any
    nbytes: int | None


class ProfileOps(ServerCore):
    """Profiling commands and the recording of timed operations."""

    def _epoch(self) -> tuple[Any, int]:
        stream = self._streams.gc_stream()
        event = self._timing.record(stream)
        check(cu().cuEventSynchronize(event), "cuEventSynchronize(epoch)")
        return event, time.perf_counter_ns()

    # -- profiling ------------------------------------------------------------------

    def _mark(self, cu_stream: Any) -> tuple[int, Any]:
        """When an operation was queued, and an event recorded just before it."""
        return time.perf_counter_ns(), self._timing.record(cu_stream)

    def _timed_op(
        self,
        mark: tuple[int, Any],
        cu_stream: Any,
        name: str,
        stream: StreamId,
        kind: RecordKind,
        nbytes: int | None,
    ) -> None:
        queued, start = mark
        end = self._timing.record(cu_stream)
        self._timed.append(TimedOp(name, stream.value, kind, queued, start, end, nbytes))

    def kernel_records(self, stream: StreamId) -> list[KernelRecord]:
        """Kernels and copies recorded so far, timed by their CUDA events (those whose
        events the device has not reached yet are added on a later call)."""
        query = hot.event_query
        while self._timed and query(self._timed[0].end) == 0:
            op = self._timed.popleft()
            start, end = self._since_epoch(op.start), self._since_epoch(op.end)
            self._timing.give(op.start)
            self._timing.give(op.end)
            self.recorder.record(
                op.name, op.stream, op.kind, min(op.queued, start), start, end, op.nbytes
            )
        return self.recorder.records()

    def _barrier(self, stream: StreamId) -> Any:
        """The stream's CUDA stream, made to wait for all work queued on the others."""
        current = self._streams.streams.get(stream)
        for _, wrapper in self._streams.streams.existing():
            if wrapper is not current:
                self._backend.wait_event(current.stream, self._backend.flush(wrapper.stream))
        return current.stream

    def start_profile(self, stream: StreamId) -> ProfilingToken:
        """Start a device-timed profile (after all work queued so far)."""
        token = ProfilingToken(next(self._tokens))
        self._profiles[token.id] = self._timing.record(self._barrier(stream))
        return token

    def end_profile(self, stream: StreamId, token: ProfilingToken) -> CudaCompletion[Any]:
        """End the profile once all work queued so far is done; timed by CUDA events."""
        start = self._profiles.pop(token.id, None)
        if start is None:
            raise ProfileError(f"{token} was never started or has already ended")
        current = self._barrier(stream)
        end = self._timing.record(current)

        def finish() -> ProfileDuration:
            t0 = self._since_epoch(start)
            t1 = self._since_epoch(end)
            self._timing.give(start)
            self._timing.give(end)
            return ProfileDuration(t0, max(t0, t1), TimingMethod.DEVICE)

        done: CudaCompletion[ProfileDuration] = CudaCompletion(
            [end], finish, None, self._notifier, current, self._ctx.context,
            on_error=self._note_error,
        )  # fmt: skip
        return done

    def _since_epoch(self, event: Any) -> int:
        ms = check(cu().cuEventElapsedTime(self._epoch_event, event), "cuEventElapsedTime")
        return self._epoch_ns + round(float(ms) * 1e6)
