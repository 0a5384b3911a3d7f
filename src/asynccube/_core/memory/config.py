"""Memory configuration: which pools a :class:`MemoryManagement` routes requests through.

Mirrors cubecl's ``MemoryConfiguration`` (``SubSlices``, ``ExclusivePages``, ``Custom``)
and ``MemoryPoolOptions``. A request goes to the first pool, in order, whose maximum
allocation size is at least the request; that pool serves it from a free slice or grows
by one page. The presets are resolved against the storage's alignment when the manager
is built, so one config serves the host (64-byte) and CUDA (512-byte) storages alike.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from ..config.pools import MemoryLayout, MemoryPool, PoolKind

__all__ = [
    "DEFAULT_CACHE_RATIO",
    "DEFAULT_MAX_ALLOCATION",
    "EXPANDABLE_CACHE_RATIO",
    "DirectPages",
    "ExclusivePages",
    "ExpandablePages",
    "MemoryConfig",
    "PersistentPages",
    "PoolOptions",
    "SlicedPages",
    "physical_memory",
    "with_host_limit",
]

KiB: Final = 1024
MiB: Final = 1024 * KiB
GiB: Final = 1024 * MiB

DEFAULT_MAX_ALLOCATION: Final = 2**40
"""Largest single allocation when neither the config nor the storage says less (1 TiB)."""


def physical_memory() -> int | None:
    """The machine's physical memory in bytes (``sysconf``, else ``/proc/meminfo``), or
    None where neither says."""
    try:
        pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):  # no sysconf (Windows), or no such name
        pages = page_size = -1
    if pages > 0 and page_size > 0:
        return int(pages * page_size)
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * KiB
    except (OSError, ValueError, IndexError):
        pass
    return None


def with_host_limit(config: MemoryConfig | None) -> MemoryConfig:
    """``config`` (default preset if None) with the host server's largest allocation:
    its own ``max_allocation`` if set, else the machine's physical memory (so a request
    no machine here can serve is refused at the call, not when it runs)."""
    config = MemoryConfig.default() if config is None else config
    if config.max_allocation is not None:
        return config
    memory = physical_memory()
    if memory is None:
        return config
    return dataclasses.replace(config, max_allocation=min(memory, DEFAULT_MAX_ALLOCATION))


DEFAULT_CACHE_RATIO: Final = 0.1
"""The default preset's bound on empty pages kept, as a fraction of the other pages."""

EXPANDABLE_CACHE_RATIO: Final = 0.0
"""The expandable preset's ``cache_ratio``: before the range maps more chunks, every
free chunk (but those the growth uses) is released, so what it maps follows what is
live (on the churn of ``benchmarks/bench_memory_churn.py``, within a few percent)."""

_BASE_DEALLOC_PERIOD: Final = 5000
"""Allocation calls a free exclusive page may go unused before it is released (cubecl's)."""


@dataclass(frozen=True, slots=True)
class SlicedPages:
    """A pool of ``page_size`` pages carved into slices of at most ``max_slice_size``.

    Free slices are reused best-fit (the smallest free slice that is large enough, an
    exact size first) and split; free neighbours are coalesced when a request finds no
    fit. Pages are released by an explicit cleanup (or an out-of-memory retry), and,
    with ``MemoryConfig.cache_ratio``, when the manager grows.

    Args:
        page_size: The size of a page.
        max_slice_size: The largest request accepted. Above ``page_size``, a request
            gets a page of its own rounded up to a multiple of ``page_size``, whose
            free rest serves other requests.
        max_total: A cap on the bytes of the pool's pages (``None``: no cap).
        initial: Bytes of pages mapped when the manager is built (whole pages).
    """

    page_size: int
    max_slice_size: int
    max_total: int | None = None
    initial: int = 0

    def __post_init__(self) -> None:
        _check_positive("page_size", self.page_size)
        _check_positive("max_slice_size", self.max_slice_size)

    @property
    def max_alloc_size(self) -> int:
        """The largest request this pool accepts."""
        return self.max_slice_size


