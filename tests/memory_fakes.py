"""A storage that allocates nothing, for memory-management tests."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from asynccube._core.memory import StorageHandle, StorageOutOfMemory


class FakeStorage:
    """Hands out address ranges; can be told to fail or to cap its total bytes.

    Attributes:
        fail_next: How many of the next ``alloc`` calls fail with StorageOutOfMemory.
        limit: Total bytes past which ``alloc`` fails.
        sizes: Live storage id -> size.
    """

    max_alloc: int | None = None

    def __init__(self, alignment: int = 64, limit: int | None = None) -> None:
        self.alignment = alignment
        self.limit = limit
        self.fail_next = 0
        self.sizes: dict[int, int] = {}
        self.allocs = 0
        self.deallocs = 0
        self._ids = itertools.count(1)

    @property
    def allocated(self) -> int:
        return sum(self.sizes.values())

    def alloc(self, size: int) -> StorageHandle:
        if self.fail_next:
            self.fail_next -= 1
            raise StorageOutOfMemory(size, "fake failure")
        if self.limit is not None and self.allocated + size > self.limit:
            raise StorageOutOfMemory(size, "fake limit")
        self.allocs += 1
        sid = next(self._ids)
        self.sizes[sid] = size
        return StorageHandle(sid, 0, size)

    def dealloc(self, storage_id: int) -> None:
        assert storage_id in self.sizes, f"double free of storage {storage_id}"
        self.deallocs += 1
        del self.sizes[storage_id]

    def resource(self, handle: StorageHandle) -> tuple[int, int, int]:
        assert handle.id in self.sizes, f"resource of freed storage {handle.id}"
        assert handle.offset + handle.size <= self.sizes[handle.id]
        return (handle.id, handle.offset, handle.size)

    def storage_ids(self) -> Iterator[int]:
        return iter(list(self.sizes))
