"""Compute storage: where memory pages come from (cubecl's ``ComputeStorage``).

A storage hands out whole allocations ("pages") identified by a storage id and gives
back a backend *resource* for any byte range of one: a writable numpy ``uint8`` view for
the host storage, a device pointer (an ``int``) for the CUDA storage, which follows the
``cuMemAlloc`` shape::

    alloc(size)      -> StorageHandle(id, offset=0, size)    # may raise StorageOutOfMemory
    dealloc(id)      -> None
    resource(handle) -> R                                    # base + handle.offset, handle.size
    alignment        -> int                                  # 512 on CUDA, 64 on the host

Storages know nothing of slices, pools or streams: :class:`MemoryManagement` carves the
pages into slices. A storage signals that it has no memory left by raising
:class:`StorageOutOfMemory`; the manager turns that into ``errors.OutOfMemory`` after one
cleanup and one retry (the one place where storage errors become library errors).
"""

from __future__ import annotations

import _thread
import itertools
import queue
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final, Protocol, TypeVar, runtime_checkable

import numpy as np
import numpy.typing as npt

__all__ = [
    "MAX_RUN_CHUNKS",
    "RUN_SHARE",
    "BytesStorage",
    "ChunkAllocations",
    "ComputeStorage",
    "DryChunks",
    "DryStorage",
    "HostResource",
    "StorageHandle",
    "StorageOutOfMemory",
]

R_co = TypeVar("R_co", covariant=True)

HostResource = npt.NDArray[np.uint8]
"""The host storage's resource: a writable ``uint8`` view of a byte range."""


class StorageOutOfMemory(Exception):
    """Raised by ``ComputeStorage.alloc`` when the backend has no memory left.

    Internal: the memory manager catches it, cleans up, retries once, and only then
    raises the public ``errors.OutOfMemory``.

    Attributes:
        size: The size of the allocation that failed.
    """

    def __init__(self, size: int, detail: str = "") -> None:
        self.size = size
        self.detail = detail
        super().__init__(
            f"storage could not allocate {size} bytes" + (f": {detail}" if detail else "")
        )


@dataclass(frozen=True, slots=True)
class StorageHandle:
    """A byte range of one storage allocation: ``(id, offset, size)``."""

    id: int
    offset: int
    size: int

    @property
    def end(self) -> int:
        """One past the last byte of the range, relative to the allocation."""
        return self.offset + self.size

    def sub(self, offset: int, size: int) -> StorageHandle:
        """The range of ``size`` bytes starting ``offset`` bytes into this one."""
        return StorageHandle(self.id, self.offset + offset, size)


@runtime_checkable
class ComputeStorage(Protocol[R_co]):
    """Allocates pages and resolves byte ranges of them to backend resources.

    Attributes:
        alignment: Every page starts at a multiple of this many bytes, and slices are
            carved at multiples of it (512 on CUDA, 64 on the host).
        max_alloc: The largest single allocation the backend could ever serve (e.g.
            the device's total memory), or ``None`` when unknown.
    """

    alignment: int
    max_alloc: int | None

    def alloc(self, size: int) -> StorageHandle:
        """Allocate ``size`` bytes; raise :class:`StorageOutOfMemory` when out of memory."""
        ...

    def dealloc(self, storage_id: int) -> None:
        """Free the allocation ``storage_id`` (unknown ids are ignored)."""
        ...

    def resource(self, handle: StorageHandle) -> R_co:
        """The backend resource for the byte range ``handle``."""
        ...

    def storage_ids(self) -> Iterator[int]:
        """The ids of the live allocations."""
        ...


_FREE_OFF_LOOP: Final = 1 << 20
"""Pages at least this large are freed on a background thread."""


