"""What the two pools that carve pages into linked slices share (the sliced pool and the
expandable one): splitting a free slice and putting its tail back in the buckets, and the
lazy coalescing of released slices with their free neighbours (see :mod:`.pools`)."""

from __future__ import annotations

from typing import Final

from .pages import FREE, PoolBase, Slice, SliceBuckets
from .storage import ComputeStorage

__all__ = ["ChainedPool"]

_MAX_DIRTY: Final = 4096
"""Releases remembered for coalescing before a pass is forced (bounds the list)."""


class ChainedPool(PoolBase):
    """A pool whose pages are chains of slices in offset order, split on demand and
    coalesced lazily: a release only puts the slice back in its bucket and remembers it;
    :meth:`coalesce` merges the remembered slices with their free neighbours.

    Subclasses call :meth:`_start_chain` from their constructor, and set
    :attr:`dirty_tails` when the tail a split leaves may have a free neighbour after it
    that no pass would otherwise see.
    """

    dirty_tails = False
    """Remember the free tail of each split for the next coalescing pass."""

    _buckets: SliceBuckets
    _free: dict[int, list[Slice]]
    _dirty: list[Slice]

    def _start_chain(self) -> None:
        """No free slice yet, none released."""
        self._buckets = SliceBuckets()
        self._free = self._buckets.free
        self._dirty = []

    def release(self, sl: Slice) -> None:
        """Take back a slice whose last handle is gone (merged with its free neighbours
        on the next coalescing pass)."""
        sl.used = FREE
        self._buckets.add(sl)
        self._dirty.append(sl)

    def _split(self, sl: Slice, size: int, ext: int) -> Slice:
        """Use the first ``ext`` bytes of ``sl`` for ``size`` bytes (``FREE``: none), the
        rest becoming a free slice after it."""
        rest = sl.size - ext
        if rest:
            tail = self._new_slice(sl.page, sl.offset + ext, rest, FREE)
            tail.prev, tail.next = sl, sl.next
            if sl.next is not None:
                sl.next.prev = tail
            sl.next = tail
            sl.size = ext
            self._buckets.add(tail)
            if self.dirty_tails:
                self._dirty.append(tail)
        sl.used = size
        return sl

    def coalesce(self) -> None:
        """Merge every slice released since the last pass with its free neighbours."""
        dirty, self._dirty = self._dirty, []
        for sl in dirty:
            if sl.used == FREE:
                self._merge_run(sl)

    def _merge_run(self, sl: Slice) -> None:
        """Merge the run of free slices around the free slice ``sl`` into its first."""
        start = sl
        while start.prev is not None and start.prev.used == FREE:
            start = start.prev
        end = start.next
        if end is None or end.used != FREE:
            return
        buckets = self._buckets
        buckets.remove(start)
        while end is not None and end.used == FREE:
            buckets.remove(end)
            start.size += end.size
            self._kill(end)
            end = end.next
        start.next = end
        if end is not None:
            end.prev = start
        buckets.add(start)

    def tick(self, storage: ComputeStorage[object], alloc_count: int) -> None:
        """Periodic upkeep: coalesce once many releases are pending."""
        if len(self._dirty) > _MAX_DIRTY:
            self.coalesce()

    def release_all(self, storage: ComputeStorage[object]) -> None:
        """Give every page back to the storage and forget the free slices."""
        super().release_all(storage)
        self._buckets.clear()
        self._dirty.clear()
