"""Memory pools: how pages from a storage are carved into slices.

Three pools, as in cubecl-runtime:

- :class:`SlicedPool` carves fixed-size pages into slices. A free slice of exactly the
  (aligned) size asked for is reused first; otherwise the smallest free slice that is
  large enough is split. Free neighbours are coalesced lazily: releasing a slice only
  puts it back in its size bucket (the hot path), and the slices released since the last
  pass are merged with their free neighbours when a request finds no fit, before the
  pool grows by a page. Pages are given back to the storage by an explicit cleanup, or
  by the manager's ``cache_ratio`` policy when it grows (see :mod:`.config`).
- :class:`ExclusivePool` gives each slice a page of its own. Free pages are reused for
  requests they fit (within ``max_waste``) and released after a period of disuse counted
  in allocation calls.
- :class:`PersistentPool` allocates each slice exactly and reuses it only for a request
  of the same aligned size (weights, caches: allocated once, kept for long).

Every method runs on the memory manager's owner thread. The pools never see a
:class:`SliceHandle`: the slices register in the manager's table (id -> :class:`Slice`),
and a handle carries the id. An id names a slice for as long as the slice exists, across
reservations, so reserving a free slice again touches no table; ids are never shared
by two slices alive at once.
Free-slice lookups are dictionary hits on the aligned size, falling back to a bisection
over the sorted sizes present, so the reserve path allocates no big structure.
"""

from __future__ import annotations

import itertools
from bisect import bisect_left, insort
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from ..types import MemoryUsage
from .storage import ComputeStorage, StorageHandle

__all__ = ["ExclusivePool", "PersistentPool", "PoolReport", "Slice", "SlicedPool"]

FREE: Final = -1
"""``Slice.used`` of a free slice."""
DEAD: Final = -2
"""``Slice.used`` of a slice merged into its neighbour or whose page was released."""

_MAX_DIRTY: Final = 4096
"""Releases remembered for coalescing before a pass is forced (bounds the list)."""

_IDLE_CHECKS: Final = 5
"""Exclusive pages are checked this many times per dealloc period (cubecl's count)."""

_NO_LIMIT: Final = 1 << 62


class Page:
    """One storage allocation owned by a pool."""

    __slots__ = ("handle", "head", "idle")

    def __init__(self, handle: StorageHandle) -> None:
        self.handle = handle
        self.head: Slice | None = None
        self.idle = 0


class Slice:
    """A byte range of a page: live (``used`` >= 0 requested bytes), free, or dead.

    ``size`` is the extent (aligned, padding included). ``prev``/``next`` link the slices
    of a sliced page in offset order. ``id`` names the range for as long as it exists
    (across reservations: a freed slice keeps its id when it is reserved again), and is
    the key of the manager's registry; the slice leaves it when it dies (merged into a
    neighbour, or its page released).
    """

    __slots__ = ("id", "next", "offset", "page", "pool", "prev", "size", "used")

    def __init__(self, sid: int, pool: Pool, page: Page, offset: int, size: int, used: int) -> None:
        self.id = sid
        self.pool = pool
        self.page = page
        self.offset = offset
        self.size = size
        self.used = used
        self.prev: Slice | None = None
        self.next: Slice | None = None

    def __repr__(self) -> str:
        state = "free" if self.used == FREE else "dead" if self.used == DEAD else self.used
        return (
            f"Slice(page={self.page.handle.id}, offset={self.offset}, size={self.size}, "
            f"used={state})"
        )

    def storage_handle(self) -> StorageHandle:
        """The storage range of the live bytes (the requested size, padding excluded)."""
        base = self.page.handle
        return StorageHandle(base.id, base.offset + self.offset, self.used)


@dataclass(frozen=True, slots=True)
class PoolReport:
    """One pool's state.

    Attributes:
        kind: ``"sliced"``, ``"exclusive"`` or ``"persistent"``.
        max_alloc_size: The largest request the pool accepts.
        page_size: The page size of a sliced pool, ``None`` for the others.
        usage: The pool's memory usage.
        pages: Pages held now.
        pages_peak: The most pages held at once.
        largest_allocation: The largest live allocation, in requested bytes.
    """

    kind: str
    max_alloc_size: int
    page_size: int | None
    usage: MemoryUsage
    pages: int
    pages_peak: int
    largest_allocation: int