class _Reaper:
    """A daemon thread that drops what it is given (so the memory is freed there)."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[list[object]] = queue.SimpleQueue()
        _thread.start_new_thread(self._run, ())

    def put(self, box: list[object]) -> None:
        """Hand over a list holding the only references to what must be dropped."""
        self._queue.put(box)

    def _run(self) -> None:
        get = self._queue.get
        while True:
            get().clear()


_REAPER: list[_Reaper] = []


def _reaper() -> _Reaper:
    if not _REAPER:
        _REAPER.append(_Reaper())
    return _REAPER[0]


class BytesStorage:
    """Host storage: each page is a numpy ``uint8`` array, aligned to ``alignment``.

    Args:
        alignment: Page alignment in bytes (a power of two; 64 by default, a cache line).
        limit: Optional cap on the total bytes allocated; past it ``alloc`` raises
            :class:`StorageOutOfMemory` (useful to bound a host server and in tests).
    """

    def __init__(self, alignment: int = 64, limit: int | None = None) -> None:
        if alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"alignment must be a power of two, got {alignment}")
        self.alignment = alignment
        self.max_alloc: int | None = limit
        self.limit = limit
        self.allocated = 0
        self._pages: dict[int, HostResource] = {}
        self._ids = itertools.count(1)

    def __repr__(self) -> str:
        return f"BytesStorage(pages={len(self._pages)}, allocated={self.allocated})"

    def alloc(self, size: int) -> StorageHandle:
        """Allocate an aligned page of ``size`` bytes (uninitialised, like ``empty``)."""
        if self.limit is not None and self.allocated + size > self.limit:
            raise StorageOutOfMemory(size, f"host storage limit of {self.limit} bytes")
        try:
            raw = np.empty(size + self.alignment, dtype=np.uint8)
        except (MemoryError, ValueError) as exc:
            raise StorageOutOfMemory(size, str(exc)) from exc
        skip = -raw.ctypes.data % self.alignment
        sid = next(self._ids)
        self._pages[sid] = raw[skip : skip + size]
        self.allocated += size
        return StorageHandle(sid, 0, size)

    def dealloc(self, storage_id: int) -> None:
        """Drop page ``storage_id``.

        Freeing a large page returns it to the OS, which takes milliseconds; the page
        goes to a background thread for that, since this runs on the event loop.
        """
        if storage_id not in self._pages:
            return
        box: list[object] = [self._pages.pop(storage_id)]  # the only reference
        size = self._page_size(box)
        self.allocated -= size
        if size >= _FREE_OFF_LOOP:
            _reaper().put(box)

    @staticmethod
    def _page_size(box: list[object]) -> int:
        page = box[0]
        assert isinstance(page, np.ndarray)
        return int(page.size)

    def resource(self, handle: StorageHandle) -> HostResource:
        """A writable ``uint8`` view of ``handle``'s bytes."""
        return self._pages[handle.id][handle.offset : handle.offset + handle.size]

    def storage_ids(self) -> Iterator[int]:
        """Ids of the live pages."""
        return iter(list(self._pages))


MAX_RUN_CHUNKS: Final = 16
"""The most chunks one physical allocation of an expandable range backs (32 MiB of
2 MiB chunks)."""

RUN_SHARE: Final = 8
"""A run of ``n`` chunks mapped in one call is backed by allocations of ``n // 8``
chunks (at least 1, at most :data:`MAX_RUN_CHUNKS`). On an H200 a mapping costs ~50 µs
whatever its size (``cuMemCreate`` + ``cuMemMap`` + ``cuMemSetAccess``) and an
unmapping ~45 µs (``benchmarks/profile_vmm.py``): a chunk apiece made a 64 MiB growth
32 of each, 1.5 ms on the loop; in allocations of 4 chunks it is 8. An allocation is
given back only whole, so larger ones keep free chunks mapped beside live ones: on the
churn of ``benchmarks/bench_memory_churn.py`` (256 KiB to 32 MiB), a share of 8 keeps
peak reserved at 1.06 of peak in use (4: 1.14; a fixed 16 chunks: 1.23), and on a churn
of 1 to 256 MiB it cuts the driver's calls 3.4 times for 1.05 (a chunk apiece: 1.02)."""


