"""The sliced pool: fixed-size pages carved into slices, split on demand and coalesced
lazily (see :mod:`.pools`)."""

from __future__ import annotations

from collections.abc import Iterator

from .chain import ChainedPool
from .pages import FREE, NO_LIMIT, Page, Slice
from .storage import ComputeStorage

__all__ = ["SlicedPool"]


class SlicedPool(ChainedPool):
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
        self._start_chain()
        self._page = self.extent(page_size)
        self.page_size = self._page

    def try_reserve(self, size: int) -> Slice | None:
        """A free slice for ``size`` bytes, or ``None`` if the pool must grow."""
        ext = ((size + self._mask) & self._nmask) or self.alignment
        bucket = self._free.get(ext)
        if bucket:
            sl = bucket.pop()
            sl.used = size
            return sl
        return self._fit(size, ext)

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

    def prefill(self, storage: ComputeStorage[object], nbytes: int) -> None:
        """Map ``nbytes`` of pages (rounded up to whole pages) before any request."""
        for _ in range(-(-nbytes // self._page)):
            page = self._new_page(storage, self._page)
            head = self._new_slice(page, 0, self._page, FREE)
            page.head = head
            self._buckets.add(head)

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
        sl = self._buckets.best_fit(ext, NO_LIMIT)
        if sl is None and self._dirty:
            self.coalesce()
            sl = self._buckets.best_fit(ext, NO_LIMIT)
        return None if sl is None else self._split(sl, size, ext)

    def cleanup(self, storage: ComputeStorage[object], alloc_count: int, explicit: bool) -> None:
        """On an explicit cleanup, coalesce and give back every page with no live slice."""
        if not explicit:
            return
        for page in self.empty_pages():
            self.drop_empty_page(storage, page)