class _Buckets:
    """Free slices keyed by extent: exact hits by dict, best fit by bisection.

    Emptied buckets stay until a best-fit scan passes them, so the exact-hit path never
    touches the sorted list.
    """

    __slots__ = ("free", "sizes")

    def __init__(self) -> None:
        self.free: dict[int, list[Slice]] = {}
        self.sizes: list[int] = []

    def add(self, sl: Slice) -> None:
        bucket = self.free.get(sl.size)
        if bucket is None:
            self.free[sl.size] = [sl]
            insort(self.sizes, sl.size)
        else:
            bucket.append(sl)

    def remove(self, sl: Slice) -> None:
        self.free[sl.size].remove(sl)

    def best_fit(self, size: int, limit: int) -> Slice | None:
        """Pop the smallest free slice of extent in ``[size, limit]``."""
        sizes, free = self.sizes, self.free
        i = bisect_left(sizes, size)
        while i < len(sizes):
            key = sizes[i]
            if key > limit:
                return None
            bucket = free[key]
            if bucket:
                return bucket.pop()
            del sizes[i]
            del free[key]
        return None

    def clear(self) -> None:
        self.free.clear()
        self.sizes.clear()


class _PoolBase:
    """What every pool shares: accounting of pages and the alignment."""

    kind = "pool"
    max_alloc_size: int
    page_size: int | None = None

    def __init__(
        self,
        max_alloc_size: int,
        alignment: int,
        registry: dict[int, Slice] | None = None,
        ids: Iterator[int] | None = None,
    ) -> None:
        self.registry: dict[int, Slice] = {} if registry is None else registry
        self._ids = itertools.count(1) if ids is None else ids
        self.max_alloc_size = max_alloc_size
        self.alignment = alignment
        self._mask = alignment - 1
        self._nmask = -alignment
        self.pages: dict[int, Page] = {}
        self.pages_peak = 0
        self.reserved = 0

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(max_alloc_size={self.max_alloc_size}, "
            f"pages={len(self.pages)}, reserved={self.reserved})"
        )

    def accept(self, size: int) -> bool:
        """True if requests of ``size`` bytes belong to this pool."""
        return size <= self.max_alloc_size

    def extent(self, size: int) -> int:
        """``size`` rounded up to the alignment (a zero-byte request takes one unit)."""
        return ((size + self._mask) & self._nmask) or self.alignment

    def _new_slice(self, page: Page, offset: int, size: int, used: int) -> Slice:
        sl = Slice(next(self._ids), self, page, offset, size, used)  # type: ignore[arg-type]
        self.registry[sl.id] = sl
        return sl

    def _kill(self, sl: Slice) -> None:
        sl.used = DEAD
        self.registry.pop(sl.id, None)

    def _new_page(self, storage: ComputeStorage[object], size: int) -> Page:
        page = Page(storage.alloc(size))
        self.pages[page.handle.id] = page
        self.reserved += page.handle.size
        self.pages_peak = max(self.pages_peak, len(self.pages))
        return page

    def _drop_page(self, storage: ComputeStorage[object], page: Page) -> None:
        del self.pages[page.handle.id]
        self.reserved -= page.handle.size
        storage.dealloc(page.handle.id)

    def slices(self) -> Iterator[Slice]:
        """Every slice of the pool, free or live."""
        for page in self.pages.values():
            sl = page.head
            while sl is not None:
                yield sl
                sl = sl.next

    def usage(self) -> MemoryUsage:
        """Allocations, bytes requested, padding and page bytes of this pool."""
        live = [sl for sl in self.slices() if sl.used >= 0]
        in_use = sum(sl.used for sl in live)
        padding = sum(sl.size for sl in live) - in_use
        return MemoryUsage(len(live), in_use, padding, self.reserved)

    def report(self) -> PoolReport:
        """This pool's :class:`PoolReport`."""
        largest = max((sl.used for sl in self.slices()), default=0)
        return PoolReport(
            self.kind,
            self.max_alloc_size,
            self.page_size,
            self.usage(),
            len(self.pages),
            self.pages_peak,
            max(largest, 0),
        )

    def release_all(self, storage: ComputeStorage[object]) -> None:
        """Give every page back to the storage (the manager is closing)."""
        for sl in list(self.slices()):
            self._kill(sl)
        for page in list(self.pages.values()):
            self._drop_page(storage, page)


