"""What a memory manager reports: :class:`MemoryReport`, pool by pool."""

from __future__ import annotations

from dataclasses import dataclass

from ..html import memory_report_html
from ..values.types import MemoryUsage
from .pools import PoolReport

__all__ = ["MemoryReport"]


def _pool_label(pool: PoolReport) -> str:
    page = f", pages of {pool.page_size} B" if pool.page_size else ""
    pages = f"{pool.pages} pages, peak {pool.pages_peak}"
    return f"{pool.kind} <= {pool.max_alloc_size} B{page} ({pages})"


@dataclass(frozen=True, slots=True)
class MemoryReport:
    """A manager's state, pool by pool.

    Attributes:
        pools: The dynamic pools, in routing order.
        persistent: The persistent pool.
        alloc_calls: ``reserve`` calls so far.
    """

    pools: tuple[PoolReport, ...]
    persistent: PoolReport
    alloc_calls: int

    @property
    def usage(self) -> MemoryUsage:
        """The usage summed over every pool."""
        total = self.persistent.usage
        for pool in self.pools:
            total = total.combine(pool.usage)
        return total

    def _repr_html_(self) -> str:
        rows = [(_pool_label(p), p.usage) for p in (*self.pools, self.persistent)]
        return memory_report_html(rows, title=f"Memory after {self.alloc_calls} allocations")

    def __str__(self) -> str:
        lines = [f"memory: {self.usage} after {self.alloc_calls} allocation calls"]
        for p in (*self.pools, self.persistent):
            page = f", page {p.page_size}" if p.page_size else ""
            lines.append(
                f"  {p.kind} <= {p.max_alloc_size}{page}: {p.usage}; pages {p.pages} "
                f"(peak {p.pages_peak}), largest {p.largest_allocation}"
            )
        return "\n".join(lines)
