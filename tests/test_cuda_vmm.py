"""The CUDA side of the expandable pool (``cuda/vmm.py``) against a fake driver: which
virtual memory calls it makes, on which thread, and what a failure leaves behind."""

from __future__ import annotations

import itertools
import threading
import types
from typing import Any

import pytest

from asynccube._core.cuda import driver
from asynccube._core.cuda.vmm import VirtualRange
from asynccube._core.errors import CudaDriverError
from asynccube._core.memory.expandable import MapFailed
from asynccube._core.memory.storage import StorageOutOfMemory

G = 2 << 20
BASE = 0x7000_0000_0000


class FakeVmm:
    """The driver calls :class:`VirtualRange` makes, recorded; ``free`` bytes shrink
    as chunks are created and grow as they are released."""

    def __init__(self, free: int = 64 * G) -> None:
        self.free = free
        self.calls: list[tuple[str, Any]] = []
        self.mapped: dict[int, int] = {}
        self.live: dict[int, int] = {}  # handle -> bytes
        self.fail: dict[str, int] = {}  # call -> CUresult, once
        self.threads: set[str] = set()
        self._ids = itertools.count(1)
        self.CUmemAllocationProp = self.CUmemAccessDesc = _struct

    def __getattr__(self, name: str) -> Any:
        if name.startswith("CU"):
            return types.SimpleNamespace(**dict.fromkeys(_ENUMS, 0))
        raise AttributeError(name)

    def _failing(self, call: str) -> int:
        return self.fail.pop(call, 0)

    def cuMemGetAllocationGranularity(self, prop: Any, option: Any) -> tuple[int, int]:
        return 0, G

    def cuMemAddressReserve(self, size: int, align: int, addr: int, flags: int) -> tuple[int, int]:
        self.calls.append(("reserve", size))
        return 0, BASE

    def cuCtxGetCurrent(self) -> tuple[int, int]:
        return 0, 7

    def cuCtxSetCurrent(self, ctx: Any) -> tuple[int]:
        assert ctx == 7
        return (0,)

    def cuMemGetInfo(self) -> tuple[int, int, int]:
        return 0, self.free, 64 * G

    def cuMemCreate(self, size: int, prop: Any, flags: int) -> tuple[int, int]:
        err = self._failing("cuMemCreate")
        if err or self.free < size:
            return err or 2, 0
        self.free -= size
        handle = next(self._ids)
        self.live[handle] = size
        self.calls.append(("create", size // G))
        return 0, handle

    def cuMemMap(self, ptr: int, size: int, offset: int, handle: int, flags: int) -> tuple[int]:
        err = self._failing("cuMemMap")
        if err:
            return (err,)
        chunks = range(ptr, ptr + size, G)
        assert not any(c in self.mapped for c in chunks)
        self.mapped.update(dict.fromkeys(chunks, handle))  # chunk address -> handle
        return (0,)

    def cuMemSetAccess(self, ptr: int, size: int, desc: Any, count: int) -> tuple[int]:
        self.calls.append(("access", (ptr - BASE) // G, size // G))
        return (self._failing("cuMemSetAccess"),)

    def cuMemUnmap(self, ptr: int, size: int) -> tuple[int]:
        self.threads.add(threading.current_thread().name)
        err = self._failing("cuMemUnmap")
        if err:
            return (err,)
        handle = self.mapped[ptr]
        assert [self.mapped.get(c) for c in range(ptr, ptr + size, G)] == [handle] * (size // G)
        assert size == self.live[handle]  # a whole mapping, never a part of one
        for c in range(ptr, ptr + size, G):
            del self.mapped[c]
        return (0,)

    def cuMemRelease(self, handle: int) -> tuple[int]:
        self.free += self.live.pop(handle)
        return (0,)

    def cuMemAddressFree(self, ptr: int, size: int) -> tuple[int]:
        self.calls.append(("free", size))
        return (0,)


_ENUMS = (
    "CU_MEM_ALLOCATION_TYPE_PINNED",
    "CU_MEM_LOCATION_TYPE_DEVICE",
    "CU_MEM_ACCESS_FLAGS_PROT_READWRITE",
    "CU_MEM_ALLOC_GRANULARITY_MINIMUM",
)


def _struct() -> Any:
    return types.SimpleNamespace(location=types.SimpleNamespace())


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeVmm:
    vmm = FakeVmm()
    monkeypatch.setattr(driver, "_module", vmm)
    return vmm


def test_a_range_is_reserved_in_whole_chunks_and_mapped_run_by_run(fake: FakeVmm) -> None:
    rng = VirtualRange(0, 5 * G + 1, storage_id=3)
    assert rng.handle.size == 6 * G and rng.base == BASE and rng.granularity == G
    rng.map(1, 3)
    assert sorted(fake.mapped) == [BASE + k * G for k in (1, 2, 3)]
    assert ("access", 1, 3) in fake.calls  # one cuMemSetAccess for the run


def test_unmapping_runs_at_once_on_the_callers_thread_and_is_reported(fake: FakeVmm) -> None:
    rng = VirtualRange(0, 4 * G, storage_id=1)
    rng.map(0, 4)
    rng.unmap(1, 2)  # done when it returns: the chunks are free addresses again
    assert sorted(fake.mapped) == [BASE, BASE + 3 * G] and len(fake.live) == 2
    assert fake.threads == {threading.current_thread().name}
    assert rng.unmapped() == [(1, 1), (2, 1)] and rng.unmapped() == []  # per allocation
    rng.map(1, 1)  # mapped again at once
    assert sorted(fake.mapped) == [BASE, BASE + G, BASE + 3 * G]


def test_a_long_run_is_mapped_in_allocations_of_an_eighth_of_it(fake: FakeVmm) -> None:
    rng = VirtualRange(0, 64 * G, storage_id=1)
    rng.map(0, 32)  # 64 MiB: 8 allocations of 4 chunks, not 32 of one
    assert [c for c in fake.calls if c[0] == "create"] == [("create", 4)] * 8
    assert [c for c in fake.calls if c[0] == "access"] == [("access", 0, 32)]
    rng.map(32, 6)  # a short run: a chunk apiece (each can be given back alone)
    assert [c for c in fake.calls if c[0] == "create"][8:] == [("create", 1)] * 6


def test_only_whole_allocations_are_given_back(fake: FakeVmm) -> None:
    rng = VirtualRange(0, 64 * G, storage_id=1)
    rng.map(0, 32)
    kept = rng.unmap(2, 9)  # chunks 2..10: the allocation 4..7 is inside it, 0..3 and
    assert kept == [(2, 2), (8, 3)]  # 8..11 reach past it and stay mapped
    assert rng.unmapped() == [(4, 4)]
    assert BASE + 2 * G in fake.mapped and BASE + 4 * G not in fake.mapped
    assert len(fake.live) == 7
    assert rng.unmap(0, 12) == [] and rng.unmapped() == [(0, 4), (8, 4)]  # 4..7: skipped


def test_out_of_memory_midway_says_how_many_chunks_were_mapped(fake: FakeVmm) -> None:
    rng = VirtualRange(0, 8 * G, storage_id=1)
    fake.free = 2 * G + G // 2  # room for two chunks, not three: the call itself fails
    fake.cuMemGetInfo = lambda: (0, 64 * G, 64 * G)  # type: ignore[method-assign]
    with pytest.raises(MapFailed) as failed:
        rng.map(0, 3)
    assert failed.value.mapped == 2 and isinstance(failed.value.cause, StorageOutOfMemory)
    assert ("access", 0, 2) in fake.calls  # what was mapped is usable


def test_no_room_is_refused_without_a_failing_call(fake: FakeVmm) -> None:
    rng = VirtualRange(0, 8 * G, storage_id=1)
    fake.free = G
    with pytest.raises(MapFailed) as failed:
        rng.map(0, 2)
    assert failed.value.mapped == 0 and isinstance(failed.value.cause, StorageOutOfMemory)
    assert not fake.live


def test_released_chunks_make_room_for_the_next_map_at_once(fake: FakeVmm) -> None:
    rng = VirtualRange(0, 8 * G, storage_id=1)
    fake.free = 4 * G
    rng.map(0, 4)
    rng.unmap(0, 4)
    rng.map(4, 3)  # the device's memory came back with the unmap: no wait, no refusal
    assert len(fake.live) == 3 and sorted(fake.mapped) == [BASE + k * G for k in (4, 5, 6)]
    assert rng.unmapped() == [(0, 1), (1, 1), (2, 1), (3, 1)]


def test_a_failing_release_is_logged_and_the_range_goes_on(
    fake: FakeVmm, caplog: pytest.LogCaptureFixture
) -> None:
    rng = VirtualRange(0, 8 * G, storage_id=1)
    rng.map(0, 2)
    fake.fail["cuMemUnmap"] = 1
    with caplog.at_level("WARNING", logger="asynccube.memory"):
        rng.unmap(0, 1)
    assert "could not release chunk 0" in caplog.text
    rng.unmap(1, 1)  # the failure was once
    assert rng.unmapped() == [(0, 1), (1, 1)] and BASE + G not in fake.mapped


def test_a_refused_map_releases_its_allocation(fake: FakeVmm) -> None:
    rng = VirtualRange(0, 8 * G, storage_id=1)
    fake.fail["cuMemMap"] = 1  # CUDA_ERROR_INVALID_VALUE
    with pytest.raises(MapFailed) as failed:
        rng.map(0, 2)
    assert failed.value.mapped == 0 and isinstance(failed.value.cause, CudaDriverError)
    assert not fake.live and not fake.mapped


def test_refused_access_unmaps_what_was_mapped(fake: FakeVmm) -> None:
    rng = VirtualRange(0, 8 * G, storage_id=1)
    fake.fail["cuMemSetAccess"] = 1
    with pytest.raises(MapFailed) as failed:
        rng.map(0, 2)
    assert failed.value.mapped == 0 and isinstance(failed.value.cause, CudaDriverError)
    assert not fake.mapped and not fake.live  # given back before the error came


def test_close_releases_every_chunk_then_the_addresses(fake: FakeVmm) -> None:
    rng = VirtualRange(0, 8 * G, storage_id=1)
    rng.map(0, 3)
    rng.close()
    rng.close()  # once
    rng.wait(5.0)
    assert not fake.mapped and not fake.live
    assert fake.calls[-1] == ("free", 8 * G)
