"""How the memory manager builds its pools and routes a request to one of them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

from ..errors import MemoryLayoutError
from .config import (
    DirectPages,
    ExclusivePages,
    ExpandablePages,
    PersistentPages,
    PoolOptions,
    SlicedPages,
)
from .expandable import ExpandablePool
from .pools import DirectPool, ExclusivePool, PersistentPool, Pool, Slice, SlicedPool
from .storage import ComputeStorage

__all__ = ["build_persistent", "build_pool", "routing", "tick_period"]

TICK: Final = 1024
"""Allocation calls between two periodic cleanups at most."""


def build_pool(
    options: PoolOptions,
    alignment: int,
    registry: dict[int, Slice],
    ids: Iterator[int],
    storage: ComputeStorage[object],
) -> Pool:
    """The pool ``options`` stand for, its cap set (and its initial pages mapped)."""
    pool: Pool
    if isinstance(options, ExclusivePages):
        pool = ExclusivePool(
            options.max_alloc_size,
            alignment,
            options.dealloc_period,
            options.size_classes,
            options.max_waste,
            registry,
            ids,
        )
    elif isinstance(options, DirectPages):
        pool = DirectPool(options.max_alloc_size, alignment, storage, registry, ids)
    elif isinstance(options, ExpandablePages):
        pool = _expandable(options, alignment, registry, ids, storage)
    else:
        pool = SlicedPool(options.page_size, options.max_slice_size, alignment, registry, ids)
    pool.max_total = options.max_total
    if isinstance(pool, SlicedPool) and isinstance(options, SlicedPages):
        if options.max_total is not None:
            _check_cap(pool._page, options.max_total)
        if options.initial:
            pool.prefill(storage, options.initial)
    return pool


_DRY_VIRTUAL: Final = 1 << 40
"""The addresses an expandable range reserves where the storage does not know its
device's memory (1 TiB)."""


def _expandable(
    options: ExpandablePages,
    alignment: int,
    registry: dict[int, Slice],
    ids: Iterator[int],
    storage: ComputeStorage[object],
) -> ExpandablePool:
    """An expandable pool over a range the storage reserves.

    Raises:
        MemoryLayoutError: the storage has no virtual memory (the host server's).
    """
    reserve_range = getattr(storage, "reserve_range", None)
    if reserve_range is None:
        raise MemoryLayoutError(
            "the expandable pool needs the CUDA driver's virtual memory API (a reserved "
            "range of device addresses backed by physical chunks); the host server has "
            'none: use [memory] pool = "default" or "exclusive" on the host, and '
            '"expandable" for cuda:N only'
        )
    size = options.virtual_size
    if size is None:
        size = 2 * storage.max_alloc if storage.max_alloc else _DRY_VIRTUAL
    backend = reserve_range(size)
    return ExpandablePool(backend, options.max_alloc_size, alignment, registry, ids)


def _check_cap(page: int, cap: int) -> None:
    if cap < page:
        raise MemoryLayoutError(
            f"max_total={cap} is below one page once aligned for this device ({page} "
            "bytes); raise max_total"
        )


def build_persistent(
    options: PersistentPages | None,
    max_allocation: int,
    alignment: int,
    registry: dict[int, Slice],
    ids: Iterator[int],
) -> PersistentPool:
    """The persistent pool (uncapped, up to ``max_allocation``, when ``options`` is None)."""
    if options is None:
        return PersistentPool(max_allocation, alignment, registry, ids)
    pool = PersistentPool(min(options.max_alloc_size, max_allocation), alignment, registry, ids)
    pool.max_total = options.max_total
    return pool


def routing(pools: list[Pool]) -> tuple[list[int], list[Pool]]:
    """Ascending limits and their pools: the first pool (in order) accepting a size is
    the one at ``bisect_left(limits, size)``, as only a pool accepting more than every
    pool before it can be first for some size."""
    limits: list[int] = []
    routes: list[Pool] = []
    for pool in pools:
        if not limits or pool.max_alloc_size > limits[-1]:
            limits.append(pool.max_alloc_size)
            routes.append(pool)
    return limits, routes


def tick_period(pools: list[Pool]) -> int:
    """Allocation calls between two periodic cleanups."""
    periods = [p.check_period for p in pools if isinstance(p, ExclusivePool) and p.check_period]
    return min([*periods, TICK])
