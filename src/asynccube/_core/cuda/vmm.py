"""Expandable ranges on CUDA: the driver's virtual memory API behind an expandable pool.

:class:`VirtualRange` is the :class:`~..memory.expandable.ChunkBackend` of
:class:`~.storage.CudaStorage`: one range of device addresses reserved once
(``cuMemAddressReserve``), whose chunks of the allocation granularity
(``cuMemGetAllocationGranularity``, 2 MiB on current GPUs) are backed by physical
allocations (``cuMemCreate`` + ``cuMemMap``) and made accessible to the device (one
``cuMemSetAccess`` per run). A run mapped in one call takes allocations of an eighth of
it (one chunk for runs up to 16 chunks, at most 16: ``memory.storage.ChunkAllocations``,
the bookkeeping :class:`~..memory.storage.DryChunks` shares): each call costs about the
same whatever its size, and an allocation is given back only whole. PyTorch's
``expandable_segments`` maps pages of 2 MiB (small pool) and 20 MiB (large) likewise.

Which thread
    Mapping and unmapping both run where the pool grows and gives back, on the loop's
    thread, as a page allocation of the other pools does (``cuMemAllocFromPoolAsync``
    there). Neither waits for device work: the memory manager hands chunks back only
    once no stream can still use them, and ``cuMemUnmap`` of memory no work uses returns
    in about 25 µs (``benchmarks/profile_vmm.py`` measures every call, and the unmap
    while a kernel keeps the device busy). Doing it there keeps what the range maps
    exactly what the pool counts: released chunks are at once free addresses to map
    again (handed to a thread, as a first version did, they lagged behind the growth
    under churn: a range reached 2.4 times its peak in use on an H200). Freeing the
    range (every chunk, then ``cuMemAddressFree``) runs on a thread of its own at
    close; :meth:`VirtualRange.wait` waits for it (the storage's close, off the loop).

Errors: a failing call becomes a :class:`~asynccube.CudaDriverError` (``check``), an
exhausted device a ``StorageOutOfMemory`` (the manager's cleanup-and-retry); a failing
release is logged, never raised (the pool goes on; the chunk's memory stays with the
driver until the range is freed).
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Final

from ..memory.expandable import MapFailed
from ..memory.storage import ChunkAllocations, StorageHandle, StorageOutOfMemory
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
        self._allocations = ChunkAllocations()
        self._handles: dict[int, Any] = {}  # first chunk of an allocation -> its handle
        self._done: list[tuple[int, int]] = []
        self._thread: threading.Thread | None = None
        self.closed = False

    def __repr__(self) -> str:
        return (
            f"VirtualRange(base={self.base:#x}, size={self.handle.size}, "
            f"chunk={self.granularity}, allocations={len(self._handles)})"
        )

    # -- mapping (the loop's thread) ----------------------------------------------------

    def map(self, first: int, count: int) -> None:
        """Back chunks ``[first, first + count)`` with physical allocations, accessible
        read-write from the device.

        Raises:
            MapFailed: how many chunks were mapped, and why the next one was not.
        """
        need = count * self.granularity
        if not self._fits(need):
            raise MapFailed(0, _out_of_memory(need, "cuMemCreate"))
        mapped, cause = self._create_and_map(first, count)
        if mapped:
            self._grant(first, mapped)
        if cause is not None:
            raise MapFailed(mapped, cause)

    def _create_and_map(self, first: int, count: int) -> tuple[int, BaseException | None]:
        """Map the run allocation by allocation; how many chunks were mapped, and why
        the next allocation was not."""
        d, g = cu(), self.granularity
        for start, size in self._allocations.split(first, count):
            err, handle = d.cuMemCreate(size * g, self._prop, 0)
            if err:
                return start - first, _out_of_memory(size * g, "cuMemCreate", err)
            (err,) = d.cuMemMap(self.base + start * g, size * g, 0, handle, 0)
            if err:
                d.cuMemRelease(handle)
                return start - first, error_from(err, "cuMemMap")
            self._handles[start] = handle
            self._allocations.add(start, size)
        return count, None

    def _grant(self, first: int, count: int) -> None:
        """Make the chunks just mapped accessible; if the driver refuses, unmap them
        (nothing can use them yet) and raise."""
        g = self.granularity
        (err,) = cu().cuMemSetAccess(self.base + first * g, count * g, self._access, 1)
        if err:
            self.unmap(first, count)  # reported done: the pool ignores it (never mapped)
            raise MapFailed(0, error_from(err, "cuMemSetAccess"))

    def _fits(self, size: int) -> bool:
        """False when ``size`` bytes exceed what the device has free (asked without a
        failing call, as the storage's pages are)."""
        err, free, _ = cu().cuMemGetInfo()
        return bool(err) or size <= int(free)

    # -- unmapping (the loop's thread; the range's own at close) ----------------------

    def unmap(self, first: int, count: int) -> list[tuple[int, int]]:
        """Unmap and release the allocations inside chunks ``[first, first + count)``
        now (no stream may still use them) and report them done (:meth:`unmapped`);
        the runs kept mapped (their allocation reaches past the run)."""
        released, kept = self._allocations.release_plan(first, count)
        self._release([(start, self._forget(start)) for start, _ in released])
        self._done.extend(released)
        return kept

    def _forget(self, start: int) -> tuple[int, Any]:
        """The allocation at chunk ``start``, dropped from the books: its chunk count
        and handle."""
        return self._allocations.remove(start), self._handles.pop(start)

    def releasable(self, first: int, count: int) -> list[tuple[int, int]]:
        """The runs of chunks ``[first, first + count)`` :meth:`unmap` would give back
        (the allocations wholly inside it)."""
        return self._allocations.releasable(first, count)

    def unmapped(self) -> list[tuple[int, int]]:
        """The runs whose unmapping finished since the last call."""
        done, self._done = self._done, []
        return done

    def close(self) -> None:
        """Queue every chunk's release and the range's to the range's thread (returns at
        once; see :meth:`wait`)."""
        if self.closed:
            return
        self.closed = True
        chunks = [(start, self._forget(start)) for start in sorted(self._handles)]
        self._thread = threading.Thread(
            target=self._run, args=(chunks,), name="asynccube-vmm-release", daemon=True
        )
        self._thread.start()

    def wait(self, timeout: float | None = None) -> None:
        """Wait until the range is freed (off the loop: the close thread)."""
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self, chunks: list[tuple[int, tuple[int, Any]]]) -> None:
        cu().cuCtxSetCurrent(self._context)
        self._release(chunks)
        self._free_range()

    def _release(self, allocations: list[tuple[int, tuple[int, Any]]]) -> None:
        """Unmap and release each ``(first chunk, (chunks, handle))``."""
        d, g = cu(), self.granularity
        for start, (size, handle) in allocations:
            try:
                check(d.cuMemUnmap(self.base + start * g, size * g), "cuMemUnmap")
                check(d.cuMemRelease(handle), "cuMemRelease")
            except Exception as exc:  # logged, never raised (the pool goes on)
                log.warning("could not release chunk %d of %r: %s", start, self, exc)

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
