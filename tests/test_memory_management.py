"""MemoryManagement: routing, accounting, failures, handle lifetime, modes."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest

from asynccube._core.errors import BufferTooBig, InvalidArgument, InvalidHandle, OutOfMemory
from asynccube._core.memory import (
    BytesStorage,
    ExclusivePages,
    MemoryConfig,
    MemoryManagement,
    SlicedPages,
    SlicedPool,
    SliceHandle,
)
from asynccube._core.values.types import MemoryAllocationMode, MemoryUsage

from .memory_fakes import FakeStorage

KiB = 1024
MiB = 1024 * KiB

SMALL = MemoryConfig.custom(
    [SlicedPages(4 * KiB, 1 * KiB), ExclusivePages(1 * MiB, dealloc_period=10)]
)


def _manager(config: MemoryConfig | None = SMALL, **kw: object) -> MemoryManagement[object]:
    return MemoryManagement(FakeStorage(**kw), config, owner_id=7)  # type: ignore[arg-type]


# -- routing and accounting --------------------------------------------------------------


def test_first_accepting_pool_serves() -> None:
    mm = _manager()
    small, big = mm.reserve(100), mm.reserve(2 * KiB)
    report = mm.report()
    assert [p.kind for p in report.pools] == ["sliced", "exclusive"]
    assert report.pools[0].usage.number_allocs == 1
    assert report.pools[1].usage.number_allocs == 1
    assert mm.storage_handle(small).size == 100
    assert mm.storage_handle(big).size == 2 * KiB


def test_routing_follows_pool_order_not_size_order() -> None:
    config = MemoryConfig.custom(
        [ExclusivePages(2 * KiB), SlicedPages(4 * KiB, 1 * KiB), SlicedPages(64 * KiB, 8 * KiB)]
    )
    mm = _manager(config)
    _handles = [mm.reserve(500), mm.reserve(1500), mm.reserve(5000)]
    kinds = [(p.kind, p.usage.number_allocs) for p in mm.report().pools]
    assert kinds == [("exclusive", 2), ("sliced", 0), ("sliced", 1)]


def test_usage_counts_requested_bytes_padding_and_pages() -> None:
    mm = _manager()
    a = mm.reserve(100)
    b = mm.reserve(64)
    assert mm.memory_usage() == MemoryUsage(2, 164, 28, 4 * KiB)
    del a
    assert mm.memory_usage() == MemoryUsage(1, 64, 0, 4 * KiB)
    del b
    assert mm.memory_usage() == MemoryUsage(0, 0, 0, 4 * KiB)
    mm.cleanup(explicit=True)
    assert mm.memory_usage() == MemoryUsage()


def test_dropped_slice_is_reused() -> None:
    mm = _manager()
    first = mm.reserve(100)
    where = mm.storage_handle(first)
    del first
    again = mm.reserve(100)
    assert mm.storage_handle(again) == where
    assert mm.storage.allocs == 1  # type: ignore[attr-defined]


def test_live_slices_keep_their_data() -> None:
    mm: MemoryManagement[np.ndarray] = MemoryManagement(BytesStorage(), SMALL, owner_id=1)
    handles = [mm.reserve(n) for n in (10, 300, 64, 1000, 3000)]
    for i, h in enumerate(handles):
        mm.resource(h, 0, mm.storage_handle(h).size)[:] = i + 1
    del handles[1]
    _more = [mm.reserve(200) for _ in range(3)]
    for h, value in zip(handles, (1, 3, 4, 5), strict=True):
        size = mm.storage_handle(h).size
        assert (mm.resource(h, 0, size) == value).all()


def test_resource_of_a_sub_range() -> None:
    mm: MemoryManagement[np.ndarray] = MemoryManagement(BytesStorage(), SMALL, owner_id=1)
    h = mm.reserve(100)
    mm.resource(h, 0, 100)[:] = 0
    mm.resource(h, 10, 5)[:] = 9
    assert np.flatnonzero(mm.resource(h, 0, 100)).tolist() == [10, 11, 12, 13, 14]
    assert mm.resource(h, 100, 0).size == 0


def test_zero_size_reservation() -> None:
    mm = _manager()
    a, b = mm.reserve(0), mm.reserve(0)
    assert mm.storage_handle(a).size == 0
    assert mm.storage_handle(a) != mm.storage_handle(b)
    assert mm.memory_usage().number_allocs == 2


def test_report_pages_peak_and_largest() -> None:
    mm = _manager()
    handles = [mm.reserve(1000) for _ in range(8)]  # 2 pages of 4 KiB
    big = mm.reserve(300 * KiB)
    del handles
    mm.cleanup(explicit=True)
    report = mm.report()
    sliced, exclusive = report.pools
    assert (sliced.pages, sliced.pages_peak, sliced.page_size) == (0, 2, 4 * KiB)
    assert (exclusive.pages, exclusive.largest_allocation) == (1, 300 * KiB)
    assert report.usage.bytes_in_use == 300 * KiB
    assert report.alloc_calls == 9
    assert "exclusive" in str(report)
    del big


def test_numpy_integer_sizes_are_accepted() -> None:
    mm = _manager()
    h = mm.reserve(np.int64(100))  # type: ignore[arg-type]
    assert mm.storage_handle(h).size == 100


# -- presets -----------------------------------------------------------------------------


def test_default_preset_max_allocation_follows_the_storage() -> None:
    storage = FakeStorage(alignment=512)
    storage.max_alloc = 8 * 2**30
    mm = MemoryManagement(storage, owner_id=1)
    assert mm.max_allocation == 8 * 2**30
    assert mm.alignment == 512
    assert mm.report().pools[-1].kind == "exclusive"
    with pytest.raises(BufferTooBig):
        mm.reserve(8 * 2**30 + 1)
    assert MemoryManagement(FakeStorage(), owner_id=2).max_allocation == 2**40


def test_default_preset_pools_are_aligned_to_the_storage() -> None:
    for alignment in (64, 512):
        mm = MemoryManagement(FakeStorage(alignment=alignment), owner_id=1)
        for pool in mm.report().pools:
            assert pool.max_alloc_size % alignment == 0
            assert (pool.page_size or 0) % alignment == 0


def test_exclusive_pages_preset_is_a_ladder_of_exclusive_pools() -> None:
    mm = MemoryManagement(FakeStorage(), MemoryConfig.exclusive_pages(), owner_id=1)
    kinds = {p.kind for p in mm.report().pools}
    sizes = [p.max_alloc_size for p in mm.report().pools]
    assert kinds == {"exclusive"}
    assert sizes == sorted(sizes)
    assert len(sizes) >= 20
    h = mm.reserve(100 * KiB)
    assert mm.storage_handle(h).size == 100 * KiB


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="at least one pool"):
        MemoryConfig.custom([])
    with pytest.raises(ValueError, match="positive"):
        SlicedPages(0, 10)
    with pytest.raises(ValueError, match="cache_ratio"):
        MemoryConfig.default(cache_ratio=-1)
    with pytest.raises(ValueError, match="unknown memory preset"):
        MemoryConfig("nope")


def test_max_allocation_is_configurable() -> None:
    mm = MemoryManagement(FakeStorage(), MemoryConfig.default(max_allocation=MiB), owner_id=1)
    assert mm.max_allocation == MiB
    mm.reserve(MiB)
    with pytest.raises(BufferTooBig):
        mm.reserve(MiB + 1)


# -- failures ----------------------------------------------------------------------------


def test_too_big_raises_and_disturbs_nothing() -> None:
    mm = _manager()
    keep = mm.reserve(100)
    before = mm.memory_usage()
    with pytest.raises(BufferTooBig) as info:
        mm.reserve(MiB + 1)
    assert info.value.size == MiB + 1
    assert str(MiB) in str(info.value)
    assert mm.memory_usage() == before
    assert mm.storage_handle(keep).size == 100


@pytest.mark.parametrize("size", [-1, -(2**40)])
def test_negative_size_is_buffer_too_big(size: int) -> None:
    mm = _manager()
    with pytest.raises(BufferTooBig, match="negative") as info:
        mm.reserve(size)
    assert info.value.size == size
    assert mm.alloc_calls == 0


@pytest.mark.parametrize("size", [1.5, "10", True, None])
def test_non_integer_size_is_invalid_argument(size: object) -> None:
    mm = _manager()
    with pytest.raises(InvalidArgument, match="int"):
        mm.reserve(size)  # type: ignore[arg-type]


def test_out_of_memory_cleans_up_and_retries_once() -> None:
    mm = _manager()
    freed = mm.reserve(2 * KiB)  # an exclusive page, freed below: cleanup can release it
    keep = mm.reserve(100)
    keep_where = mm.storage_handle(keep)
    del freed
    storage: FakeStorage = mm.storage  # type: ignore[assignment]
    storage.fail_next = 1
    got = mm.reserve(3 * KiB)
    assert mm.storage_handle(got).size == 3 * KiB
    assert storage.deallocs == 1  # the cleanup released the free page before the retry
    assert mm.storage_handle(keep) == keep_where


def test_out_of_memory_twice_raises_naming_size_and_reserved() -> None:
    mm = _manager()
    keep = mm.reserve(100)
    keep_where = mm.storage_handle(keep)
    storage: FakeStorage = mm.storage  # type: ignore[assignment]
    storage.fail_next = 2
    with pytest.raises(OutOfMemory) as info:
        mm.reserve(3 * KiB)
    assert info.value.size == 3 * KiB
    assert info.value.reserved == 4 * KiB
    assert "3072 bytes" in str(info.value)
    assert "4096 bytes reserved" in str(info.value)
    assert mm.storage_handle(keep) == keep_where
    assert mm.memory_usage() == MemoryUsage(1, 100, 28, 4 * KiB)
    assert mm.storage_handle(mm.reserve(3 * KiB)).size == 3 * KiB  # works again


def test_real_host_limit_recovers_through_cleanup() -> None:
    storage = BytesStorage(limit=3 * KiB)
    config = MemoryConfig.custom([ExclusivePages(MiB)])
    mm: MemoryManagement[np.ndarray] = MemoryManagement(storage, config, owner_id=1)
    a = mm.reserve(2 * KiB)
    mm.resource(a, 0, 2 * KiB)[:] = 1
    b = mm.reserve(KiB)
    mm.resource(b, 0, KiB)[:] = 2
    del a
    c = mm.reserve(1536)  # the free 2 KiB page would serve it: reused, not allocated
    del c
    mm.cleanup(explicit=True)
    d = mm.reserve(2 * KiB)
    with pytest.raises(OutOfMemory):
        mm.reserve(2 * KiB)
    assert (mm.resource(b, 0, KiB) == 2).all()
    del d


def test_foreign_handle_is_invalid() -> None:
    mine, theirs = _manager(), MemoryManagement(FakeStorage(), SMALL, owner_id=8)
    foreign = theirs.reserve(100)
    with pytest.raises(InvalidHandle, match="another client"):
        mine.storage_handle(foreign)
    with pytest.raises(InvalidHandle, match="another client"):
        mine.resource(foreign, 0, 10)


def test_same_owner_id_but_other_manager_is_invalid() -> None:
    a, b = _manager(), _manager()
    h = b.reserve(10)
    with pytest.raises(InvalidHandle):
        a.storage_handle(h)


def test_unknown_slice_id_is_invalid() -> None:
    mm = _manager()
    ghost = SliceHandle(10**9, mm.queue)
    with pytest.raises(InvalidHandle, match="unknown or was freed"):
        mm.storage_handle(ghost)
    del ghost
    mm.memory_usage()  # the ghost's id is drained and ignored


def test_resource_out_of_range_is_invalid() -> None:
    mm = _manager()
    h = mm.reserve(100)
    for start, size in ((0, 101), (90, 11), (-1, 5), (0, -1)):
        with pytest.raises(InvalidHandle, match="outside"):
            mm.resource(h, start, size)


def test_closed_manager_invalidates_everything() -> None:
    mm = _manager()
    h = mm.reserve(100)
    big = mm.reserve(100 * KiB)
    mm.close()
    assert mm.queue.closed
    storage: FakeStorage = mm.storage  # type: ignore[assignment]
    assert storage.sizes == {}
    with pytest.raises(InvalidHandle, match="closed"):
        mm.storage_handle(h)
    with pytest.raises(InvalidHandle, match="closed"):
        mm.resource(h, 0, 1)
    with pytest.raises(InvalidHandle, match="closed"):
        mm.reserve(10)
    del h, big  # dropping handles of a closed manager is harmless
    mm.cleanup(explicit=True)
    mm.close()


# -- handle lifetime ---------------------------------------------------------------------


def test_release_from_another_thread_returns_the_slice() -> None:
    mm = _manager()
    holder = [mm.reserve(100)]
    where = mm.storage_handle(holder[0])
    thread = threading.Thread(target=holder.clear)
    thread.start()
    thread.join()
    assert len(mm.queue) == 1
    assert mm.memory_usage().number_allocs == 0
    assert len(mm.queue) == 0
    assert mm.storage_handle(mm.reserve(100)) == where


def test_many_threads_dropping_at_once() -> None:
    mm = _manager()
    handles = [mm.reserve(64) for _ in range(200)]
    chunks = [handles[i::4] for i in range(4)]
    del handles
    threads = [threading.Thread(target=c.clear) for c in chunks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    del chunks, threads
    assert mm.memory_usage().number_allocs == 0


def test_slice_lives_while_any_reference_does() -> None:
    mm = _manager()
    h = mm.reserve(100)
    other = h
    del h
    gc.collect()
    assert mm.memory_usage().number_allocs == 1
    assert mm.is_live(other.id)
    sid = other.id
    del other
    assert mm.memory_usage().number_allocs == 0
    assert not mm.is_live(sid)


def test_no_release_before_drain() -> None:
    mm = _manager()
    h = mm.reserve(100)
    sid = h.id
    del h
    assert len(mm.queue) == 1
    assert mm.is_live(sid)  # until the owner thread drains
    mm.cleanup(explicit=False)
    assert not mm.is_live(sid)


# -- persistent mode ---------------------------------------------------------------------


def _persistent_allocs(mm: MemoryManagement[object]) -> int:
    return mm.report().persistent.usage.number_allocs


def test_persistent_windows_nest() -> None:
    mm = _manager()
    modes = []
    mm.mode(MemoryAllocationMode.PERSISTENT)
    mm.mode(MemoryAllocationMode.PERSISTENT)
    mm.mode(MemoryAllocationMode.AUTO)
    modes.append(mm.current_mode)
    a = mm.reserve(100)
    mm.mode(MemoryAllocationMode.AUTO)
    modes.append(mm.current_mode)
    b = mm.reserve(100)
    mm.mode(MemoryAllocationMode.AUTO)  # unbalanced AUTO is ignored
    modes.append(mm.current_mode)
    assert modes == [
        MemoryAllocationMode.PERSISTENT,
        MemoryAllocationMode.AUTO,
        MemoryAllocationMode.AUTO,
    ]
    assert _persistent_allocs(mm) == 1
    del a, b


def test_persistent_context_reuses_exact_sizes() -> None:
    mm = _manager()
    with mm.persistent():
        w = mm.reserve(1000)
        where = mm.storage_handle(w)
        del w
        again = mm.reserve(1000)
        other = mm.reserve(1001)
    assert mm.storage_handle(again) == where
    assert mm.storage_handle(other).id != where.id
    assert _persistent_allocs(mm) == 2
    auto = mm.reserve(1000)
    assert _persistent_allocs(mm) == 2
    assert mm.storage_handle(auto).id != where.id
    del again, other, auto
    mm.cleanup(explicit=True)
    assert mm.memory_usage().bytes_reserved == 0


def test_persistent_size_match_reuses_outside_windows() -> None:
    config = MemoryConfig.custom(SMALL.pools)
    config = MemoryConfig("custom", config.pools, persistent_size_match=True)
    mm = _manager(config)
    with mm.persistent():
        w = mm.reserve(1000)
    where = mm.storage_handle(w)
    del w
    again = mm.reserve(1000)  # AUTO, but a free persistent slice has this size
    assert mm.storage_handle(again) == where
    other = mm.reserve(500)  # no such size: the dynamic pools
    assert _persistent_allocs(mm) == 1
    del again, other


# -- cleanup policies --------------------------------------------------------------------


def test_exclusive_pages_expire_after_the_dealloc_period() -> None:
    mm = _manager()
    big = mm.reserve(100 * KiB)
    del big
    for _ in range(12):
        _h = mm.reserve(100)
    report = mm.report()
    assert report.pools[1].pages == 0
    assert report.pools[0].pages == 1


def test_sliced_pages_survive_implicit_cleanup() -> None:
    mm = _manager()
    h = mm.reserve(100)
    del h
    for _ in range(3):
        mm.cleanup(explicit=False)
    assert mm.memory_usage().bytes_reserved == 4 * KiB
    mm.cleanup(explicit=True)
    assert mm.memory_usage().bytes_reserved == 0


def test_cache_ratio_releases_empty_pages_before_growing() -> None:
    pools = [SlicedPages(4 * KiB, 1 * KiB), SlicedPages(64 * KiB, 16 * KiB)]
    mm = _manager(MemoryConfig.custom(pools, cache_ratio=0.0))
    small = mm.reserve(100)
    del small
    big = mm.reserve(10 * KiB)  # growth: the small pool's empty page goes first
    assert mm.memory_usage().bytes_reserved == 64 * KiB
    keep = mm.reserve(100)  # growth again, nothing empty to release
    assert mm.memory_usage().bytes_reserved == 68 * KiB
    del big, keep


def test_without_cache_ratio_empty_pages_stay() -> None:
    pools = [SlicedPages(4 * KiB, 1 * KiB), SlicedPages(64 * KiB, 16 * KiB)]
    mm = _manager(MemoryConfig.custom(pools))
    small = mm.reserve(100)
    del small
    big = mm.reserve(10 * KiB)
    assert mm.memory_usage().bytes_reserved == 68 * KiB
    del big


def test_cache_ratio_keeps_a_fraction() -> None:
    pools = [ExclusivePages(MiB)]
    mm = _manager(MemoryConfig.custom(pools, cache_ratio=0.5))
    live = [mm.reserve(10 * KiB) for _ in range(4)]
    spare = [mm.reserve(5 * KiB) for _ in range(2)]
    del spare  # 10 KiB free
    other = mm.reserve(30 * KiB)  # keep <= 0.5 * (40 + 30) KiB: both free pages stay
    assert mm.memory_usage().bytes_reserved == 80 * KiB
    del live, other


def test_pending_coalesce_list_stays_bounded() -> None:
    from asynccube._core.memory.pools import _MAX_DIRTY

    mm = _manager()
    for _ in range(3 * _MAX_DIRTY):
        h = mm.reserve(100)
        del h
    sliced = mm.pools[0]
    assert isinstance(sliced, SlicedPool)
    assert len(sliced._dirty) <= _MAX_DIRTY + 1024
    assert mm.memory_usage().bytes_reserved == 4 * KiB
