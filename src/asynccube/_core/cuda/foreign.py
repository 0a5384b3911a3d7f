"""CUDA side of ``client.wait(obj)`` / ``client.after(obj)``: another library's stream
or event, waited on without a host round trip and without blocking the loop.

* ``foreign_wait``: an event of the server's pool recorded on the foreign stream
  becomes an ordinary :class:`~.completion.CudaCompletion`, so it completes through
  the same path as a read or a sync: polled for a few hundred µs, then the notify
  stream of the task's own stream waits for it and a C host function closes a pipe
  the loop watches (no thread, no Python in the driver's thread). An *event* is not
  queried directly: a later re-record would move what it stands for. A side stream
  (from a small pool) waits on it, which captures its state now, and the completion's
  event is recorded there. An event never recorded (handle 0) completes at once.
* ``foreign_after``: the task's stream waits on the device (``cuStreamWaitEvent``) for
  an event recorded on the foreign stream (or for the foreign event itself); its cursor
  moves, so a later ``sync`` covers the wait.
* ``check_foreign`` runs at the call, before anything is queued: a stream of another
  context (``cuStreamGetCtx``), one the driver does not know (destroyed), one that is
  capturing a graph, or an event the driver does not know raises
  :class:`~asynccube.ForeignStreamError`; the client is untouched.
"""

from __future__ import annotations

from typing import Any

from ..errors import ForeignStreamError
from ..server.foreign import DEFAULT_STREAMS, ForeignWork
from ..values.stream_id import StreamId
from .completion import CudaCompletion
from .driver import check, cu, error_from
from .native.hotpath import hot
from .state import ServerCore

__all__ = ["ForeignOps"]

_NOT_READY = 600  # CUDA_ERROR_NOT_READY


class ForeignOps(ServerCore):
    """``check_foreign``, ``foreign_wait`` and ``foreign_after`` (see above)."""

    _foreign_sides: list[Any]
    """Idle side streams for waits on foreign events (made by the backend, so they are
    destroyed with the server's own streams)."""

    def check_foreign(self, work: ForeignWork) -> None:
        """ForeignStreamError unless ``work`` is of this device and known to the driver."""
        ordinal = self._ctx.ordinal
        if work.device is not None and work.device != ordinal:
            raise ForeignStreamError(
                f"{work.where()}: it belongs to cuda:{work.device}, and this client runs "
                f"on cuda:{ordinal}; wait on it from a client of cuda:{work.device}, or "
                f"pass a stream of cuda:{ordinal}"
            )
        if work.kind == "stream" and work.handle not in DEFAULT_STREAMS:
            self._check_stream(work)
        elif work.kind == "event" and work.handle:
            err = int(hot.event_query(cu().CUevent(work.handle)))
            if err not in (0, _NOT_READY):
                raise _unknown(work, error_from(err, "cuEventQuery"))

    def _check_stream(self, work: ForeignWork) -> None:
        d = cu()
        handle = d.CUstream(work.handle)
        err, context = d.cuStreamGetCtx(handle)
        if err:
            raise _unknown(work, error_from(err, "cuStreamGetCtx"))
        if int(context) != int(self._ctx.context):
            raise ForeignStreamError(
                f"{work.where()}: that stream belongs to another device or context than "
                f"this client's (cuda:{self._ctx.ordinal}); pass a stream of this device, "
                "or wait on it from a client of its own device"
            )
        status = check(d.cuStreamIsCapturing(handle), "cuStreamIsCapturing")
        if int(status) != int(d.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE):
            raise ForeignStreamError(
                f"{work.where()}: that stream is capturing a CUDA graph, so nothing can "
                "be recorded on it for asynccube to wait on; wait after the capture ends "
                "(or on the graph's launch stream)"
            )

    def foreign_wait(self, work: ForeignWork, stream: StreamId) -> CudaCompletion[None]:
        """A completion once the work queued so far on ``work`` is done (see above)."""
        own = self._streams.streams.get(stream).stream  # keys the notify stream (bounded)
        if work.kind == "stream":
            event = self._events.record(cu().CUstream(work.handle))
            return self._completion([event], own, None)
        if not work.handle:  # an event never recorded: nothing to wait for
            return self._completion([], own, None)
        side = self._take_side()
        try:
            self._wait_on(side, work.handle)
            event = self._events.record(side)
        except BaseException:
            self._foreign_sides.append(side)
            raise
        sides = self._foreign_sides
        return self._completion([event], own, lambda: sides.append(side))

    def foreign_after(self, work: ForeignWork, stream: StreamId) -> None:
        """Make ``stream``'s CUDA stream wait on the device for ``work`` (see above)."""
        target = self._streams.resolve(stream, ()).stream
        if work.kind == "event":
            if work.handle:
                self._wait_on(target, work.handle)
            return
        event = self._events.record(cu().CUstream(work.handle))
        try:
            err = hot.stream_wait_event(target, event)
            if err:
                raise error_from(err, "cuStreamWaitEvent")
        finally:
            self._events.give(event)  # the wait captured the event's state

    def _wait_on(self, stream: Any, event_handle: int) -> None:
        err = hot.stream_wait_event(stream, cu().CUevent(event_handle))
        if err:
            raise error_from(err, "cuStreamWaitEvent")

    def _take_side(self) -> Any:
        sides = self._foreign_sides
        return sides.pop() if sides else self._backend.create_stream()


def _unknown(work: ForeignWork, cause: BaseException) -> ForeignStreamError:
    what = "stream" if work.kind == "stream" else "event"
    err = ForeignStreamError(
        f"{work.where()}: the driver does not know that {what} ({cause}); it was "
        f"destroyed, or the handle is not a CUDA {what} of a live context. Keep the "
        f"library's {what} object alive while asynccube waits on it"
    )
    err.__cause__ = cause
    return err
