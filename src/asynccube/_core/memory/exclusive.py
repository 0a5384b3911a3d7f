"""The exclusive pool (a page per slice, released after a period of disuse) and the
persistent pool (exact sizes, reused only for the same size); see :mod:`.pools`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

from .pages import FREE, NO_LIMIT, Page, PoolBase, Slice, SliceBuckets
from .storage import ComputeStorage

__all__ = ["DirectPool", "ExclusivePool", "PersistentPool"]

_IDLE_CHECKS: Final = 5
"""Exclusive pages are checked this many times per dealloc period (cubecl's count)."""


class ExclusivePool(PoolBase):
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
        self._buckets = SliceBuckets()
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
            limit = NO_LIMIT if waste is None else int(ext * (1 + waste))
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
        self._buckets.add(sl)
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


class DirectPool(PoolBase):
    """One storage allocation per slice, given back as soon as the slice is released
    (nothing cached). ``storage`` is where released pages go back to.
    """

    kind = "direct"
    check_period = None

    def __init__(
        self,
        max_alloc_size: int,
        alignment: int,
        storage: ComputeStorage[object],
        registry: dict[int, Slice] | None = None,
        ids: Iterator[int] | None = None,
    ) -> None:
        super().__init__(max_alloc_size, alignment, registry, ids)
        self._storage = storage

    def page_size_for(self, size: int) -> int:
        """The page allocated for a request of ``size`` bytes: its aligned size."""
        return self.extent(size)

    def try_reserve(self, size: int) -> Slice | None:
        """Always ``None``: a direct pool keeps no free page."""
        return None

    def release(self, sl: Slice) -> None:
        """Give the slice's page back to the storage at once."""
        self._kill(sl)
        self._drop_page(self._storage, sl.page)

    def alloc(self, storage: ComputeStorage[object], size: int) -> Slice:
        """Allocate a page of the request's aligned size."""
        page = self._new_page(storage, self.extent(size))
        sl = self._new_slice(page, 0, page.handle.size, size)
        page.head = sl
        return sl

    def tick(self, storage: ComputeStorage[object], alloc_count: int) -> None:
        """Nothing to do: no page is ever kept free."""

    def cleanup(self, storage: ComputeStorage[object], alloc_count: int, explicit: bool) -> None:
        """Nothing to do: no page is ever kept free."""
