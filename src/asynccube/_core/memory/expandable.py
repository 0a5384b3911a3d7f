"""The expandable pool: one reserved virtual range, backed by physical chunks on demand.

PyTorch's ``expandable_segments`` and the virtual-memory pool drafted for cubecl-runtime
(``memory_pool/expandable_pool.rs``, later ``virtual_pool.rs``) reserve a large range of
device addresses once and map physical memory into it in chunks of the driver's
allocation granularity. A request that fits no free slice grows the range *in place*:
the free space at its end (or a hole) is extended by mapping the chunks it lacks,
instead of adding a segment (page) beside the others. Free neighbours merge into one
slice whatever their chunks, so a workload whose sizes keep changing does not fragment
into pages that each hold a little: the bytes reserved are the chunks mapped, and only
chunks some live slice overlaps need to stay mapped.

How it is laid out
    The range ``[0, bound)`` is split into slices, linked in offset order from one
    :class:`~.pages.Page` standing for the whole range (so a slice's storage handle is
    the range's id and the slice's offset, as for any pool). At first it is one free
    slice. Each chunk (``granularity`` bytes) is unmapped, mapped, or releasing (handed
    to the backend to unmap, not yet done); every chunk a live slice overlaps is mapped.

Reserve (no driver call)
    :meth:`ExpandablePool.try_reserve` takes the smallest free slice that fits and whose
    chunks under the request are all mapped, split at the request's end.

Grow (the slow path, :meth:`ExpandablePool.alloc`)
    Among the free slices that fit, the one needing the fewest chunks mapped (then the
    smallest, then the lowest) is taken; chunks still being released are never placed
    on. :meth:`~ExpandablePool.page_size_for` (called by the manager first) plans that
    placement and says how many bytes it maps, so the manager's ``cache_ratio`` trim
    and a ``max_total`` cap count only what the growth adds, and never release the
    chunks it is about to use.

Give back
    Free chunks (mapped, overlapped by no live slice) are what the manager's policies
    release: each maximal run of them is an "empty page" (:meth:`empty_pages`), so the
    ``cache_ratio`` trim before growth, the ``high_water`` bound, an explicit
    ``memory_cleanup`` and the out-of-memory retry work as for the other pools. On its
    own, the pool releases the free chunks at the tail of what it maps (past the last
    live slice) once they stayed free for a whole periodic check (the manager's tick).

The backend
    The pool never calls the driver: a :class:`ChunkBackend` maps and unmaps chunks
    (``cuMemCreate``/``cuMemMap``/``cuMemSetAccess`` and ``cuMemUnmap``/``cuMemRelease``
    on CUDA, :class:`DryChunks` for a dry run and tests). Unmapping may synchronise the
    device, so a backend may finish it later, on a thread of its own: the pool marks
    those chunks releasing until :meth:`ChunkBackend.unmapped` reports them done.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator
from typing import Final, NamedTuple, Protocol, runtime_checkable

from ..values.types import MemoryUsage
from .chain import ChainedPool
from .pages import FREE, Page, Slice
from .storage import ComputeStorage, DryChunks, StorageHandle, StorageOutOfMemory

__all__ = [
    "MAPPED",
    "RELEASING",
    "UNMAPPED",
    "ChunkBackend",
    "DryChunks",
    "ExpandablePool",
    "MapFailed",
    "RangeStorage",
]

UNMAPPED: Final = 0
"""A chunk with no physical memory behind it."""
MAPPED: Final = 1
"""A chunk backed by physical memory, accessible to the device."""
RELEASING: Final = 2
"""A chunk handed to the backend to unmap, not yet reported done."""

_FIT_SCAN: Final = 8
"""Free slices :meth:`ExpandablePool.try_reserve` looks at before it leaves the request
to the slow path (a slice whose chunks are not all mapped is skipped)."""


class MapFailed(Exception):
    """Raised by :meth:`ChunkBackend.map`: the first ``mapped`` chunks asked for are
    mapped (and accessible), the next one failed with ``cause``."""

    def __init__(self, mapped: int, cause: BaseException) -> None:
        super().__init__(f"mapped {mapped} chunk(s), then: {cause}")
        self.mapped = mapped
        self.cause = cause


@runtime_checkable
class ChunkBackend(Protocol):
    """Physical memory behind one reserved range (CUDA's virtual memory API).

    Attributes:
        handle: The range as a storage handle: its storage id (which the storage
            resolves resources of), offset 0, and its size in bytes (whole chunks).
        granularity: The size of a chunk, in bytes (a multiple of the alignment).
    """

    handle: StorageHandle
    granularity: int

    def map(self, first: int, count: int) -> None:
        """Back chunks ``[first, first + count)`` with physical memory, accessible to
        the device; :class:`MapFailed` says how many were mapped before a failure
        (its cause a :class:`~.storage.StorageOutOfMemory` when memory ran out)."""
        ...

    def unmap(self, first: int, count: int) -> list[tuple[int, int]]:
        """Give back the physical memory of chunks ``[first, first + count)`` (no
        device work may still use them); may finish later (see :meth:`unmapped`).
        Returns the ``(first, count)`` runs it keeps mapped: chunks whose physical
        allocation reaches past the run (it is given back only whole)."""
        ...

    def unmapped(self) -> list[tuple[int, int]]:
        """The ``(first, count)`` runs whose unmapping finished since the last call."""
        ...

    def releasable(self, first: int, count: int) -> list[tuple[int, int]]:
        """The ``(first, count)`` runs of chunks ``[first, first + count)`` that
        :meth:`unmap` would give back (the physical allocations wholly inside it,
        adjacent ones merged)."""
        ...


class RangeStorage(Protocol):
    """A storage that can reserve expandable ranges (the CUDA storage, a dry one)."""

    def reserve_range(self, size: int) -> ChunkBackend:
        """A new range of at least ``size`` bytes (whole chunks), nothing mapped; the
        storage frees it (all of it unmapped, its addresses released) on
        ``dealloc(range.handle.id)``."""
        ...


class _Plan(NamedTuple):
    """A growth planned by :meth:`ExpandablePool.page_size_for`."""

    size: int
    slice: Slice
    offset: int
    cost: int  # chunks to map


class ExpandablePool(ChainedPool):
    """One reserved range of addresses carved into slices; chunks mapped on demand.

    Args:
        backend: The range and its physical memory (see :class:`ChunkBackend`).
        max_alloc_size: The largest request accepted (at most the range).
        alignment: The storage alignment; slices start and end on it.
    """

    kind = "expandable"
    dirty_tails = True  # a free neighbour after a split's tail merges on the next pass

    def __init__(
        self,
        backend: ChunkBackend,
        max_alloc_size: int,
        alignment: int,
        registry: dict[int, Slice] | None = None,
        ids: Iterator[int] | None = None,
    ) -> None:
        gran = backend.granularity
        if gran <= 0 or gran % alignment or backend.handle.size % gran:
            raise ValueError(
                f"a range of {backend.handle.size} bytes in chunks of {gran} bytes does not "
                f"fit an alignment of {alignment}"
            )
        super().__init__(min(max_alloc_size, backend.handle.size), alignment, registry, ids)
        self._start_chain()
        self.backend = backend
        self.granularity = gran
        self.state = bytearray(backend.handle.size // gran)
        self.mapped_chunks = 0
        self.releasing_chunks = 0
        self._plan: _Plan | None = None
        self._idle_tail: int | None = None  # the tail's first free chunk at the last tick
        self.range_page = Page(backend.handle)
        head = self._new_slice(self.range_page, 0, backend.handle.size, FREE)
        self.range_page.head = head
        self.pages[backend.handle.id] = self.range_page
        self.pages_peak = 1
        self._buckets.add(head)

    def __repr__(self) -> str:
        return (
            f"ExpandablePool(range={self.backend.handle.size}, chunk={self.granularity}, "
            f"mapped={self.mapped_chunks}, releasing={self.releasing_chunks})"
        )

    # -- chunks -------------------------------------------------------------------------

    def _chunks(self, offset: int, size: int) -> tuple[int, int]:
        """The chunks ``[a, b)`` that bytes ``[offset, offset + size)`` touch."""
        g = self.granularity
        return offset // g, -(-(offset + size) // g)

    def _account(self) -> None:
        self.reserved = (self.mapped_chunks + self.releasing_chunks) * self.granularity
        self.reserved_peak = max(self.reserved_peak, self.reserved)

    def collect(self) -> None:
        """Mark the chunks the backend finished unmapping as unmapped."""
        state = self.state
        for first, count in self.backend.unmapped():
            for i in range(first, first + count):
                if state[i] == RELEASING:
                    state[i] = UNMAPPED
                    self.releasing_chunks -= 1
        self._account()

    def _map(self, a: int, b: int) -> None:
        """Map every unmapped chunk of ``[a, b)`` (none is releasing), run by run."""
        for first, count in _runs(self.state, UNMAPPED, a, b):
            try:
                self.backend.map(first, count)
            except MapFailed as failed:
                self._mark_mapped(first, failed.mapped)
                raise failed.cause from None
            self._mark_mapped(first, count)

    def _mark_mapped(self, first: int, count: int) -> None:
        self.state[first : first + count] = bytes([MAPPED]) * count
        self.mapped_chunks += count
        self.pages_allocated += count
        self._account()

    def _unmap(self, first: int, count: int) -> None:
        """Hand mapped chunks ``[first, first + count)`` to the backend to release (the
        runs it keeps, their allocation reaching past them, stay mapped and free)."""
        self.state[first : first + count] = bytes([RELEASING]) * count
        self.mapped_chunks -= count
        self.releasing_chunks += count
        for a, n in self.backend.unmap(first, count):
            self.state[a : a + n] = bytes([MAPPED]) * n
            self.mapped_chunks += n
            self.releasing_chunks -= n
        self.collect()

    def _all_mapped(self, offset: int, size: int) -> bool:
        a, b = self._chunks(offset, size)
        return self.state.count(MAPPED, a, b) == b - a

    # -- the hot path ----------------------------------------------------------------

    def try_reserve(self, size: int) -> Slice | None:
        """A free slice for ``size`` bytes whose chunks are mapped, or ``None``."""
        ext = ((size + self._mask) & self._nmask) or self.alignment
        bucket = self._free.get(ext)
        if bucket:
            sl = bucket[-1]
            if self._all_mapped(sl.offset, ext):
                bucket.pop()
                sl.used = size
                return sl
        fit = self._mapped_fit(ext)
        return None if fit is None else self._split(fit, size, ext)

    def _mapped_fit(self, ext: int) -> Slice | None:
        """Pop the smallest of the first few free slices of at least ``ext`` bytes whose
        chunks under ``ext`` are mapped (emptied buckets met on the way are dropped, as
        the buckets' own best fit drops them)."""
        sizes, free = self._buckets.sizes, self._free
        i = bisect_left(sizes, ext)
        looked = 0
        while i < len(sizes) and looked < _FIT_SCAN:
            key = sizes[i]
            bucket = free[key]
            if not bucket:
                del sizes[i]
                del free[key]
                continue
            for k, sl in enumerate(bucket):
                if self._all_mapped(sl.offset, ext):
                    del bucket[k]
                    return sl
                looked += 1
                if looked >= _FIT_SCAN:
                    return None
            i += 1
        return None

    # -- growing ------------------------------------------------------------------------

    def page_size_for(self, size: int) -> int:
        """The bytes the growth for ``size`` maps (its placement is planned here, and
        kept for :meth:`alloc`; :meth:`empty_pages` never offers its chunks)."""
        plan = self._placement(size)
        return 0 if plan is None else plan.cost * self.granularity

    def _placement(self, size: int) -> _Plan | None:
        """Where ``size`` goes: in the free slice needing the fewest chunks mapped (then
        the smallest, then the lowest), at its start or, where chunks under it are
        still being released, just past them; ``None`` when no free slice fits."""
        self.coalesce()
        self.collect()
        ext = self.extent(size)
        best: tuple[int, int, int] | None = None
        plan: _Plan | None = None
        sizes, free = self._buckets.sizes, self._free
        for key in sizes[bisect_left(sizes, ext) :]:
            for sl in free[key]:
                offset = self._clear_offset(sl, ext)
                if offset < 0:
                    continue
                a, b = self._chunks(offset, ext)
                rank = (self.state.count(UNMAPPED, a, b), sl.size, offset)
                if best is None or rank < best:
                    best, plan = rank, _Plan(size, sl, offset, rank[0])
        self._plan = plan
        return plan

    def _clear_offset(self, sl: Slice, ext: int) -> int:
        """The lowest offset in free slice ``sl`` where ``ext`` bytes touch no chunk
        being released, or -1."""
        offset, end, g = sl.offset, sl.offset + sl.size, self.granularity
        while offset + ext <= end:
            a, b = self._chunks(offset, ext)
            busy = self.state.rfind(RELEASING, a, b)
            if busy < 0:
                return offset
            offset = (busy + 1) * g
        return -1

    def alloc(self, storage: ComputeStorage[object], size: int) -> Slice:
        """Grow in place: map the chunks the planned (or best) placement lacks, and
        carve the request there.

        Raises:
            StorageOutOfMemory: no free slice of the range fits (the range is full), or
                the backend ran out of memory (the chunks it mapped stay, free).
        """
        plan, self._plan = self._plan, None
        if plan is None or not self._still_free(plan):
            plan = self._placement(size)
            self._plan = None
        if plan is None:
            raise StorageOutOfMemory(
                size,
                f"the expandable range of {self.backend.handle.size} bytes has no free room "
                f"of {self.extent(size)} bytes",
            )
        ext = self.extent(size)
        self._map(*self._chunks(plan.offset, ext))
        sl = plan.slice
        self._buckets.remove(sl)
        if plan.offset > sl.offset:  # past chunks being released: the head stays free
            head = self._split(sl, FREE, plan.offset - sl.offset)
            self._buckets.add(head)
            self._dirty.append(head)
            sl = head.next  # type: ignore[assignment]
            self._buckets.remove(sl)
        return self._split(sl, size, ext)

    def _still_free(self, plan: _Plan) -> bool:
        """The planned slice is still free and its place clear (nothing ran between)."""
        sl = plan.slice
        if sl.used != FREE or not any(x is sl for x in self._free.get(sl.size, ())):
            return False
        return self._clear_offset(sl, self.extent(plan.size)) == plan.offset

    # -- giving back ------------------------------------------------------------------

    def free_runs(self) -> list[tuple[int, int]]:
        """``(first, count)`` of each maximal run of free chunks: mapped, and inside a
        free slice (so no live slice overlaps them), coalescing first."""
        self.coalesce()
        self.collect()
        runs: list[tuple[int, int]] = []
        g = self.granularity
        sl = self.range_page.head
        while sl is not None:
            if sl.used == FREE:
                a, b = -(-sl.offset // g), (sl.offset + sl.size) // g
                runs += _runs(self.state, MAPPED, a, b)
            sl = sl.next
        return runs

    def empty_pages(self) -> list[Page]:
        """Each run of free chunks the backend can give back as a page (its handle: the
        range's id, the run's offset and size), but the chunks a planned growth will
        use: a run's chunks whose physical allocation reaches a live slice stay mapped,
        so they are not offered (the manager's trims count what a page gives back)."""
        g, rid, backend = self.granularity, self.backend.handle.id, self.backend
        keep: tuple[int, int] = (0, 0)
        if self._plan is not None:
            keep = self._chunks(self._plan.offset, self.extent(self._plan.size))
        pages = []
        for first, count in self.free_runs():
            for lo, hi in _outside(first, first + count, keep):
                for a, n in backend.releasable(lo, hi - lo):
                    pages.append(Page(StorageHandle(rid, a * g, n * g)))
        return pages

    def drop_empty_page(self, storage: ComputeStorage[object], page: Page) -> None:
        """Release the chunks of a run :meth:`empty_pages` offered."""
        g = self.granularity
        first, count = page.handle.offset // g, page.handle.size // g
        if self.state.count(MAPPED, first, first + count) == count:
            self._unmap(first, count)

    def release_free(self) -> int:
        """Release every free chunk (but those an allocation reaching a live slice
        keeps); the bytes given back."""
        before = self.mapped_chunks
        for first, count in self.free_runs():
            self._unmap(first, count)
        return (before - self.mapped_chunks) * self.granularity

    def tail_start(self) -> int:
        """The first chunk past the last live slice (every chunk from there is free)."""
        sl = self.range_page.head
        end = 0
        while sl is not None:
            if sl.used >= 0:
                end = sl.offset + sl.size
            sl = sl.next
        return -(-end // self.granularity)

    def release_tail(self, start: int) -> None:
        """Release the mapped chunks from chunk ``start`` on."""
        for first, count in _runs(self.state, MAPPED, start, len(self.state)):
            self._unmap(first, count)

    def tick(self, storage: ComputeStorage[object], alloc_count: int) -> None:
        """Periodic upkeep: coalesce once many releases are pending; release the free
        chunks at the tail that were free at the previous tick too."""
        super().tick(storage, alloc_count)
        self.cleanup(storage, alloc_count, False)

    def cleanup(self, storage: ComputeStorage[object], alloc_count: int, explicit: bool) -> None:
        """Release free chunks: all of them if ``explicit``, else those at the tail that
        stayed free since the last check."""
        self.coalesce()
        self.collect()
        if explicit:
            self.release_free()
            self._idle_tail = None
            return
        tail = self.tail_start()
        if self._idle_tail is not None:
            self.release_tail(max(tail, self._idle_tail))
        self._idle_tail = tail

    def usage(self) -> MemoryUsage:
        """As every pool's, the chunks whose release finished collected first."""
        self.collect()
        return super().usage()

    def free_room(self, storage: ComputeStorage[object]) -> None:
        """Release every free chunk but those of a planned growth (a capped pool)."""
        for page in self.empty_pages():
            self.drop_empty_page(storage, page)

    def release_all(self, storage: ComputeStorage[object]) -> None:
        """Forget every slice and have the storage free the range (its chunks and its
        addresses): the manager is closing or replacing its pools."""
        for sl in list(self.slices()):
            self._kill(sl)
        self.pages.clear()
        self._buckets.clear()
        self._dirty.clear()
        self._plan = None
        self.range_page.head = None
        self.state = bytearray(len(self.state))
        self.mapped_chunks = self.releasing_chunks = 0
        self.reserved = 0
        storage.dealloc(self.backend.handle.id)


def _runs(state: bytearray, value: int, a: int, b: int) -> list[tuple[int, int]]:
    """``(first, count)`` of each maximal run of chunks in state ``value`` within
    ``[a, b)`` (found with ``bytearray.find``: a range of thousands of chunks costs
    microseconds)."""
    others = [v for v in (UNMAPPED, MAPPED, RELEASING) if v != value]
    runs = []
    i = state.find(value, a, b)
    while i >= 0:
        ends = [e for e in (state.find(v, i, b) for v in others) if e >= 0]
        j = min(ends, default=b)
        runs.append((i, j - i))
        i = state.find(value, j, b) if j < b else -1
    return runs


def _outside(lo: int, hi: int, keep: tuple[int, int]) -> Iterator[tuple[int, int]]:
    """The parts of ``[lo, hi)`` outside ``[keep[0], keep[1])``."""
    if keep[1] <= lo or keep[0] >= hi:
        yield lo, hi
        return
    if lo < keep[0]:
        yield lo, keep[0]
    if keep[1] < hi:
        yield keep[1], hi