class SlicedPool(_PoolBase):
    """Pages of ``page_size`` bytes carved into slices of at most ``max_slice_size``.

    Args:
        page_size: The size of a page.
        max_slice_size: The largest request accepted. When it is larger than
            ``page_size``, a request that does not fit a page gets a page of its own,
            rounded up to a multiple of ``page_size``, whose free rest serves others.
        alignment: The storage alignment; slices start and end on it.
    """

    kind = "sliced"

    def __init__(
        self,
        page_size: int,
        max_slice_size: int,
        alignment: int,
        registry: dict[int, Slice] | None = None,
        ids: Iterator[int] | None = None,
    ) -> None:
        super().__init__(max_slice_size, alignment, registry, ids)
        self._page = self.extent(page_size)
        self.page_size = self._page
        self._buckets = _Buckets()
        self._free = self._buckets.free
        self._dirty: list[Slice] = []

    def try_reserve(self, size: int) -> Slice | None:
        """A free slice for ``size`` bytes, or ``None`` if the pool must grow."""
        ext = ((size + self._mask) & self._nmask) or self.alignment
        bucket = self._free.get(ext)
        if bucket:
            sl = bucket.pop()
            sl.used = size
            return sl
        return self._fit(size, ext)

    def release(self, sl: Slice) -> None:
        """Take back a slice whose last handle is gone."""
        sl.used = FREE
        bucket = self._free.get(sl.size)
        if bucket is None:
            self._buckets.add(sl)
        else:
            bucket.append(sl)
        self._dirty.append(sl)

    def page_size_for(self, size: int) -> int:
        """The page allocated when a request of ``size`` bytes finds no fit."""
        return -(-self.extent(size) // self._page) * self._page

    def alloc(self, storage: ComputeStorage[object], size: int) -> Slice:
        """Grow by one page and carve the request from it."""
        ext = self.extent(size)
        page_size = -(-ext // self._page) * self._page
        page = self._new_page(storage, page_size)
        head = self._new_slice(page, 0, page_size, FREE)
        page.head = head
        return self._split(head, size, ext)

    def empty_pages(self) -> list[Page]:
        """The pages with no live slice (coalescing first)."""
        self.coalesce()
        return [
            page
            for page in self.pages.values()
            if page.head is not None and page.head.used == FREE and page.head.next is None
        ]

    def drop_empty_page(self, storage: ComputeStorage[object], page: Page) -> None:
        """Give an empty page back to the storage."""
        head = page.head
        assert head is not None
        self._buckets.remove(head)
        self._kill(head)
        self._drop_page(storage, page)

    def _fit(self, size: int, ext: int) -> Slice | None:
        sl = self._buckets.best_fit(ext, _NO_LIMIT)
        if sl is None and self._dirty:
            self.coalesce()
            sl = self._buckets.best_fit(ext, _NO_LIMIT)
        return None if sl is None else self._split(sl, size, ext)

    def _split(self, sl: Slice, size: int, ext: int) -> Slice:
        rest = sl.size - ext
        if rest:
            tail = self._new_slice(sl.page, sl.offset + ext, rest, FREE)
            tail.prev, tail.next = sl, sl.next
            if sl.next is not None:
                sl.next.prev = tail
            sl.next = tail
            sl.size = ext
            self._buckets.add(tail)
        sl.used = size
        return sl

    def coalesce(self) -> None:
        """Merge every slice released since the last pass with its free neighbours."""
        dirty, self._dirty = self._dirty, []
        for sl in dirty:
            if sl.used == FREE:
                self._merge_run(sl)

    def _merge_run(self, sl: Slice) -> None:
        start = sl
        while start.prev is not None and start.prev.used == FREE:
            start = start.prev
        end = start.next
        if end is None or end.used != FREE:
            return
        buckets = self._buckets
        buckets.remove(start)
        while end is not None and end.used == FREE:
            buckets.remove(end)
            start.size += end.size
            self._kill(end)
            end = end.next
        start.next = end
        if end is not None:
            end.prev = start
        buckets.add(start)

    def tick(self, storage: ComputeStorage[object], alloc_count: int) -> None:
        """Periodic upkeep: coalesce once many releases are pending."""
        if len(self._dirty) > _MAX_DIRTY:
            self.coalesce()

    def cleanup(self, storage: ComputeStorage[object], alloc_count: int, explicit: bool) -> None:
        """On an explicit cleanup, coalesce and give back every page with no live slice."""
        if not explicit:
            return
        for page in self.empty_pages():
            self.drop_empty_page(storage, page)

    def release_all(self, storage: ComputeStorage[object]) -> None:
        super().release_all(storage)
        self._buckets.clear()
        self._dirty.clear()


class ExclusivePool(_PoolBase):
    """One slice per page; free pages are reused, and released after disuse.

    Args:
        max_alloc_size: The largest request accepted.
        alignment: The storage alignment.
        dealloc_period: Allocation calls after which an unused free page is released
            (``None``: only on an explicit cleanup).
        size_classes: New pages are rounded up to one of this many sizes per power of
            two, a power of two itself (0: to the alignment only).
        max_waste: A free page serves a request only if it is at most this fraction
            larger than the rounded request (``None``: any larger page).
    """

    kind = "exclusive"

    def __init__(
        self,
        max_alloc_size: int,
        alignment: int,
        dealloc_period: int | None = None,
        size_classes: int = 0,
        max_waste: float | None = None,
        registry: dict[int, Slice] | None = None,
        ids: Iterator[int] | None = None,
    ) -> None:
        super().__init__(max_alloc_size, alignment, registry, ids)
        if size_classes & (size_classes - 1):
            raise ValueError(f"size_classes must be 0 or a power of two, got {size_classes}")
        self.dealloc_period = dealloc_period
        self.check_period = (
            None if dealloc_period is None else max(1, dealloc_period // _IDLE_CHECKS)
        )
        self.size_classes = size_classes
        self._class_shift = size_classes.bit_length()
        self._class_min = alignment * size_classes
        self.max_waste = max_waste
        self._buckets = _Buckets()
        self._free = self._buckets.free
        self._lru: dict[Page, None] = {}
        self._last_check = 0

    def page_size_for(self, size: int) -> int:
        """The page allocated for a request of ``size`` bytes (its size class)."""
        ext = ((size + self._mask) & self._nmask) or self.alignment
        if self.size_classes and ext > self._class_min:
            step = 1 << (ext.bit_length() - self._class_shift)
            ext = (((ext + step - 1) & -step) + self._mask) & self._nmask
        return ext

    def try_reserve(self, size: int) -> Slice | None:
        """The smallest free page that fits ``size`` (within ``max_waste``), or ``None``."""
        ext = self.page_size_for(size)
        bucket = self._free.get(ext)
        if bucket:
            sl: Slice | None = bucket.pop()
        else:
            waste = self.max_waste
            limit = _NO_LIMIT if waste is None else int(ext * (1 + waste))
            sl = self._buckets.best_fit(ext, limit)
        if sl is None:
            return None
        sl.used = size
        page = sl.page
        page.idle = 0
        del self._lru[page]
        return sl

    def release(self, sl: Slice) -> None:
        """Take back a page whose last handle is gone."""
        sl.used = FREE
        bucket = self._free.get(sl.size)
        if bucket is None:
            self._buckets.add(sl)
        else:
            bucket.append(sl)
        self._lru[sl.page] = None

    def alloc(self, storage: ComputeStorage[object], size: int) -> Slice:
        """Allocate a page of the request's size class."""
        page = self._new_page(storage, self.page_size_for(size))
        sl = self._new_slice(page, 0, page.handle.size, size)
        page.head = sl
        return sl

    def empty_pages(self) -> list[Page]:
        """The free pages, least recently used first."""
        return list(self._lru)

    def drop_empty_page(self, storage: ComputeStorage[object], page: Page) -> None:
        """Give a free page back to the storage."""
        sl = page.head
        assert sl is not None
        self._buckets.remove(sl)
        self._kill(sl)
        del self._lru[page]
        self._drop_page(storage, page)

    def tick(self, storage: ComputeStorage[object], alloc_count: int) -> None:
        """Periodic upkeep: release pages idle for the dealloc period."""
        self.cleanup(storage, alloc_count, False)

    def cleanup(self, storage: ComputeStorage[object], alloc_count: int, explicit: bool) -> None:
        """Release free pages: all of them if ``explicit``, else those idle for a period."""
        if not explicit:
            if self.check_period is None or alloc_count - self._last_check < self.check_period:
                return
            self._last_check = alloc_count
        for page in list(self._lru):
            page.idle += 1
            if explicit or page.idle >= _IDLE_CHECKS:
                self.drop_empty_page(storage, page)

    def release_all(self, storage: ComputeStorage[object]) -> None:
        super().release_all(storage)
        self._buckets.clear()
        self._lru.clear()


class PersistentPool(ExclusivePool):
    """Exact-size slices, each its own allocation, reused only for the same size.

    Used while a persistent window is open (``MemoryAllocationMode.PERSISTENT``); free
    slices are released only by an explicit cleanup.
    """

    kind = "persistent"

    def __init__(
        self,
        max_alloc_size: int,
        alignment: int,
        registry: dict[int, Slice] | None = None,
        ids: Iterator[int] | None = None,
    ) -> None:
        super().__init__(max_alloc_size, alignment, None, 0, 0.0, registry, ids)

    def has_size(self, size: int) -> bool:
        """True if a free slice of exactly ``size``'s aligned size is held."""
        return bool(self._free.get(self.extent(size)))


Pool = SlicedPool | ExclusivePool
