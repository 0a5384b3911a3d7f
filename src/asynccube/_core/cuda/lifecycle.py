"""Closing the CUDA server: finish queued work, then free every resource in a thread
of its own; after a sticky error, reset the device's primary context.

The device memory (pages, pool), the export gates and the context's reference are
freed last, and only once no DLPack export is held (:mod:`.exports`): a consumer's
array stays valid after ``close()``, which waits for none of them; the last deleter
releases them, on a thread of its own. A sticky error resets the context anyway
(everything in it is lost: nothing can keep it).
"""

from __future__ import annotations

import _thread
from collections.abc import Callable
from typing import Any

from ..host.worker import HostCompletion
from .driver import cu, error_from, forget_primary
from .state import ServerCore

__all__ = ["LifecycleOps"]


class LifecycleOps(ServerCore):
    """``close`` and the teardown behind it."""

    # -- shutdown -------------------------------------------------------------------

    def close(self) -> HostCompletion[None]:
        """Finish queued work, then free every resource, in a thread of its own (freeing
        pinned and device memory takes milliseconds). After a sticky error, nothing is
        waited for, and the primary context is reset so that a new client can use the
        device; that destroys everything in it, CuPy's or PyTorch's memory included."""
        done: HostCompletion[None] = HostCompletion()
        if self.closed:
            done.set_result(None)
            return done
        for hook in self.before_close:
            try:
                hook()
            except Exception as exc:  # the close goes on; the error is the server's
                self._note_error(exc)
        self.closed = True
        events: list[Any] = []
        if self.sticky is None:
            try:
                events = self._streams.flush_all()
            except Exception as exc:
                self._note_error(exc)
        # Not threading.Thread.start(): it waits, on the loop (close runs there), until the
        # new thread runs, milliseconds on a loaded host (see channel/blocking.py).
        _thread.start_new_thread(self._close_in_thread, (events, done))
        return done

    def _close_in_thread(self, events: list[Any], done: HostCompletion[None]) -> None:
        try:
            self._ctx.make_current()
            sync = cu().cuEventSynchronize
            for event in events:
                (err,) = sync(event)
                if err:
                    self._note_error(error_from(err, "cuEventSynchronize(close)"))
                    break
            if self._janitor is not None:
                self._janitor.shutdown(wait=True)
            self._teardown(reset=self.sticky is not None)
        except BaseException as exc:
            done.set_error(exc)
            return
        done.set_result(None)

    def _release_small_reads(self) -> None:
        """Release the spare pinned buffers of small reads and of ``FastLaunch.write``
        (the device is idle: the close thread synchronized it)."""
        for kept in self._small_reads.values():
            for buf in kept:
                buf.release()
        self._small_reads.clear()
        for spares in self._small_writes.values():
            for buf, _ in spares:
                buf.release()
        self._small_writes.clear()
        self._write_spare_bytes = 0

    def _teardown(self, reset: bool) -> None:
        d = cu()
        self._ctx.make_current()
        steps: list[Callable[[], object]] = [
            *self.close_hooks,
            self._retirer.clear,
            self._release_small_reads,
            self._table.close,
            self._pinned.close,
            self._events.close,
            self._timing.close,
        ]
        if self._notifier is not None:
            steps.append(self._notifier.close)
        steps += [_bind(d.cuModuleUnload, k.module) for k in self._kernels.values()]
        steps += [_bind(d.cuStreamDestroy, st) for st in self._backend.created]
        if reset:
            steps += [self._memory.close, self._storage.close, self._gates.close]
            steps.append(lambda: d.cuDevicePrimaryCtxReset(self._ctx.device))
            steps.append(lambda: forget_primary(self._ctx.context))
            steps.append(self._ctx.close)
        else:  # exports keep the device memory and the context; reads' pinned results too
            steps.append(lambda: self._exports.after_last(self._release_memory))
        for step in steps:
            try:
                step()
            except Exception:  # a broken context fails most frees: nothing to do about it
                if not reset:
                    raise
        self._kernels.clear()

    def _release_memory(self) -> None:
        """Free the device pages, the pool and the gates, then the context's reference
        once no pinned read result holds it: at teardown, or on a thread of its own
        when the last DLPack export is released (:mod:`.exports`)."""
        self._ctx.make_current()
        self._memory.close()
        self._storage.close()
        if self._gates._pages:  # no consumer's stream may still wait on a word
            cu().cuCtxSynchronize()
        self._gates.close()
        self._pinned.after_last(self._ctx.close)


def _bind(fn: Callable[[Any], object], arg: Any) -> Callable[[], object]:
    return lambda: fn(arg)
