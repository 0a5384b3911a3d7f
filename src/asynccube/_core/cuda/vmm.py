"""Expandable ranges on CUDA: the driver's virtual memory API behind an expandable pool.

:class:`VirtualRange` is the :class:`~..memory.expandable.ChunkBackend` of
:class:`~.storage.CudaStorage`: one range of device addresses reserved once
(``cuMemAddressReserve``), whose chunks of the allocation granularity
(``cuMemGetAllocationGranularity``, 2 MiB on current GPUs) are each backed by a physical
allocation of their own (``cuMemCreate`` + ``cuMemMap``) and made accessible to the
device (one ``cuMemSetAccess`` per run). PyTorch's ``expandable_segments`` maps its
pages the same way, one handle per page, so that any page can be given back alone.

Which thread
    Mapping runs where the pool grows, on the loop's thread, as a page allocation of the
    other pools does (``cuMemAllocFromPoolAsync`` there): physical memory is taken, no
    device work is waited for. Unmapping (``cuMemUnmap``, ``cuMemRelease``) can
    synchronise with the device, so it never runs there: :meth:`VirtualRange.unmap`
    hands the chunks to a thread of the range's own, which reports them done
    (:meth:`VirtualRange.unmapped`); the pool places nothing on them meanwhile. Freeing
    the range (every chunk, then ``cuMemAddressFree``) is queued there too;
    :meth:`VirtualRange.wait` waits for it (the storage's close, off the loop).

The one wait
    When the device has no room for the chunks asked for while released chunks are
    still being unmapped, :meth:`VirtualRange.map` waits for those unmaps, then looks
    again: the out-of-memory path, where the manager has just released what it could
    (as PyTorch synchronises before freeing its cached blocks when memory runs out).

Errors: a failing call becomes a :class:`~asynccube.CudaDriverError` (``check``), an
exhausted device a ``StorageOutOfMemory`` (the manager's cleanup-and-retry); a failure
on the unmapping thread is logged, never raised.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from typing import Any, Final

from ..memory.expandable import MapFailed
from ..memory.storage import StorageHandle, StorageOutOfMemory
from .driver import check, cu, error_from

__all__ = ["VirtualRange", "vmm_supported"]

log = logging.getLogger("asynccube.memory")

_OOM: Final = 2  # CUDA_ERROR_OUT_OF_MEMORY


def vmm_supported(device: Any) -> bool:
    """True if ``device`` (a ``CUdevice``) supports the virtual memory API."""
    d = cu()
    attr = d.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
    return bool(check(d.cuDeviceGetAttribute(attr, device), "cuDeviceGetAttribute"))


def _allocation_prop(ordinal: int) -> Any:
    d = cu()
    prop = d.CUmemAllocationProp()
    prop.type = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = ordinal
    return prop


def _access(ordinal: int) -> Any:
    d = cu()
    desc = d.CUmemAccessDesc()
    desc.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    desc.location.id = ordinal
    desc.flags = d.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    return desc


class VirtualRange:
    """A reserved range of device addresses, mapped chunk by chunk.

    Args:
        ordinal: The GPU (its context current on the calling thread).
        size: Bytes of addresses to reserve (rounded up to whole chunks).
        storage_id: The id the storage resolves the range's resources by.

    Attributes:
        base: The range's first device address.
        granularity: The chunk size (the device's minimum allocation granularity).
        handle: The range as a storage handle (``storage_id``, 0, its size).
    """

    def __init__(self, ordinal: int, size: int, storage_id: int) -> None:
        d = cu()
        self._prop = _allocation_prop(ordinal)
        minimum = d.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM
        gran = int(
            check(
                d.cuMemGetAllocationGranularity(self._prop, minimum),
                "cuMemGetAllocationGranularity",
            )
        )
        size = -(-size // gran) * gran
        base = check(d.cuMemAddressReserve(size, gran, 0, 0), "cuMemAddressReserve")
        self.base = int(base)
        self.granularity = gran
        self.handle = StorageHandle(storage_id, 0, size)
        self._access = [_access(ordinal)]
        self._context = check(d.cuCtxGetCurrent(), "cuCtxGetCurrent")
        self._handles: dict[int, Any] = {}  # chunk -> its physical allocation
        self._jobs: queue.Queue[tuple[int, list[tuple[int, Any]], bool] | None] = queue.Queue()
        self._done: deque[tuple[int, int]] = deque()
        self._thread: threading.Thread | None = None
        self.closed = False

    def __repr__(self) -> str:
        return (
            f"VirtualRange(base={self.base:#x}, size={self.handle.size}, "
            f"chunk={self.granularity}, mapped={len(self._handles)})"
        )

    # -- mapping (the loop's thread) ----------------------------------------------------

    def map(self, first: int, count: int) -> None:
        """Back chunks ``[first, first + count)``, each with an allocation of its own,
        accessible read-write from the device.

        Raises:
            MapFailed: how many chunks were mapped, and why the next one was not.
        """
        need = count * self.granularity
        if not self._fits(need) and self._jobs.unfinished_tasks:
            self._jobs.join()  # released chunks still being unmapped: the OOM path
        if not self._fits(need):
            raise MapFailed(0, _out_of_memory(need, "cuMemCreate"))
        mapped, cause = self._create_and_map(first, count)
        if mapped:
            self._grant(first, mapped)
        if cause is not None:
            raise MapFailed(mapped, cause)

    def _create_and_map(self, first: int, count: int) -> tuple[int, BaseException | None]:
        d, g = cu(), self.granularity
        for k, i in enumerate(range(first, first + count)):
            err, handle = d.cuMemCreate(g, self._prop, 0)
            if err:
                return k, _out_of_memory(g, "cuMemCreate", err)
            (err,) = d.cuMemMap(self.base + i * g, g, 0, handle, 0)
            if err:
                d.cuMemRelease(handle)
                return k, error_from(err, "cuMemMap")
            self._handles[i] = handle
        return count, None

    def _grant(self, first: int, count: int) -> None:
        """Make the chunks just mapped accessible; if the driver refuses, unmap them
        (waiting for that: nothing can use them yet) and raise."""
        g = self.granularity
        (err,) = cu().cuMemSetAccess(self.base + first * g, count * g, self._access, 1)
        if err:
            self.unmap(first, count)  # reported done later: the pool ignores it
            self._jobs.join()
            raise MapFailed(0, error_from(err, "cuMemSetAccess"))

    def _fits(self, size: int) -> bool:
        """False when ``size`` bytes exceed what the device has free (asked without a
        failing call, as the storage's pages are)."""
        err, free, _ = cu().cuMemGetInfo()
        return bool(err) or size <= int(free)

    # -- unmapping (a thread of the range's own) ----------------------------------------

    def unmap(self, first: int, count: int) -> None:
        """Queue chunks ``[first, first + count)`` to be unmapped and released."""
        chunks = [(i, self._handles.pop(i)) for i in range(first, first + count)]
        self._submit((first, chunks, False))

    def unmapped(self) -> list[tuple[int, int]]:
        """The runs whose unmapping finished since the last call."""
        done = []
        while self._done:
            done.append(self._done.popleft())
        return done

    def close(self) -> None:
        """Queue every chunk's release and the range's (returns at once; see
        :meth:`wait`)."""
        if self.closed:
            return
        self.closed = True
        chunks = sorted(self._handles.items())
        self._handles.clear()
        self._submit((0, chunks, True))
        self._jobs.put(None)

    def wait(self, timeout: float | None = None) -> None:
        """Wait until every queued release is done (off the loop: the close thread)."""
        if self._thread is not None:
            self._thread.join(timeout)

    def _submit(self, job: tuple[int, list[tuple[int, Any]], bool]) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="asynccube-vmm-release", daemon=True
            )
            self._thread.start()
        self._jobs.put(job)

    def _run(self) -> None:
        d = cu()
        d.cuCtxSetCurrent(self._context)
        while True:
            job = self._jobs.get()
            try:
                if job is None:
                    return
                first, chunks, free_range = job
                self._release(chunks)
                if free_range:
                    self._free_range()
                elif chunks:
                    self._done.append((first, len(chunks)))
            finally:
                self._jobs.task_done()

    def _release(self, chunks: list[tuple[int, Any]]) -> None:
        d, g = cu(), self.granularity
        for i, handle in chunks:
            try:
                check(d.cuMemUnmap(self.base + i * g, g), "cuMemUnmap")
                check(d.cuMemRelease(handle), "cuMemRelease")
            except Exception as exc:  # a thread's failure is logged, never raised
                log.warning("could not release chunk %d of %r: %s", i, self, exc)

    def _free_range(self) -> None:
        try:
            check(cu().cuMemAddressFree(self.base, self.handle.size), "cuMemAddressFree")
        except Exception as exc:
            log.warning("could not free the addresses of %r: %s", self, exc)


def _out_of_memory(size: int, call: str, err: int = _OOM) -> BaseException:
    """StorageOutOfMemory for an exhausted device (the manager cleans up and retries),
    else the driver's error."""
    if int(err) != _OOM:
        return error_from(err, call)
    exc = StorageOutOfMemory(size, f"{call}: CUDA_ERROR_OUT_OF_MEMORY")
    exc.__cause__ = error_from(err, call)
    return exc