@dataclass(frozen=True, slots=True)
class ExclusivePages:
    """A pool in which every page holds exactly one slice.

    Args:
        max_alloc_size: The largest request this pool accepts.
        dealloc_period: A free page left unused for about this many allocation calls is
            released; ``None`` keeps free pages until an explicit cleanup.
        size_classes: New pages are rounded up to one of this many sizes per power of
            two (at most ``1/size_classes`` of padding), so that pages freed by one
            request fit the next ones of a similar size; 0 rounds to the alignment only.
        max_waste: A free page is reused for a request only if it is at most this
            fraction larger than the (rounded) request; ``None`` reuses any larger page.
        max_total: A cap on the bytes of the pool's pages (``None``: no cap).
    """

    max_alloc_size: int
    dealloc_period: int | None = None
    size_classes: int = 0
    max_waste: float | None = None
    max_total: int | None = None

    def __post_init__(self) -> None:
        _check_positive("max_alloc_size", self.max_alloc_size, allow_zero=True)
        if self.dealloc_period is not None:
            _check_positive("dealloc_period", self.dealloc_period)
        if self.size_classes < 0 or self.size_classes & (self.size_classes - 1):
            raise ValueError(f"size_classes must be 0 or a power of two, got {self.size_classes}")
        if self.max_waste is not None and not self.max_waste >= 0:
            raise ValueError(f"max_waste must be >= 0, got {self.max_waste}")


@dataclass(frozen=True, slots=True)
class DirectPages:
    """A pool that gives each request a page of its own, released with the request.

    Args:
        max_alloc_size: The largest request this pool accepts.
        max_total: A cap on the bytes of the pool's pages (``None``: no cap).
    """

    max_alloc_size: int
    max_total: int | None = None


@dataclass(frozen=True, slots=True)
class PersistentPages:
    """The persistent pool's options (exact sizes, for the persistent windows).

    Args:
        max_alloc_size: The largest request it accepts (larger ones go to the others).
        max_total: A cap on the bytes of its pages (``None``: no cap).
    """

    max_alloc_size: int
    max_total: int | None = None


@dataclass(frozen=True, slots=True)
class ExpandablePages:
    """A pool on one reserved range of device addresses, backed by physical chunks on
    demand and grown in place (see :mod:`.expandable`); CUDA only.

    Args:
        max_alloc_size: The largest request this pool accepts.
        virtual_size: Bytes of addresses reserved (``None``: twice the device's memory,
            or 1 TiB where the storage does not say); the bytes mapped stay below the
            device's memory, the rest is room for free holes between slices.
        max_total: A cap on the bytes mapped (``None``: no cap).
    """

    max_alloc_size: int
    virtual_size: int | None = None
    max_total: int | None = None

    def __post_init__(self) -> None:
        _check_positive("max_alloc_size", self.max_alloc_size)
        if self.virtual_size is not None:
            _check_positive("virtual_size", self.virtual_size)


PoolOptions = SlicedPages | ExclusivePages | DirectPages | ExpandablePages
"""The options of one routed pool."""


