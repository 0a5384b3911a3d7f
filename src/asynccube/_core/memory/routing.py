"""How the memory manager builds its pools and routes a request to one of them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

from .config import ExclusivePages, PoolOptions
from .pools import ExclusivePool, Pool, Slice, SlicedPool

__all__ = ["build_pool", "routing", "tick_period"]

TICK: Final = 1024
"""Allocation calls between two periodic cleanups at most."""


def build_pool(
    options: PoolOptions, alignment: int, registry: dict[int, Slice], ids: Iterator[int]
) -> Pool:
    if isinstance(options, ExclusivePages):
        return ExclusivePool(
            options.max_alloc_size,
            alignment,
            options.dealloc_period,
            options.size_classes,
            options.max_waste,
            registry,
            ids,
        )
    return SlicedPool(options.page_size, options.max_slice_size, alignment, registry, ids)


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
    periods = [p.check_period for p in pools if isinstance(p, ExclusivePool) and p.check_period]
    return min([*periods, TICK])
