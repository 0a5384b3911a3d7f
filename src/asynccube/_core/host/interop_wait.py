"""The short wait of a host export (DLPack to a CPU consumer, which has no stream to be
ordered after): the work queued on the buffer is given this long to finish on its
worker thread before the export is refused (the event loop blocks meanwhile, so it is
kept well under the loop-lag budget; fire-and-forget work on small buffers finishes in
tens of microseconds)."""

from __future__ import annotations

import threading

__all__ = ["EXPORT_WAIT_SECONDS", "wait_briefly"]

EXPORT_WAIT_SECONDS = 0.003


def wait_briefly(event: threading.Event, seconds: float = EXPORT_WAIT_SECONDS) -> bool:
    """True once ``event`` is set; False if it is not within ``seconds``. Blocks the
    calling thread (with the GIL released, so the worker that sets it runs freely)."""
    return event.wait(seconds)
