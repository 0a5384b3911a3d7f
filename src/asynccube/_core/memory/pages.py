"""What every pool is made of: pages, slices, the free-slice buckets, the pool report,
and the base class of the pools (see :mod:`.pools` for how the pools use them)."""

from __future__ import annotations

import itertools
from bisect import bisect_left, insort
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final, Protocol

from ..values.types import MemoryUsage
from .storage import ComputeStorage, StorageHandle

__all__ = [
    "DEAD",
    "FREE",
    "NO_LIMIT",
    "OwningPool",
    "Page",
    "PoolBase",
    "PoolReport",
    "Slice",
    "SliceBuckets",
]

FREE: Final = -1
"""``Slice.used`` of a free slice."""
DEAD: Final = -2
"""``Slice.used`` of a slice merged into its neighbour or whose page was released."""
NO_LIMIT: Final = 1 << 62
"""A best-fit limit that accepts any larger slice."""


class OwningPool(Protocol):
    """The pool a slice belongs to, as the slice's holders see it (any of :mod:`.pools`)."""

    def release(self, sl: Slice) -> None:
        """Take the live slice ``sl`` back (free it in its pool)."""


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

    def __init__(
        self, sid: int, pool: OwningPool, page: Page, offset: int, size: int, used: int
    ) -> None:
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
        max_total: The pool's cap on the bytes of its pages, ``None`` when uncapped.
        reserved_peak: The most bytes of pages the pool held at once.
        pages_allocated: Pages the pool has taken from the storage so far (each one an
            allocation from the device or host).
    """

    kind: str
    max_alloc_size: int
    page_size: int | None
    usage: MemoryUsage
    pages: int
    pages_peak: int
    largest_allocation: int
    max_total: int | None = None
    reserved_peak: int = 0
    pages_allocated: int = 0


class SliceBuckets:
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


class PoolBase:
    """What every pool shares: accounting of pages and the alignment."""

    kind = "pool"
    max_alloc_size: int
    page_size: int | None = None
    max_total: int | None = None
    """A cap on the bytes of the pool's pages (the manager spills past it)."""

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
        self.reserved_peak = 0
        self.pages_allocated = 0

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
        self.reserved_peak = max(self.reserved_peak, self.reserved)
        self.pages_allocated += 1
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
            self.max_total,
            self.reserved_peak,
            self.pages_allocated,
        )

    def free_room(self, storage: ComputeStorage[object]) -> None:
        """Give back every empty page (a capped pool makes room before it spills)."""
        for page in self.empty_pages():
            self.drop_empty_page(storage, page)

    def empty_pages(self) -> list[Page]:
        """The pages with no live slice."""
        return []

    def drop_empty_page(self, storage: ComputeStorage[object], page: Page) -> None:
        """Give the empty ``page`` back to the storage."""
        raise NotImplementedError

    def release_all(self, storage: ComputeStorage[object]) -> None:
        """Give every page back to the storage (the manager is closing)."""
        for sl in list(self.slices()):
            self._kill(sl)
        for page in list(self.pages.values()):
            self._drop_page(storage, page)
