"""CUDA side of ``client.wait(obj)`` / ``client.after(obj)``: another library's stream
or event, waited on without a host round trip and without blocking the loop.

* ``capture_foreign`` runs at the call, on the loop thread, before anything is queued.
  It refuses (:class:`~asynccube.ForeignStreamError`, the client untouched) a stream of
  another context (``cuStreamGetCtx``), one the driver reports as invalid, one
  capturing a graph, an event the driver does not know, or an object declaring another
  device. Then it captures the work queued so far: an event of the server's pool
  recorded on the foreign stream; for a foreign *event*, a fresh side stream waits on it
  (which captures its state now: a later re-record cannot move it), the pool's event is
  recorded there, and the side stream is destroyed at once (the driver frees it once
  its work is done). An event never recorded (handle 0) captures nothing.
* ``foreign_wait``: the captured event becomes an ordinary
  :class:`~.completion.CudaCompletion`, so it completes through the same path as a read
  or a sync: polled for a few hundred µs, then the notify stream of the task's own
  stream waits for it and a C host function closes a pipe the loop watches (no thread,
  no Python in the driver's thread).
* ``foreign_done``: the same wait in one call, offered first (by the client's
  :class:`~.fast_sync.FastSync`, on its conditions): the captured event polled for up
  to 30 µs, as the completion watcher's first spin does; done, it goes back to the pool
  and the caller's future is settled at once (what the route does when its spin
  succeeds, through the channel, the completion and the watcher).
* ``foreign_after``: the task's stream waits on the device (``cuStreamWaitEvent``) for
  the captured event; its cursor moves, so a later ``sync`` covers the wait.

A capture no command takes (cancelled before the actor ran it) goes back to the pool
when its :class:`~..server.foreign.ForeignWork` is dropped.
"""

from __future__ import annotations

from typing import Any

from ..errors import CudaDriverError, ForeignStreamError
from ..server.foreign import DEFAULT_STREAMS, ForeignWork
from ..values.stream_id import StreamId
from .completion import CudaCompletion
from .driver import check, cu, error_from
from .native.hotpath import hot, poll_events
from .state import ServerCore

__all__ = ["ForeignOps"]

_NOT_READY = 600  # CUDA_ERROR_NOT_READY
_CAPTURE_NONE = 0  # CU_STREAM_CAPTURE_STATUS_NONE


class ForeignOps(ServerCore):
    """``capture_foreign``, ``foreign_wait`` and ``foreign_after`` (see above)."""

    def capture_foreign(self, work: ForeignWork) -> None:
        """Check ``work`` and capture the work queued on it so far (see above)."""
        foreign = self._check_foreign(work)
        if work.kind == "event" and not work.handle:
            return  # an event never recorded: nothing to wait for
        try:
            if work.kind == "stream":
                event = self._events.record(foreign)
            else:
                event = self._record_after_event(foreign)
        except CudaDriverError as exc:
            if exc.sticky:
                raise
            raise _unknown(work, exc) from exc
        work.captured, work.drop = event, self._events.give

    def _check_foreign(self, work: ForeignWork) -> Any:
        """Refuse ``work`` where it cannot be waited on; its handle as a driver object."""
        ordinal = self._ctx.ordinal
        if work.device is not None and work.device != ordinal:
            raise ForeignStreamError(
                f"{work.where()}: it belongs to cuda:{work.device}, and this client runs "
                f"on cuda:{ordinal}; wait on it from a client of cuda:{work.device}, or "
                f"pass a stream of cuda:{ordinal}"
            )
        if work.kind == "stream":
            if work.handle not in DEFAULT_STREAMS:
                self._check_stream(work)
            return work.handle  # the raw handle: the hot path records on it
        event = cu().CUevent(work.handle)
        if work.handle:
            err = int(hot.event_query(event))
            if err not in (0, _NOT_READY):
                raise _unknown(work, error_from(err, "cuEventQuery"))
        return event

    def _record_after_event(self, foreign: Any) -> Any:
        d = cu()
        flags = int(d.CUstream_flags.CU_STREAM_NON_BLOCKING)
        side = check(d.cuStreamCreate(flags), "cuStreamCreate(side)")
        try:
            self._wait_on(side, foreign)
            return self._events.record(side)
        finally:
            d.cuStreamDestroy(side)  # freed by the driver once its work is done

    def _check_stream(self, work: ForeignWork) -> None:
        # one call of the hot path: cuda.bindings' two calls and their objects cost a
        # few µs of every client.wait(stream)
        err, context, capture_err, status = hot.stream_check(work.handle)
        if err:
            raise _unknown(work, error_from(err, "cuStreamGetCtx"))
        if context != self._ctx.handle:
            raise ForeignStreamError(
                f"{work.where()}: that stream belongs to another device or context than "
                f"this client's (cuda:{self._ctx.ordinal}); pass a stream of this device, "
                "or wait on it from a client of its own device"
            )
        if capture_err:
            raise error_from(capture_err, "cuStreamIsCapturing")
        if status != _CAPTURE_NONE:
            raise ForeignStreamError(
                f"{work.where()}: that stream is capturing a CUDA graph, so nothing can "
                "be recorded on it for asynccube to wait on; wait after the capture ends "
                "(or on the graph's launch stream)"
            )

    def foreign_wait(self, work: ForeignWork, stream: StreamId) -> CudaCompletion[None]:
        """A completion once the captured work is done (see above)."""
        own = self._streams.streams.get(stream).stream  # keys the notify stream (bounded)
        event = work.take()
        return self._completion([] if event is None else [event], own, None)

    def foreign_done(self, work: ForeignWork, spin: float) -> int:
        """Poll the captured event for up to ``spin`` seconds: 0 once
        done (given back: nothing is left to wait for), else the last status,
        ``CUDA_ERROR_NOT_READY`` or an error (the capture is kept for ``foreign_wait``,
        which waits for it or raises the error)."""
        event = work.captured
        if event is None:
            return 0  # an event never recorded: nothing to wait for
        err = poll_events(hot.event_query, [event], spin)
        if err:
            return err
        work.take()
        self._events.give(event)
        return 0

    def foreign_after(self, work: ForeignWork, stream: StreamId) -> None:
        """Make ``stream``'s CUDA stream wait on the device for the captured work."""
        target = self._streams.resolve(stream, ()).stream
        event = work.take()
        if event is None:
            return
        try:
            self._wait_on(target, event)
        finally:
            self._events.give(event)  # the wait captured the event's state

    def _wait_on(self, stream: Any, event: Any) -> None:
        err = hot.stream_wait_event(stream, event)
        if err:
            raise error_from(err, "cuStreamWaitEvent")


def _unknown(work: ForeignWork, cause: BaseException) -> ForeignStreamError:
    what = "stream" if work.kind == "stream" else "event"
    err = ForeignStreamError(
        f"{work.where()}: the driver does not know that {what} ({cause}); it was "
        f"destroyed, or the handle is not a CUDA {what} of a live context. Keep the "
        f"library's {what} object alive while asynccube waits on it"
    )
    err.__cause__ = cause
    return err
