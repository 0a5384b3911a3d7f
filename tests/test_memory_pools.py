"""Each pool on its own: sliced, exclusive and persistent."""

from __future__ import annotations

import pytest

from asynccube._core.memory import ExclusivePool, PersistentPool, SlicedPool
from asynccube._core.memory.pools import FREE, Slice

from .memory_fakes import FakeStorage


def _reserve(pool: SlicedPool | ExclusivePool, storage: FakeStorage, size: int) -> Slice:
    return pool.try_reserve(size) or pool.alloc(storage, size)


def _layout(pool: SlicedPool) -> list[list[tuple[int, int, bool]]]:
    """(offset, extent, live) of every slice, page by page."""
    out = []
    for page in pool.pages.values():
        row = []
        sl = page.head
        while sl is not None:
            row.append((sl.offset, sl.size, sl.used >= 0))
            sl = sl.next
        out.append(row)
    return out


# -- sliced ------------------------------------------------------------------------------


def test_sliced_carves_one_page_first_fit() -> None:
    storage, pool = FakeStorage(), SlicedPool(1024, 512, 64)
    a = _reserve(pool, storage, 100)
    b = _reserve(pool, storage, 64)
    assert storage.allocs == 1
    assert (a.offset, a.size, a.used) == (0, 128, 100)
    assert (b.offset, b.size) == (128, 64)
    assert _layout(pool) == [[(0, 128, True), (128, 64, True), (192, 832, False)]]
    assert pool.usage().bytes_in_use == 164
    assert pool.usage().bytes_padding == 28
    assert pool.usage().bytes_reserved == 1024


def test_sliced_reuses_an_exact_size_first() -> None:
    storage, pool = FakeStorage(), SlicedPool(1024, 512, 64)
    a = _reserve(pool, storage, 100)
    _reserve(pool, storage, 64)
    pool.release(a)
    again = pool.try_reserve(120)  # same 128-byte extent
    assert again is a
    assert again.used == 120


def test_sliced_best_fit_splits_the_smallest_free_slice() -> None:
    storage, pool = FakeStorage(), SlicedPool(4096, 4096, 64)
    big = _reserve(pool, storage, 1024)
    _reserve(pool, storage, 64)
    small = _reserve(pool, storage, 256)
    _reserve(pool, storage, 64)
    pool.release(big)
    pool.release(small)
    got = pool.try_reserve(128)
    assert got is small  # the 256-byte hole, not the 1024-byte one nor the tail
    assert got.size == 128
    assert storage.allocs == 1


def test_sliced_coalesces_free_neighbours_when_nothing_fits() -> None:
    storage, pool = FakeStorage(), SlicedPool(1024, 1024, 64)
    parts = [_reserve(pool, storage, 256) for _ in range(4)]
    for sl in parts[:3]:
        pool.release(sl)
    got = pool.try_reserve(768)  # only the three freed neighbours merged can hold it
    assert got is not None
    assert (got.offset, got.size) == (0, 768)
    assert storage.allocs == 1
    assert _layout(pool) == [[(0, 768, True), (768, 256, True)]]


def test_sliced_grows_by_a_page_when_full() -> None:
    storage, pool = FakeStorage(), SlicedPool(1024, 1024, 64)
    _reserve(pool, storage, 1000)
    assert pool.try_reserve(100) is None
    _reserve(pool, storage, 100)
    assert storage.allocs == 2
    assert pool.pages_peak == 2


def test_sliced_releases_pages_only_on_explicit_cleanup() -> None:
    storage, pool = FakeStorage(), SlicedPool(1024, 512, 64)
    a = _reserve(pool, storage, 300)
    b = _reserve(pool, storage, 300)
    keep = _reserve(pool, storage, 500)  # second page
    pool.release(a)
    pool.release(b)
    pool.cleanup(storage, 10**6, explicit=False)
    assert len(pool.pages) == 2
    pool.cleanup(storage, 10**6, explicit=True)
    assert list(pool.pages) == [keep.page.handle.id]
    assert pool.reserved == 1024
    assert storage.deallocs == 1


def test_sliced_request_above_page_size_gets_its_own_rounded_page() -> None:
    storage, pool = FakeStorage(), SlicedPool(1024, 10_000, 64)
    big = _reserve(pool, storage, 2500)
    assert big.page.handle.size == 3072
    tail = _reserve(pool, storage, 500)  # served from the big page's rest
    assert tail.page is big.page
    assert storage.allocs == 1