@dataclass(frozen=True, slots=True)
class MemoryConfig:
    """How a memory manager is laid out: a preset, or a custom list of pools.

    Build one with :meth:`default`, :meth:`exclusive_pages`, :meth:`expandable` or
    :meth:`custom`.

    Attributes:
        preset: ``"default"`` (the sub-slices ladder), ``"exclusive_pages"``,
            ``"expandable"`` (one expandable pool, CUDA only) or ``"custom"``.
        pools: The pools of a custom config, in routing order.
        max_allocation: The largest single allocation allowed; ``None`` means the
            storage's limit, capped at :data:`DEFAULT_MAX_ALLOCATION`.
        cache_ratio: Before the manager grows by a page, it releases empty pages
            (largest first) until the empty pages it keeps hold at most this fraction of
            the bytes of its other pages, so what it reserves stays within about
            ``1 + cache_ratio`` times what its pages hold; ``None`` keeps empty pages
            until each pool's own policy releases them (cubecl's behaviour).
        persistent_size_match: Outside persistent windows, also serve a request from
            the persistent pool when it holds a free slice of exactly that size (cubecl's
            ``PersistentMemory::SizeMatch``).
        persistent: The persistent pool's options (``None``: uncapped, up to
            ``max_allocation``).
        layout: The public layout this config was built from (``None`` for a preset).
        high_water: A bound on the bytes reserved, for services: once the manager
            holds more, it releases empty pages (largest first) down to it as soon as
            it next handles released buffers or a request, instead of keeping them for
            later requests (``None``: no bound). Live data may still exceed it.
    """

    preset: str = "default"
    pools: tuple[PoolOptions, ...] = ()
    max_allocation: int | None = None
    cache_ratio: float | None = None
    persistent_size_match: bool = False
    persistent: PersistentPages | None = None
    layout: MemoryLayout | None = None
    high_water: int | None = None

    def __post_init__(self) -> None:
        if self.preset not in ("default", "exclusive_pages", "expandable", "custom"):
            raise ValueError(f"unknown memory preset {self.preset!r}")
        if self.preset == "custom" and not self.pools:
            raise ValueError("a custom memory config needs at least one pool")
        if self.max_allocation is not None:
            _check_positive("max_allocation", self.max_allocation, allow_zero=True)
        if self.cache_ratio is not None and not self.cache_ratio >= 0:
            raise ValueError(f"cache_ratio must be >= 0, got {self.cache_ratio}")
        if self.high_water is not None:
            _check_positive("high_water", self.high_water)

    @classmethod
    def default(
        cls,
        *,
        max_allocation: int | None = None,
        cache_ratio: float | None = DEFAULT_CACHE_RATIO,
        persistent_size_match: bool = False,
    ) -> MemoryConfig:
        """The sub-slices ladder: sliced pools up to 32 MiB, exclusive pages above, and
        empty pages kept up to ``cache_ratio`` of the rest."""
        return cls("default", (), max_allocation, cache_ratio, persistent_size_match)

    @classmethod
    def exclusive_pages(cls, *, max_allocation: int | None = None) -> MemoryConfig:
        """One slice per page, in a ladder of page sizes (cubecl's ``ExclusivePages``)."""
        return cls("exclusive_pages", (), max_allocation)

    @classmethod
    def expandable(
        cls,
        *,
        max_allocation: int | None = None,
        cache_ratio: float | None = EXPANDABLE_CACHE_RATIO,
    ) -> MemoryConfig:
        """One expandable pool for every size (PyTorch's ``expandable_segments``): a
        reserved range of addresses grown in place; before it maps more chunks, the
        free chunks beyond ``cache_ratio`` of the rest are released (by default all of
        them). CUDA only: the host has no virtual memory API."""
        return cls("expandable", (), max_allocation, cache_ratio)

    @classmethod
    def custom(
        cls,
        pools: Sequence[PoolOptions],
        *,
        max_allocation: int | None = None,
        cache_ratio: float | None = None,
    ) -> MemoryConfig:
        """Exactly the pools given, in routing order."""
        return cls("custom", tuple(pools), max_allocation, cache_ratio)

    @classmethod
    def from_layout(cls, layout: MemoryLayout, max_allocation: int | None = None) -> MemoryConfig:
        """The config of a public :class:`MemoryLayout` (``max_allocation``: the limit
        when the layout sets none, e.g. the host's)."""
        persistent = layout.persistent
        return cls(
            "custom",
            tuple(_options(p) for p in layout.routed),
            layout.max_allocation if layout.max_allocation is not None else max_allocation,
            layout.cache_ratio,
            persistent=None
            if persistent is None
            else PersistentPages(persistent.max_slice, persistent.max_total),
            layout=layout,
        )

    def pool_options(self, alignment: int, max_allocation: int) -> tuple[PoolOptions, ...]:
        """The pools this config stands for, for a storage of ``alignment``."""
        if self.preset == "custom":
            return self.pools
        if self.preset == "exclusive_pages":
            return _exclusive_ladder(alignment, max_allocation)
        if self.preset == "expandable":
            return (ExpandablePages(max_allocation),)
        return _sub_slices(alignment, max_allocation)


