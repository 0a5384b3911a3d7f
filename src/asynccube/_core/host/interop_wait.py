"""The short wait of a host export (DLPack to a CPU consumer, which has no stream to be
ordered after): the work queued on the buffer is given this long to finish on its
worker thread before the export is refused (the event loop blocks meanwhile, so it is
kept well under the loop-lag budget; fire-and-forget work on small buffers finishes in
tens of microseconds)."""

from __future__ import annotations

import threading

from ..errors import DLPackError
from ..stream.multi import MultiStream
from ..values.types import Binding
from .worker import HostBackend, HostStream

__all__ = ["EXPORT_WAIT_SECONDS", "wait_briefly", "wait_for_export"]

EXPORT_WAIT_SECONDS = 0.003


def wait_briefly(event: threading.Event, seconds: float = EXPORT_WAIT_SECONDS) -> bool:
    """True once ``event`` is set; False if it is not within ``seconds``. Blocks the
    calling thread (with the GIL released, so the worker that sets it runs freely)."""
    return event.wait(seconds)


def wait_for_export(
    backend: HostBackend, streams: MultiStream[HostStream, threading.Event], binding: Binding
) -> None:
    """Return once the work queued on ``binding`` has run: the worker of the stream that
    last used the buffer (every earlier use is ordered before that one) is handed its
    tasks and waited for, briefly; work still running then is refused with DLPackError
    rather than the event loop being blocked."""
    backend.flush_dirty()  # every stream's tasks, and the events they wait on
    worker = streams.streams.get(streams.origin(binding)[0]).stream
    if worker.finished == worker.submitted:
        return
    reached = threading.Event()
    worker.submit(reached.set)
    worker.flush()
    if not wait_briefly(reached):
        raise DLPackError(
            f"the work queued on this tensor is still running on the host server "
            f"after {EXPORT_WAIT_SECONDS * 1e3:g} ms (a long kernel or copy), and a "
            "CPU consumer cannot be ordered after it (it has no stream) without "
            "blocking the event loop; `await client.sync()` first, then export"
        )