def test_sliced_zero_size_takes_one_alignment_unit() -> None:
    storage, pool = FakeStorage(), SlicedPool(1024, 512, 64)
    a, b = _reserve(pool, storage, 0), _reserve(pool, storage, 0)
    assert a.size == b.size == 64
    assert a.offset != b.offset


# -- exclusive ---------------------------------------------------------------------------


def test_exclusive_gives_each_slice_its_own_page() -> None:
    storage, pool = FakeStorage(), ExclusivePool(1 << 20, 64)
    a, b = _reserve(pool, storage, 1000), _reserve(pool, storage, 1000)
    assert a.page is not b.page
    assert a.offset == b.offset == 0
    assert storage.allocs == 2
    assert pool.usage().bytes_reserved == 2048


def test_exclusive_reuses_a_free_page_within_max_waste() -> None:
    storage, pool = FakeStorage(), ExclusivePool(1 << 20, 64, max_waste=0.25)
    a = _reserve(pool, storage, 1024)
    pool.release(a)
    assert pool.try_reserve(700) is None  # 1024 is more than 1/4 above 704
    got = pool.try_reserve(900)
    assert got is a
    assert got.used == 900


def test_exclusive_without_max_waste_reuses_any_larger_page() -> None:
    storage, pool = FakeStorage(), ExclusivePool(1 << 20, 64)
    a = _reserve(pool, storage, 4096)
    pool.release(a)
    assert pool.try_reserve(10) is a


def test_exclusive_size_classes_round_pages_up() -> None:
    pool = ExclusivePool(1 << 30, 64, size_classes=4)
    assert pool.page_size_for(100) == 128
    assert pool.page_size_for(1_000_000) == 1_048_576  # 1,000,000 -> next of 4 per 2**k
    assert pool.page_size_for(786_433) == 917_504
    with pytest.raises(ValueError, match="power of two"):
        ExclusivePool(1024, 64, size_classes=3)


def test_exclusive_releases_pages_idle_for_the_period() -> None:
    storage = FakeStorage()
    pool = ExclusivePool(1 << 20, 64, dealloc_period=10)
    a = _reserve(pool, storage, 1000)
    busy = _reserve(pool, storage, 1000)
    pool.release(a)
    for now in range(2, 20, 2):  # checks every dealloc_period / 5 calls
        pool.tick(storage, now)
    assert list(pool.pages) == [busy.page.handle.id]
    assert a.used < 0


def test_exclusive_use_resets_idleness() -> None:
    storage = FakeStorage()
    pool = ExclusivePool(1 << 20, 64, dealloc_period=10)
    a = _reserve(pool, storage, 1000)
    for now in range(2, 40, 2):
        pool.release(a)
        pool.tick(storage, now)
        assert pool.try_reserve(1000) is a
    assert storage.allocs == 1


def test_exclusive_explicit_cleanup_releases_every_free_page() -> None:
    storage, pool = FakeStorage(), ExclusivePool(1 << 20, 64)
    a = _reserve(pool, storage, 1000)
    b = _reserve(pool, storage, 2000)
    pool.release(a)
    pool.cleanup(storage, 0, explicit=True)
    assert list(pool.pages) == [b.page.handle.id]
    pool.cleanup(storage, 0, explicit=False)  # no period: nothing more
    assert len(pool.pages) == 1


def test_exclusive_empty_pages_are_least_recently_used_first() -> None:
    storage, pool = FakeStorage(), ExclusivePool(1 << 20, 64)
    a, b, c = (_reserve(pool, storage, 1000 * (i + 1)) for i in range(3))
    pool.release(b)
    pool.release(a)
    pool.release(c)
    assert pool.empty_pages() == [b.page, a.page, c.page]


# -- persistent --------------------------------------------------------------------------


def test_persistent_reuses_only_the_same_aligned_size() -> None:
    storage, pool = FakeStorage(), PersistentPool(1 << 20, 64)
    a = _reserve(pool, storage, 1000)
    pool.release(a)
    assert pool.has_size(1000)
    assert pool.has_size(1020)  # same 1024-byte extent
    assert pool.try_reserve(900) is None
    assert pool.try_reserve(1000) is a
    assert not pool.has_size(1000)
    b = _reserve(pool, storage, 2000)
    assert b.page.handle.size == 2048


def test_persistent_frees_only_on_explicit_cleanup() -> None:
    storage, pool = FakeStorage(), PersistentPool(1 << 20, 64)
    a = _reserve(pool, storage, 1000)
    pool.release(a)
    pool.cleanup(storage, 10**9, explicit=False)
    assert len(pool.pages) == 1
    pool.cleanup(storage, 10**9, explicit=True)
    assert not pool.pages
    assert a.used < FREE