def _options(pool: MemoryPool) -> PoolOptions:
    if pool.kind is PoolKind.SLICED:
        assert pool.page_size is not None
        return SlicedPages(pool.page_size, pool.max_slice, pool.max_total, pool.initial)
    if pool.kind is PoolKind.DIRECT:
        return DirectPages(pool.max_slice, pool.max_total)
    return ExclusivePages(pool.max_slice, pool.dealloc_period, max_total=pool.max_total)


def _check_positive(name: str, value: int, *, allow_zero: bool = False) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < (0 if allow_zero else 1):
        raise ValueError(f"{name} must be a {'non-negative' if allow_zero else 'positive'} int")


def align_up(size: int, alignment: int) -> int:
    """``size`` rounded up to a multiple of ``alignment`` (a power of two)."""
    return (size + alignment - 1) & -alignment


def _sub_slices(alignment: int, max_allocation: int) -> tuple[PoolOptions, ...]:
    """The default ladder, tuned on the mixed-size trace of ``benchmarks/bench_memory.py``.

    It keeps the shape of cubecl's ``SubSlices`` (sliced pools whose pages grow with
    their slices) with smaller pages, and hands the largest requests to exclusive pages.
    Requests up to 4 MiB share pages sliced best-fit; each rung's page is 8 times its
    largest slice, so one page serves many requests and a partly used page wastes little
    (2 MiB pages for <= 256 KiB, 8 MiB for <= 1 MiB, 32 MiB for <= 4 MiB).
    Requests up to 32 MiB are carved from 64 MiB pages. Larger requests get exclusive
    pages of their aligned size, reused by requests up to 1/4 smaller, and released
    after 5000 allocation calls unused (cubecl's period). With the default
    ``cache_ratio``, empty pages beyond 1/10 of the rest are released whenever the
    manager must grow.
    """
    return (
        SlicedPages(align_up(2 * MiB, alignment), align_up(256 * KiB, alignment)),
        SlicedPages(align_up(8 * MiB, alignment), align_up(1 * MiB, alignment)),
        SlicedPages(align_up(32 * MiB, alignment), align_up(4 * MiB, alignment)),
        SlicedPages(align_up(64 * MiB, alignment), align_up(32 * MiB, alignment)),
        ExclusivePages(
            max(max_allocation, align_up(32 * MiB, alignment)),
            dealloc_period=_BASE_DEALLOC_PERIOD,
            max_waste=0.25,
        ),
    )


def _exclusive_ladder(alignment: int, max_allocation: int) -> tuple[PoolOptions, ...]:
    """cubecl's ExclusivePages preset: 24 log-spaced page sizes from 32 KiB up."""
    top = max(min(max_allocation, 2 * GiB), 64 * KiB)
    sizes: list[int] = []
    count = 24
    low = 32 * KiB
    for i in range(count):
        size = align_up(int(low * (top / low) ** (i / (count - 1))), alignment)
        if not sizes or size > sizes[-1]:
            sizes.append(size)
    pools: list[PoolOptions] = [ExclusivePages(s, _dealloc_period(s)) for s in sizes]
    if max_allocation > sizes[-1]:
        pools.append(ExclusivePages(max_allocation, _dealloc_period(max_allocation)))
    return tuple(pools)


def _dealloc_period(size: int) -> int:
    return int(_BASE_DEALLOC_PERIOD * round(1 + size / GiB))
