"""How the memory manager grows a pool: release what dropped handles held, trim empty
pages (``cache_ratio``), respect the pool's cap (``max_total``: spill to the next pool
that accepts the size), and retry once after a cleanup when the storage is full."""

from __future__ import annotations

import logging
from bisect import bisect_left
from collections.abc import Callable

from ..errors import OutOfMemory
from .pools import PersistentPool, Pool, Slice
from .storage import ComputeStorage, StorageOutOfMemory

__all__ = ["Growth"]

logger = logging.getLogger("asynccube.memory")


class Growth:
    """The slow path of :class:`~.management.MemoryManagement` (a base class of it)."""

    __slots__ = ()

    storage: ComputeStorage[object]
    pools: list[Pool]
    persistent_pool: PersistentPool
    before_grow: Callable[[], object] | None
    _cache_ratio: float | None
    _high_water: int | None
    _limits: list[int]
    _routes: list[Pool]

    def _drain(self) -> None:
        raise NotImplementedError

    def _check_high_water(self) -> None:
        """After a growth: note whether the bytes reserved passed ``high_water``."""
        raise NotImplementedError

    def cleanup(self, explicit: bool) -> None:
        """Release unused pages (see the manager)."""
        raise NotImplementedError

    @property
    def bytes_reserved(self) -> int:
        """Bytes of all pages held."""
        return self.persistent_pool.reserved + sum(p.reserved for p in self.pools)

    def _grow(self, pool: Pool, size: int) -> Slice:
        if self.before_grow is not None:
            self.before_grow()
            self._drain()
            sl = pool.try_reserve(size)
            if sl is not None:
                return sl
        if self._cache_ratio is not None:
            self._trim(pool.page_size_for(size))
        return self._alloc_in(pool, size)

    def _alloc_in(self, pool: Pool, size: int) -> Slice:
        """A new page of ``pool`` for ``size``, or the next pool's when ``pool`` is
        capped and full."""
        cap = pool.max_total
        if cap is not None and pool.reserved + pool.page_size_for(size) > cap:
            pool.free_room(self.storage)
            if pool.reserved + pool.page_size_for(size) > cap:
                return self._spill(pool, size)
        try:
            sl = pool.alloc(self.storage, size)
        except StorageOutOfMemory as first:
            logger.info("storage out of memory for %d bytes; cleaning up and retrying", size)
            self.cleanup(explicit=True)
            try:
                return pool.alloc(self.storage, size)
            except StorageOutOfMemory as exc:
                reserved = self.bytes_reserved
                logger.warning("out of memory: %d bytes requested, %d reserved", size, reserved)
                raise OutOfMemory(size, reserved, exc.detail or first.detail) from exc
        if self._high_water is not None:
            self._check_high_water()
        return sl

    def _spill(self, full: Pool, size: int) -> Slice:
        """Serve ``size`` from the first pool after ``full`` (in routing order) that
        accepts it; the persistent pool spills to the ordinary routing."""
        if full is self.persistent_pool:
            target: Pool | None = self._routes[bisect_left(self._limits, size)]
        else:
            later = self.pools[self.pools.index(full) + 1 :]
            target = next((p for p in later if p.max_alloc_size >= size), None)
        if target is None:
            index = self.pools.index(full)
            raise OutOfMemory(
                size,
                self.bytes_reserved,
                f"pool {index} ({full.kind}) is at its cap (max_total={full.max_total}) and "
                f"no later pool accepts {size} bytes; raise its max_total, or add a pool "
                "after it for this size",
            )
        logger.debug("pool full (%s, cap %s); %d bytes spill", full.kind, full.max_total, size)
        return target.try_reserve(size) or self._alloc_in(target, size)

    def _trim(self, incoming: int) -> None:
        """Release empty pages, largest first, until those kept hold at most
        ``cache_ratio`` of the bytes of the other pages plus ``incoming``."""
        empty = [
            (page.handle.size, pool, page) for pool in self.pools for page in pool.empty_pages()
        ]
        empty_bytes = sum(e[0] for e in empty)
        keep = (self.bytes_reserved - empty_bytes + incoming) * (self._cache_ratio or 0.0)
        if empty_bytes <= keep:
            return
        empty.sort(key=lambda e: e[0], reverse=True)
        for page_bytes, pool, page in empty:
            pool.drop_empty_page(self.storage, page)
            empty_bytes -= page_bytes
            if empty_bytes <= keep:
                return
