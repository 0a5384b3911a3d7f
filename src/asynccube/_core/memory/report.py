"""What a memory manager reports: :class:`MemoryReport`, pool by pool (and, in a dry
run, size class by size class), and the layout it plans for the next run."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..config.pools import MemoryLayout, MemoryPool, PoolKind
from ..errors import InvalidArgument
from ..html import memory_report_html
from ..values.types import MemoryUsage
from .pools import PoolReport

__all__ = ["MemoryReport", "SizeClassPeak"]


@dataclass(frozen=True, slots=True)
class SizeClassPeak:
    """The requests of one size class (sizes in ``(upper / 2, upper]``), as a dry run
    measured them.

    Attributes:
        upper: The largest size of the class, a power of two (bytes).
        requests: Allocations of this class so far.
        peak_count: The most allocations of this class alive at once.
        peak_bytes: The most bytes (requested) of this class alive at once.
    """

    upper: int
    requests: int
    peak_count: int
    peak_bytes: int


def _pool_label(pool: PoolReport) -> str:
    page = f", pages of {pool.page_size} B" if pool.page_size else ""
    cap = f", cap {pool.max_total} B" if pool.max_total is not None else ""
    pages = f"{pool.pages} pages, peak {pool.pages_peak} ({pool.reserved_peak} B)"
    return f"{pool.kind} <= {pool.max_alloc_size} B{page}{cap} ({pages})"


@dataclass(frozen=True, slots=True)
class MemoryReport:
    """A manager's state, pool by pool.

    Attributes:
        pools: The ordinary pools, in routing order (index ``i`` is the layout's
            ``i``-th sliced, exclusive or direct pool).
        persistent: The persistent pool.
        alloc_calls: ``reserve`` calls so far.
        size_classes: In a dry run, the peaks of each size class of request (powers of
            two, ascending); empty otherwise.
    """

    pools: tuple[PoolReport, ...]
    persistent: PoolReport
    alloc_calls: int
    size_classes: tuple[SizeClassPeak, ...] = ()

    @property
    def usage(self) -> MemoryUsage:
        """The usage summed over every pool."""
        total = self.persistent.usage
        for pool in self.pools:
            total = total.combine(pool.usage)
        return total

    def plan(self, headroom: float = 0.0) -> MemoryLayout:
        """A layout sized for a run like the one measured (typically a dry run's).

        Each pool keeps its kind, ``max_slice`` and ``page_size`` (so every request goes
        to the same pool as measured). A pool that held pages gets a cap of its peak
        bytes times ``1 + headroom`` (whole pages for a sliced pool), and a sliced one
        has that many bytes of pages mapped when the layout is installed (``initial``),
        so the run they were measured for finds them ready and maps nothing more. The
        last ordinary pool stays uncapped, so a run that needs more than measured is
        served (by it) rather than refused; pools that held nothing keep their cap.

        Raises:
            InvalidArgument: ``headroom`` is negative, or the run used the expandable
                pool (it maps what it uses as it goes: nothing to plan).
        """
        if isinstance(headroom, bool) or not headroom >= 0:
            raise InvalidArgument(f"headroom={headroom!r} must be a number >= 0 (0.25: 25% more)")
        if any(p.kind == "expandable" for p in self.pools):
            raise InvalidArgument(
                "plan() sizes layouts of sliced and exclusive pools; this run used the "
                "expandable pool, which maps what it uses as it goes: keep "
                '[memory] pool = "expandable" (its peak is in this report)'
            )
        last = len(self.pools) - 1
        pools = [_planned(p, headroom, i == last) for i, p in enumerate(self.pools)]
        persistent = self.persistent
        if persistent.reserved_peak:
            pools.append(_planned(persistent, headroom, False))
        return MemoryLayout(tuple(pools))

    def _repr_html_(self) -> str:
        rows = [(_pool_label(p), p.usage) for p in (*self.pools, self.persistent)]
        return memory_report_html(rows, title=f"Memory after {self.alloc_calls} allocations")

    def __str__(self) -> str:
        lines = [f"memory: {self.usage} after {self.alloc_calls} allocation calls"]
        for i, p in enumerate((*self.pools, self.persistent)):
            name = "-" if p is self.persistent else str(i)
            page = f", page {p.page_size}" if p.page_size else ""
            cap = f", cap {p.max_total}" if p.max_total is not None else ""
            lines.append(
                f"  {name} {p.kind} <= {p.max_alloc_size}{page}{cap}: {p.usage}; pages "
                f"{p.pages} (peak {p.pages_peak}, {p.reserved_peak} B), largest "
                f"{p.largest_allocation}"
            )
        for c in self.size_classes:
            lines.append(
                f"  size <= {c.upper}: {c.requests} requests, peak {c.peak_count} alive "
                f"({c.peak_bytes} B)"
            )
        return "\n".join(lines)


def _planned(pool: PoolReport, headroom: float, last: bool) -> MemoryPool:
    kind = PoolKind(pool.kind)
    peak = pool.reserved_peak
    if not peak:
        return MemoryPool(kind, pool.max_alloc_size, pool.page_size, pool.max_total)
    cap = math.ceil(peak * (1 + headroom))
    if kind is PoolKind.SLICED:
        assert pool.page_size is not None
        page = pool.page_size
        cap = max(page, -(-cap // page) * page)
        return MemoryPool(kind, pool.max_alloc_size, page, None if last else cap, initial=cap)
    return MemoryPool(kind, pool.max_alloc_size, max_total=None if last else cap)