class ChunkAllocations:
    """Which physical allocation backs each mapped chunk of a range (the bookkeeping of
    :class:`DryChunks` and CUDA's ``VirtualRange``, which map and unmap alike).

    A run mapped in one call is split into allocations of an eighth of it, at most
    ``max_run`` chunks (:meth:`split`, :data:`RUN_SHARE`); an allocation is released
    only whole, so unmapping a run releases the allocations inside it and keeps the
    chunks of those reaching past it (:meth:`release_plan`)."""

    def __init__(self, max_run: int = MAX_RUN_CHUNKS) -> None:
        if max_run < 1:
            raise ValueError(f"an allocation backs at least one chunk, not {max_run}")
        self.max_run = max_run
        self.runs: dict[int, int] = {}  # first chunk of an allocation -> its chunks
        self._start: dict[int, int] = {}  # chunk -> the first chunk of its allocation

    def split(self, first: int, count: int) -> list[tuple[int, int]]:
        """The allocations a run of ``count`` chunks from ``first`` is mapped with."""
        step = max(1, min(self.max_run, count // RUN_SHARE))
        return [(a, min(step, first + count - a)) for a in range(first, first + count, step)]

    def add(self, first: int, count: int) -> None:
        """Record an allocation backing chunks ``[first, first + count)``."""
        self.runs[first] = count
        for i in range(first, first + count):
            self._start[i] = first

    def remove(self, first: int) -> int:
        """Forget the allocation starting at chunk ``first``; its chunk count."""
        count = self.runs.pop(first)
        for i in range(first, first + count):
            del self._start[i]
        return count

    def release_plan(
        self, first: int, count: int
    ) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """``(released, kept)`` for unmapping chunks ``[first, first + count)``: the
        allocations wholly inside it, and the runs of its chunks whose allocation
        reaches past it (they stay mapped); chunks not mapped are skipped."""
        end = first + count
        released: list[tuple[int, int]] = []
        kept: list[tuple[int, int]] = []
        i = first
        while i < end:
            start = self._start.get(i)
            if start is None:  # not mapped: nothing to give back
                i += 1
                continue
            size = self.runs[start]
            stop = min(start + size, end)
            if start >= first and start + size <= end:
                released.append((start, size))
            elif kept and kept[-1][0] + kept[-1][1] == i:
                kept[-1] = (kept[-1][0], kept[-1][1] + stop - i)
            else:
                kept.append((i, stop - i))
            i = stop
        return released, kept

    def releasable(self, first: int, count: int) -> list[tuple[int, int]]:
        """The runs of ``[first, first + count)`` an unmap gives back: the allocations
        wholly inside it, adjacent ones merged."""
        runs: list[tuple[int, int]] = []
        for start, size in self.release_plan(first, count)[0]:
            if runs and runs[-1][0] + runs[-1][1] == start:
                runs[-1] = (runs[-1][0], runs[-1][1] + size)
            else:
                runs.append((start, size))
        return runs


class DryChunks:
    """A ``ChunkBackend`` (:mod:`.expandable`) that maps nothing: chunks are only
    counted (a dry run's, the tests', the host side of the churn benchmark), in
    allocations as CUDA's range makes them (:class:`ChunkAllocations`). Unmapping
    finishes at once.

    Args:
        handle: The range (its storage id and size).
        granularity: The chunk size it stands for (2 MiB: the CUDA devices' minimum).
        max_run: The most chunks one allocation backs.
    """

    def __init__(
        self, handle: StorageHandle, granularity: int = 2 << 20, max_run: int = MAX_RUN_CHUNKS
    ) -> None:
        self.handle = handle
        self.granularity = granularity
        self.allocations = ChunkAllocations(max_run)
        self.mapped = 0
        self.maps = 0
        self.unmaps = 0
        self._done: deque[tuple[int, int]] = deque()

    def map(self, first: int, count: int) -> None:
        """Count ``count`` chunks as mapped, in allocations as :meth:`ChunkAllocations.split`
        makes them."""
        for start, size in self.allocations.split(first, count):
            self.allocations.add(start, size)
            self.maps += 1
        self.mapped += count

    def unmap(self, first: int, count: int) -> list[tuple[int, int]]:
        """Count the allocations inside ``[first, first + count)`` as unmapped (done at
        once); the runs kept mapped (their allocation reaches past it)."""
        released, kept = self.allocations.release_plan(first, count)
        for start, size in released:
            self.mapped -= self.allocations.remove(start)
            self.unmaps += 1
            self._done.append((start, size))
        return kept

    def unmapped(self) -> list[tuple[int, int]]:
        """The runs unmapped since the last call."""
        done = list(self._done)
        self._done.clear()
        return done

    def releasable(self, first: int, count: int) -> list[tuple[int, int]]:
        """The runs of ``[first, first + count)`` :meth:`unmap` would give back."""
        return self.allocations.releasable(first, count)


_ZERO: Final = np.zeros(1, np.uint8)
_ZERO.flags.writeable = False


class DryStorage:
    """A storage that maps nothing: pages are sizes and ids, accounted like real ones
    (a dry run's memory goes through the same pools, without using any).

    ``resource`` is a read-only view of zeros of the range's size, backed by one byte.

    Args:
        alignment: The alignment of the storage it stands for (64 host, 512 CUDA).
        max_alloc: The largest allocation of the device it stands for (None: unknown).
        ranges: It stands for a storage with virtual memory (CUDA's): expandable
            ranges are reserved (:meth:`reserve_range`, chunks counted, not mapped).
    """

    def __init__(
        self, alignment: int = 64, max_alloc: int | None = None, *, ranges: bool = False
    ) -> None:
        self.alignment = alignment
        self.max_alloc = max_alloc
        self.allocated = 0
        self._pages: dict[int, int] = {}
        self._ids = itertools.count(1)
        if ranges:
            self.reserve_range = self._reserve_range

    def _reserve_range(self, size: int) -> DryChunks:
        """A range of ``size`` bytes (whole 2 MiB chunks) that maps nothing."""
        chunks = DryChunks(StorageHandle(0, 0, 0))
        size = -(-size // chunks.granularity) * chunks.granularity
        sid = next(self._ids)
        self._pages[sid] = 0  # its chunks are counted by the pool, not here
        chunks.handle = StorageHandle(sid, 0, size)
        return chunks

    def __repr__(self) -> str:
        return f"DryStorage(pages={len(self._pages)}, allocated={self.allocated})"

    def alloc(self, size: int) -> StorageHandle:
        """Account a page of ``size`` bytes (nothing is mapped)."""
        sid = next(self._ids)
        self._pages[sid] = size
        self.allocated += size
        return StorageHandle(sid, 0, size)

    def dealloc(self, storage_id: int) -> None:
        """Forget page ``storage_id``."""
        self.allocated -= self._pages.pop(storage_id, 0)

    def resource(self, handle: StorageHandle) -> HostResource:
        """A read-only view of ``handle.size`` zeros (no memory behind it)."""
        return np.broadcast_to(_ZERO, (handle.size,))

    def storage_ids(self) -> Iterator[int]:
        """Ids of the pages accounted."""
        return iter(list(self._pages))
