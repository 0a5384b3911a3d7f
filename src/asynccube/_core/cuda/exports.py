"""What a CUDA export (DLPack, ``__cuda_array_interface__``) needs beyond an address:
memory that outlives the client, and ordering after work not issued yet.

* :class:`ExportLeases` counts the exports a consumer still holds. Each capsule keeps a
  :class:`Lease` until the consumer's deleter runs; the lease holds what the memory
  belongs to where that is not the server's pools (an imported producer's capsule).
  ``close()`` waits for none of them, and frees nothing they hold: the device pages,
  the pool, the gates and the context's reference are released (on a thread of their
  own) when the last lease goes. The DLPack contract: the memory stays valid until
  the consumer calls the deleter, whatever the producer's owner does.
* :class:`Gates` order a consumer's stream after work that the channel has not issued
  yet (a command behind a worker-thread job: a staged copy, a dynamic count; not a
  kernel's first load, which synchronizes the device and so would wait for the
  consumer's stream: such an export is refused, see ``interop.py``): the consumer's stream waits
  on the device (``cuStreamWaitValue32``, greater-or-equal) for a 32-bit word of mapped
  pinned memory, and asynccube's stream writes it (``cuStreamWriteValue32``) once the
  queued work is issued; nothing is refused, nothing blocks. A gate its command never
  opened (the client closed or died first) is opened from the host when dropped, so a
  consumer never waits forever; its stream then runs on what the memory holds.

  The gate is opened by the event loop's thread (the actor issues the queued launch,
  then the write). A consumer that synchronizes on that same thread before the loop
  runs again (``x.cpu()`` right after ``torch.from_dlpack(t)``, no ``await`` between)
  would wait for itself: after :data:`GATE_TIMEOUT_SECONDS` a gate still closed is
  opened from the host, with a warning on the ``asynccube.interop`` logger naming the
  cause, so the program goes on instead of hanging (the consumer then sees the bytes
  from before the queued launch). If the queued launch fails, the gate still opens
  after it: the consumer sees the bytes as they were before the launch, and the error
  is raised by the exporting task's next awaited call (as for any failed launch).
"""

from __future__ import annotations

import _thread
import ctypes
import logging
import queue
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, Final

from .driver import check, cu, error_from
from .storage import _release_later

__all__ = ["GATE_TIMEOUT_SECONDS", "ExportLeases", "Gate", "Gates", "Lease"]

log = logging.getLogger("asynccube.interop")

GATE_TIMEOUT_SECONDS = 10.0
"""A gate still closed after this long is opened from the host (see above)."""

_SLOTS: Final = 1024
"""32-bit words per page of gates (one 4 KiB pinned page)."""
_WAIT_GEQ: Final = 0  # CU_STREAM_WAIT_VALUE_GEQ (cyclic: wraparound is ignored)


class Lease:
    """One export a consumer holds: released by its capsule's deleter (any thread)."""

    __slots__ = ("_leases", "keep")

    def __init__(self, leases: ExportLeases, keep: Any) -> None:
        self._leases: ExportLeases | None = leases
        self.keep = keep

    def __del__(self) -> None:
        leases, self._leases = self._leases, None
        self.keep = None
        if leases is not None:
            leases.give()


