"""A memory manager that also measures: the peaks of each size class of request (a dry
run's report, which :meth:`~.report.MemoryReport.plan` sizes a layout from)."""

from __future__ import annotations

from typing import TypeVar

from .config import MemoryConfig
from .management import MemoryManagement
from .report import MemoryReport, SizeClassPeak
from .slice import SliceHandle
from .storage import ComputeStorage

__all__ = ["MeasuredMemory"]

R = TypeVar("R")


class MeasuredMemory(MemoryManagement[R]):
    """:class:`MemoryManagement` counting, per power-of-two size class, the requests,
    and the most allocations (and bytes) alive at once. Slower than the plain manager
    by a dictionary update per reserve and release: dry runs use it."""

    __slots__ = ("_classes",)

    def __init__(
        self, storage: ComputeStorage[R], config: MemoryConfig | None = None, *, owner_id: int
    ) -> None:
        super().__init__(storage, config, owner_id=owner_id)
        self._classes: dict[int, list[int]] = {}  # upper: [requests, alive, bytes, peak, peak B]

    def reserve(self, size: int) -> SliceHandle:
        """As :meth:`MemoryManagement.reserve`, counted in its size class."""
        self._drain()
        handle = super().reserve(size)
        used = self._slices[handle.id].used
        entry = self._classes.setdefault(_upper(used), [0, 0, 0, 0, 0])
        entry[0] += 1
        entry[1] += 1
        entry[2] += used
        entry[3] = max(entry[3], entry[1])
        entry[4] = max(entry[4], entry[2])
        return handle

    def _drain(self) -> None:
        slices, pending = self._slices, self._pending
        while pending:
            sl = slices.get(pending.popleft())
            if sl is not None and sl.used >= 0:
                entry = self._classes[_upper(sl.used)]
                entry[1] -= 1
                entry[2] -= sl.used
                sl.pool.release(sl)

    def report(self) -> MemoryReport:
        """The pools' report, with the size classes' peaks."""
        base = super().report()
        classes = tuple(
            SizeClassPeak(upper, e[0], e[3], e[4]) for upper, e in sorted(self._classes.items())
        )
        return MemoryReport(base.pools, base.persistent, base.alloc_calls, classes)


def _upper(size: int) -> int:
    """The power of two a size's class ends at (1 for 0 and 1)."""
    return 1 << max(size - 1, 0).bit_length()