class ExportLeases:
    """The live exports of one server, and what runs once the last is released."""

    __slots__ = ("_after_last", "_live", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live = 0
        self._after_last: Callable[[], object] | None = None

    @property
    def live(self) -> int:
        """Exports a consumer (or an unconsumed capsule) still holds."""
        return self._live

    def take(self, keep: Any) -> Lease:
        """A lease for one more export, holding ``keep`` until it is released."""
        with self._lock:
            self._live += 1
        return Lease(self, keep)

    def give(self) -> None:
        """One export released; the last one after ``after_last`` runs its function
        (on a thread of its own: freeing device memory takes milliseconds)."""
        with self._lock:
            self._live -= 1
            last = self._after_last if self._live <= 0 else None
            if last is not None:
                self._after_last = None
        if last is not None:
            _release_later(last)

    def after_last(self, fn: Callable[[], object]) -> bool:
        """Run ``fn`` now (True) if no export is live, else once the last is released
        (False)."""
        with self._lock:
            if self._live > 0:
                self._after_last = fn
                return False
        fn()
        return True


class Gate:
    """One 32-bit word a consumer's stream waits on until it holds ``value``."""

    __slots__ = ("__weakref__", "_gates", "address", "value")

    def __init__(self, gates: Gates, address: int, value: int) -> None:
        self._gates: Gates | None = gates
        self.address = address
        self.value = value
        _watchdog().watch(self)

    @property
    def opened(self) -> bool:
        """True once the value was written (or its write queued on a stream)."""
        return self._gates is None

    def open_on(self, stream: Any) -> None:
        """Write the value on ``stream`` (after the work queued on it so far); the
        host writes it at once if the driver refuses."""
        gates, self._gates = self._gates, None
        if gates is None or gates.closed:
            return
        try:
            result = cu().cuStreamWriteValue32(
                stream, gates.device_address(self.address), self.value, 0
            )
        except BaseException:
            _write(self.address, self.value)
            raise
        code = result[0] if isinstance(result, tuple) else result
        if code:
            _write(self.address, self.value)
            raise error_from(code, "cuStreamWriteValue32")

    def open_now(self) -> None:
        """Write the value from the host (the consumer runs on what memory holds)."""
        gates, self._gates = self._gates, None
        if gates is not None and not gates.closed:
            _write(self.address, self.value)

    def __del__(self) -> None:
        self.open_now()


def _expire(gate: Gate) -> None:
    """A gate still closed at its deadline is opened from the host (see above)."""
    if gate.opened:
        return
    log.warning(
        "a DLPack/CUDA Array Interface export waited %gs for the commands queued before "
        "it (a kernel compile, then its launch) without the event loop issuing them: "
        "the consumer was probably synchronized on the loop's thread (x.cpu(), "
        ".item(), cupy.asnumpy) before the loop ran again. Its stream was released; it "
        "read the bytes from before those commands. Await something (client.sync()) "
        "before synchronizing the consumer on the loop's thread",
        GATE_TIMEOUT_SECONDS,
    )
    gate.open_now()


class _Watchdog:
    """One thread that opens the gates still closed at their deadline. Started with
    ``_thread`` (``threading.Thread.start`` waits for the new thread to run, which can
    take milliseconds on a loaded machine, and a gate is made on the event loop)."""

    def __init__(self) -> None:
        self._new: queue.SimpleQueue[tuple[float, weakref.ReferenceType[Gate]]]
        self._new = queue.SimpleQueue()
        _thread.start_new_thread(self._run, ())

    def watch(self, gate: Gate) -> None:
        """Open ``gate`` from the host if it is still closed after the timeout."""
        self._new.put((time.monotonic() + GATE_TIMEOUT_SECONDS, weakref.ref(gate)))

    def _run(self) -> None:
        pending: list[tuple[float, weakref.ReferenceType[Gate]]] = []
        while True:
            if not pending:
                pending.append(self._new.get())
            while not self._new.empty():
                pending.append(self._new.get())
            now, kept = time.monotonic(), []
            for deadline, ref in pending:
                gate = ref()
                if gate is None or gate.opened:
                    continue
                if deadline <= now:
                    _expire(gate)
                else:
                    kept.append((deadline, ref))
                del gate
            pending = kept
            if pending:
                time.sleep(min(_POLL_SECONDS, max(0.0, min(d for d, _ in pending) - now)))


_POLL_SECONDS: Final = 0.25
_WATCHDOG: list[_Watchdog] = []


def _watchdog() -> _Watchdog:
    if not _WATCHDOG:
        _WATCHDOG.append(_Watchdog())
    return _WATCHDOG[0]


def _write(address: int, value: int) -> None:
    ctypes.c_uint32.from_address(address).value = value


class Gates:
    """Words of mapped pinned memory for :class:`Gate` (see the module docstring). A
    word is reused only once the host sees its last value written (a write still in
    flight on some stream could otherwise land after a newer one)."""

    __slots__ = ("_pages", "_ready", "_values", "closed")

    def __init__(self) -> None:
        self.closed = False
        self._pages: list[tuple[int, int]] = []  # (host address, device address)
        self._values: dict[int, int] = {}  # word's host address -> the last value given
        self._ready: list[int] = []

    def device_address(self, address: int) -> int:
        """The device address of the word at host ``address``."""
        for host, device in self._pages:
            if host <= address < host + 4 * _SLOTS:
                return device + (address - host)
        raise KeyError(address)

    def wait(self, consumer: Any) -> Gate:
        """A new gate, with ``consumer`` (a CUstream) made to wait for it on the device."""
        address = self._word()
        value = (self._values[address] + 1) & 0xFFFFFFFF
        self._values[address] = value
        result = cu().cuStreamWaitValue32(consumer, self.device_address(address), value, _WAIT_GEQ)
        code = result[0] if isinstance(result, tuple) else result
        if code:
            self._values[address] = value - 1 & 0xFFFFFFFF
            self._ready.append(address)
            raise error_from(code, "cuStreamWaitValue32")
        return Gate(self, address, value)

    def _word(self) -> int:
        if not self._ready:
            self._ready = [
                a for a, v in self._values.items() if ctypes.c_uint32.from_address(a).value == v
            ]
        if not self._ready:
            self._grow()
        return self._ready.pop()

    def _grow(self) -> None:
        d = cu()
        flags = int(d.CU_MEMHOSTALLOC_DEVICEMAP) | int(d.CU_MEMHOSTALLOC_PORTABLE)
        host = int(check(d.cuMemHostAlloc(4 * _SLOTS, flags), "cuMemHostAlloc(gates)"))
        ctypes.memset(host, 0, 4 * _SLOTS)
        device = int(check(d.cuMemHostGetDevicePointer(host, 0), "cuMemHostGetDevicePointer"))
        self._pages.append((host, device))
        words = [host + 4 * i for i in range(_SLOTS)]
        self._values.update(dict.fromkeys(words, 0))
        self._ready.extend(words)

    def close(self) -> None:
        """Free the pages (once no stream can still wait on a word: the caller
        synchronized the context)."""
        self.closed = True
        pages, self._pages = self._pages, []
        self._values.clear()
        self._ready.clear()
        for host, _ in pages:
            cu().cuMemFreeHost(host)
