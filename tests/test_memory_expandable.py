"""The expandable pool's bookkeeping (``memory/expandable.py``) without a GPU: a range
of addresses carved into slices, chunks mapped on demand through a fake backend that
checks every call, and released (at once, or later as a backend may), a chunk apiece or
in allocations given back only whole (as CUDA's range maps them); and, on a GPU, the pool
behind a client."""

from __future__ import annotations

import asyncio
import itertools
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import asynccube as ac
from asynccube._core.errors import MemoryLayoutError, OutOfMemory
from asynccube._core.memory import MemoryConfig, MemoryManagement, StorageHandle
from asynccube._core.memory.expandable import (
    MAPPED,
    RELEASING,
    UNMAPPED,
    ExpandablePool,
    MapFailed,
)
from asynccube._core.memory.pages import FREE
from asynccube._core.memory.storage import ChunkAllocations, DryStorage, StorageOutOfMemory

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from bench_memory_churn import churn, peak_ratio, pool_logic

KiB, MiB = 1 << 10, 1 << 20
CHUNK = 2 * MiB
ALIGN = 512


class CheckedChunks:
    """A chunk backend that asserts the pool's contract: it maps only unmapped chunks,
    unmaps only mapped ones, and never touches a chunk whose release is in flight.

    Args:
        handle: The range.
        deferred: Unmaps finish only at :meth:`finish` (a backend finishing later).
        whole: Chunks are mapped in allocations given back only whole, as CUDA's
            range makes them (``ChunkAllocations``): an unmap keeps the chunks of an
            allocation reaching past its run.
        fail_after: Map this many chunks, then fail once with StorageOutOfMemory.
    """

    def __init__(self, handle: StorageHandle, deferred: bool = False, whole: bool = False) -> None:
        self.handle = handle
        self.granularity = CHUNK
        self.chunks = bytearray(handle.size // CHUNK)
        self.deferred = deferred
        self.fail_after: int | None = None
        self.in_flight: list[tuple[int, int]] = []
        self.done: list[tuple[int, int]] = []
        self.maps = 0
        self.closed = False
        self.allocations = ChunkAllocations() if whole else ChunkAllocations(max_run=1)

    def map(self, first: int, count: int) -> None:
        assert not self.closed and count > 0
        for k, i in enumerate(range(first, first + count)):
            if self.fail_after is not None and k == self.fail_after:
                self.fail_after = None
                self._record(first, k)
                raise MapFailed(k, StorageOutOfMemory(CHUNK, "fake: device full"))
            assert self.chunks[i] == UNMAPPED, f"chunk {i} mapped twice or while released"
            self.chunks[i] = MAPPED
        self._record(first, count)
        self.maps += 1

    def _record(self, first: int, count: int) -> None:
        for start, size in self.allocations.split(first, count):
            self.allocations.add(start, size)

    def unmap(self, first: int, count: int) -> list[tuple[int, int]]:
        assert count > 0
        for i in range(first, first + count):
            assert self.chunks[i] == MAPPED, f"chunk {i} unmapped while not mapped"
        released, kept = self.allocations.release_plan(first, count)
        for start, size in released:
            self.allocations.remove(start)
            self.chunks[start : start + size] = bytes([RELEASING]) * size
            self.in_flight.append((start, size))
        if not self.deferred:
            self.finish()
        return kept

    def finish(self) -> None:
        """The in-flight unmaps are done."""
        for first, count in self.in_flight:
            self.chunks[first : first + count] = bytes(count)
            self.done.append((first, count))
        self.in_flight.clear()

    def unmapped(self) -> list[tuple[int, int]]:
        done, self.done = self.done, []
        return done

    def releasable(self, first: int, count: int) -> list[tuple[int, int]]:
        return self.allocations.releasable(first, count)

    @property
    def mapped(self) -> int:
        return self.chunks.count(MAPPED)


class RangeStorage(DryStorage):
    """A dry CUDA-like storage whose ranges are :class:`CheckedChunks`."""

    def __init__(
        self, deferred: bool = False, max_alloc: int = 64 * CHUNK, whole: bool = False
    ) -> None:
        super().__init__(ALIGN, max_alloc)
        self.deferred = deferred
        self.whole = whole
        self.ranges: dict[int, CheckedChunks] = {}
        self.reserve_range = self._checked_range

    def _checked_range(self, size: int) -> CheckedChunks:
        sid = next(self._ids)
        self._pages[sid] = 0
        handle = StorageHandle(sid, 0, -(-size // CHUNK) * CHUNK)
        chunks = CheckedChunks(handle, self.deferred, self.whole)
        self.ranges[sid] = chunks
        return chunks

    def dealloc(self, storage_id: int) -> None:
        chunks = self.ranges.pop(storage_id, None)
        if chunks is not None:
            chunks.closed = True
        super().dealloc(storage_id)


def manager(
    deferred: bool = False,
    cache_ratio: float | None = 0.0,
    virtual: int = 128 * CHUNK,
    whole: bool = False,
) -> tuple[MemoryManagement[Any], ExpandablePool, CheckedChunks]:
    storage = RangeStorage(deferred, max_alloc=virtual // 2, whole=whole)
    m = MemoryManagement(storage, MemoryConfig.expandable(cache_ratio=cache_ratio), owner_id=1)
    (pool,) = m.pools
    assert isinstance(pool, ExpandablePool)
    (chunks,) = storage.ranges.values()
    return m, pool, chunks


def check(m: MemoryManagement[Any], pool: ExpandablePool, chunks: CheckedChunks) -> None:
    """The pool's invariants: slices partition the range in order, aligned; every chunk
    a live slice touches is mapped; the pool's chunk states are the backend's; the bytes
    reserved are the chunks mapped or being released, within the range."""
    sl, offset, g = pool.range_page.head, 0, CHUNK
    while sl is not None:
        assert sl.offset == offset and sl.size > 0 and sl.offset % ALIGN == 0, sl
        if sl.used >= 0:
            assert sl.size % ALIGN == 0 and sl.used <= sl.size, sl
            a, b = sl.offset // g, -(-(sl.offset + sl.size) // g)
            assert pool.state.count(MAPPED, a, b) == b - a, f"{sl} over an unmapped chunk"
        offset += sl.size
        sl = sl.next
    assert offset == chunks.handle.size
    pool.collect()
    assert pool.state == chunks.chunks
    assert pool.reserved == (chunks.mapped + chunks.chunks.count(RELEASING)) * g
    assert pool.reserved <= chunks.handle.size
    assert m.memory_usage().bytes_reserved == pool.reserved


def offset_of(m: MemoryManagement[Any], h: Any) -> int:
    return m.storage_handle(h).offset


# -- behaviour ------------------------------------------------------------------------


def test_it_grows_in_place_at_the_end_of_one_range() -> None:
    m, pool, chunks = manager()
    handles = [m.reserve(k * 3 * MiB) for k in range(1, 5)]
    ids = {m.storage_handle(h).id for h in handles}
    offsets = [offset_of(m, h) for h in handles]
    assert ids == {chunks.handle.id} and len(pool.pages) == 1  # one range, no new page
    assert offsets == [0, 3 * MiB, 9 * MiB, 18 * MiB]  # each one where the last ended
    assert pool.reserved == 15 * CHUNK  # 30 MiB: the chunks touched, no more
    check(m, pool, chunks)


def test_a_dropped_tail_is_given_back_and_a_hole_is_reused_without_mapping() -> None:
    m, pool, chunks = manager(cache_ratio=None)
    a, b, c = m.reserve(8 * MiB), m.reserve(8 * MiB), m.reserve(8 * MiB)
    del b
    maps = chunks.maps
    b2 = m.reserve(6 * MiB)  # fits the hole b left: mapped already
    assert chunks.maps == maps and offset_of(m, b2) == 8 * MiB
    del c
    m.cleanup(explicit=True)  # the free tail goes back; a and b2 stay
    assert pool.reserved == 7 * CHUNK  # [0, 14 MiB)
    check(m, pool, chunks)
    del a, b2
    m.cleanup(explicit=True)
    assert pool.reserved == 0 and chunks.mapped == 0
    check(m, pool, chunks)


def test_the_tail_goes_back_once_it_stayed_free_for_a_periodic_check() -> None:
    m, pool, chunks = manager(cache_ratio=None)
    keep, tail = m.reserve(4 * MiB), m.reserve(20 * MiB)
    del tail
    m.memory_usage()  # the release queue drained
    pool.tick(m.storage, m.alloc_calls)
    assert pool.reserved == 12 * CHUNK  # free for one check only: kept
    pool.tick(m.storage, m.alloc_calls)
    assert pool.reserved == 2 * CHUNK  # free at two checks: back, down to keep's chunks
    check(m, pool, chunks)
    assert keep is not None


def test_growth_releases_free_chunks_but_those_it_uses() -> None:
    m, pool, chunks = manager(cache_ratio=0.0)
    hs = [m.reserve(6 * MiB) for _ in range(4)]  # [0, 24 MiB)
    del hs[0], hs[1]  # a 12 MiB hole at the start (hs[0] was [0, 6), hs[1] [12, 18))
    big = m.reserve(10 * MiB)  # no mapped fit: grows at the end, freeing the hole
    assert offset_of(m, big) == 24 * MiB
    assert pool.state[0:3] == bytes(3)  # the hole [0, 6 MiB) went back
    check(m, pool, chunks)


def test_chunks_still_being_released_are_never_mapped_again_until_done() -> None:
    m, pool, chunks = manager(deferred=True)
    hs = [m.reserve(4 * MiB) for _ in range(3)]
    del hs
    m.cleanup(explicit=True)  # handed over, not done
    assert pool.releasing_chunks == 6 and pool.reserved == 6 * CHUNK
    h = m.reserve(5 * MiB)  # placed past them (the backend asserts it)
    assert offset_of(m, h) == 12 * MiB
    check(m, pool, chunks)
    chunks.finish()
    pool.collect()
    assert pool.releasing_chunks == 0 and pool.reserved == 3 * CHUNK
    h2 = m.reserve(5 * MiB)  # where the fewest chunks must be mapped: after h
    assert offset_of(m, h2) == 17 * MiB
    h3 = m.reserve(10 * MiB)  # as many either way: the smaller room, the one they left
    assert offset_of(m, h3) == 0
    check(m, pool, chunks)


def test_a_map_that_fails_midway_keeps_what_it_mapped_and_the_retry_succeeds() -> None:
    m, pool, chunks = manager()
    chunks.fail_after = 2
    h = m.reserve(9 * MiB)  # 5 chunks: 2 mapped, then the device is full; retried
    assert offset_of(m, h) == 0 and m.storage_handle(h).size == 9 * MiB
    check(m, pool, chunks)


def test_a_full_range_is_out_of_memory_and_nothing_is_disturbed() -> None:
    m, pool, chunks = manager(virtual=16 * CHUNK)  # 32 MiB of addresses
    h, h2 = m.reserve(14 * MiB), m.reserve(14 * MiB)
    with pytest.raises(OutOfMemory, match="expandable range"):
        m.reserve(14 * MiB)
    assert (offset_of(m, h), offset_of(m, h2)) == (0, 14 * MiB)
    check(m, pool, chunks)


def test_close_frees_the_range() -> None:
    m, _, chunks = manager()
    m.reserve(5 * MiB)
    m.close()
    assert chunks.closed


def test_a_storage_without_virtual_memory_refuses_it() -> None:
    with pytest.raises(MemoryLayoutError, match="CUDA driver's virtual memory"):
        MemoryManagement(DryStorage(64), MemoryConfig.expandable(), owner_id=1)


@pytest.mark.parametrize("run", ["asyncio", "trio"])
def test_a_host_client_refuses_it_at_connect(run: str) -> None:
    async def main() -> None:
        with pytest.raises(MemoryLayoutError, match="host server has none"):
            await ac.connect("host", config={"memory": {"pool": "expandable"}})

    if run == "trio":
        trio = pytest.importorskip("trio")
        trio.run(main)
    else:
        asyncio.run(main())


def test_the_config_names_it_and_lists_the_choices() -> None:
    from asynccube._core.config.config import load_config
    from asynccube._core.server.settings import Settings

    config = load_config(None, overrides={"memory": {"pool": "expandable"}})
    layout = Settings(config).pool_layout()
    assert layout.preset == "expandable" and layout.cache_ratio == 0.0
    with pytest.raises(ac.ConfigError, match='"default", "exclusive", "expandable"'):
        load_config(None, overrides={"memory": {"pool": "growable"}})


def test_a_dry_run_for_a_gpu_reserves_through_it() -> None:
    from asynccube._core.host.dry import DryRunServer
    from asynccube._core.server.protocol import DeviceProperties

    target = DeviceProperties("gpu", "cuda", ALIGN, 80 << 30, {})
    server = DryRunServer(target=target, alignment=ALIGN, memory=MemoryConfig.expandable())
    (pool,) = server._memory.pools
    assert pool.kind == "expandable"
    server._memory.reserve(3 * MiB)
    assert server._memory.memory_usage().bytes_reserved == 2 * CHUNK


# -- properties -----------------------------------------------------------------------

ops = st.lists(
    st.tuples(st.booleans(), st.integers(0, 40 * MiB), st.integers(0, 2**16)),
    min_size=1,
    max_size=60,
)


@settings(max_examples=60, deadline=None)
@given(
    ops=ops,
    deferred=st.booleans(),
    ratio=st.sampled_from([None, 0.0, 0.1]),
    whole=st.booleans(),
)
def test_random_reserves_and_frees_keep_the_invariants(
    ops: list[tuple[bool, int, int]], deferred: bool, ratio: float | None, whole: bool
) -> None:
    m, pool, chunks = manager(deferred, ratio, virtual=512 * CHUNK, whole=whole)
    live: list[Any] = []
    for k, (alloc, size, pick) in enumerate(ops):
        if alloc or not live:
            live.append(m.reserve(size))
        else:
            del live[pick % len(live)]
        if k % 7 == 6:
            m.cleanup(explicit=True)
            check(m, pool, chunks)
            touched = _touched(pool)
            kept = pool.reserved - chunks.chunks.count(RELEASING) * CHUNK
            # every free chunk (tail included) went back, but those an allocation reaching
            # a live slice keeps mapped
            assert kept == _held(pool, chunks, touched) * CHUNK
        if deferred and pick % 3 == 0:
            chunks.finish()
        check(m, pool, chunks)
    spans = sorted((offset_of(m, h), m.storage_handle(h).size) for h in live)
    for (a, n), (b, _) in itertools.pairwise(spans):
        assert a + n <= b, "live slices overlap"


def test_a_free_run_is_offered_without_the_chunks_a_live_allocation_keeps() -> None:
    """40 MiB mapped in one run (allocations of 2 chunks), dropped, then 1 MiB taken at
    its start: chunk 1 is free but shares its allocation with the live chunk 0, so the
    empty page offered starts at chunk 2, and dropping it gives back all it says."""
    m, pool, chunks = manager(False, None, virtual=512 * CHUNK, whole=True)
    big = m.reserve(40 * MiB)
    assert chunks.allocations.runs[0] == 2
    del big
    small = m.reserve(1 * MiB)
    assert offset_of(m, small) == 0
    (page,) = pool.empty_pages()
    assert (page.handle.offset, page.handle.size) == (2 * CHUNK, 18 * CHUNK)
    before = pool.mapped_chunks
    pool.drop_empty_page(m.storage, page)
    assert before - pool.mapped_chunks == 18 and pool.mapped_chunks == 2
    check(m, pool, chunks)


@settings(max_examples=40, deadline=None)
@given(ops=ops, whole=st.booleans())
def test_an_empty_page_offered_gives_back_all_its_bytes(
    ops: list[tuple[bool, int, int]], whole: bool
) -> None:
    """What ``empty_pages`` offers is what dropping it gives back, chunk for chunk (the
    manager's trims and high-water bound count it): with allocations given back only
    whole, a free run's chunks whose allocation reaches a live slice are not offered."""
    m, pool, chunks = manager(False, None, virtual=512 * CHUNK, whole=whole)
    live: list[Any] = []
    for alloc, size, pick in ops:
        if alloc or not live:
            live.append(m.reserve(size))
        else:
            del live[pick % len(live)]
    m.cleanup(explicit=False)
    for page in pool.empty_pages():
        before = pool.mapped_chunks
        pool.drop_empty_page(m.storage, page)
        assert (before - pool.mapped_chunks) * CHUNK == page.handle.size, page
    check(m, pool, chunks)


def _touched(pool: ExpandablePool) -> set[int]:
    """Chunks some live slice touches."""
    touched: set[int] = set()
    sl = pool.range_page.head
    while sl is not None:
        if sl.used != FREE:
            touched.update(range(sl.offset // CHUNK, -(-(sl.offset + sl.size) // CHUNK)))
        sl = sl.next
    return touched


def _held(pool: ExpandablePool, chunks: CheckedChunks, touched: set[int]) -> int:
    """Chunks of the allocations that back some touched chunk (all of them stay mapped:
    an allocation is given back only whole)."""
    runs = chunks.allocations.runs
    return sum(n for a, n in runs.items() if any(i in touched for i in range(a, a + n)))


def test_the_churn_fragments_the_sliced_pools_not_the_expandable_one() -> None:
    """The benchmark's churn (growing and shrinking tensors), through the pool logic:
    the default (sliced) layout reserves at its peak >= 1.5x its peak in use, the
    expandable pool <= 1.1x, on the same sequence."""
    sequence = churn(seed=0)
    assert peak_ratio(MemoryConfig.default(), sequence) >= 1.5
    assert peak_ratio(MemoryConfig.expandable(), sequence) <= 1.1


@settings(max_examples=12, deadline=None)
@given(
    seed=st.integers(0, 2**20),
    tensors=st.integers(8, 24),
    low=st.sampled_from([256 * KiB, 512 * KiB, 1 * MiB]),
    steps=st.sampled_from([200, 400]),
)
def test_under_any_churn_it_reserves_at_most_two_chunks_a_tensor_beyond_its_use(
    seed: int, tensors: int, low: int, steps: int
) -> None:
    """Before it maps more, the pool releases every free chunk: at its peak it holds
    the chunks its live tensors touch, at most two partial chunks each beyond their
    bytes (where tensors are few MiB each and few in use, that can exceed 1.1x: 2 MiB
    chunks are the driver's granularity)."""
    sequence = churn(seed=seed, tensors=tensors, steps=steps, low=low)
    figs = pool_logic(MemoryConfig.expandable(), sequence)
    bound = figs["peak_in_use"] + (tensors + 1) * (2 * CHUNK + ALIGN)
    assert figs["peak_reserved"] <= bound, figs


# -- on a GPU (run by the lead on an H100/H200) ------------------------------------------


def _base(client: ac.ComputeClient) -> int:
    """The device address the client's expandable range starts at."""
    server: Any = client._server
    (pool,) = server._memory.pools
    assert pool.kind == "expandable"
    return int(server._storage._ranges[pool.backend.handle.id].base)


_BODIES = [np.arange(n, dtype=np.float32) for n in (1, 1000, 3 << 17, 9 << 17)]
"""4 B to 4.5 MiB: runs of several chunks, made at import: the test's own host work on
the loop stays well under the 5 ms probe (a first version built and compared 36 MiB
there, through ``.tolist()``: 1 s)."""


@pytest.mark.cuda
async def test_write_read_free_on_a_gpu(anyio_backend: str) -> None:
    async with ac.open_client("cuda:0", config={"memory": {"pool": "expandable"}}) as client:
        data = _BODIES
        handles = [client.create(a) for a in data]
        got = await client.read([h.binding() for h in handles])
        assert [
            np.array_equal(np.frombuffer(g, np.float32), a) for g, a in zip(got, data, strict=True)
        ] == [True] * 4
        client.write([(handles[1].copy_descriptor((1000,), (1,), 4), np.ones(1000, np.float32))])
        (one,) = await client.read([handles[1].binding()])
        assert np.frombuffer(one, np.float32).sum() == 1000
        del handles, got
        await client.sync()
        client.memory_cleanup()
        usage = await client.memory_usage()
        assert usage.bytes_in_use == 0


@pytest.mark.cuda
async def test_it_grows_in_place_on_a_gpu(anyio_backend: str) -> None:
    async with ac.open_client("cuda:0", config={"memory": {"pool": "expandable"}}) as client:
        handles = [client.create(np.full(1 << 18, 1.0, np.float32))]
        await client.sync()
        base = _base(client)
        reserved = [(await client.memory_usage()).bytes_reserved]
        for k in range(2, 8):  # 2 MiB, 3 MiB, ... each needs the range to grow
            handles.append(client.create(np.full(k << 18, float(k), np.float32)))
            reserved.append((await client.memory_usage()).bytes_reserved)
        assert _base(client) == base  # the same range, grown at its end
        assert reserved == sorted(reserved) and reserved[-1] > reserved[0]
        got = await client.read([h.binding() for h in handles])
        assert [float(np.frombuffer(g, np.float32)[-1]) for g in got] == [1.0, *range(2, 8)]


@pytest.mark.cuda
async def test_memory_goes_back_to_the_device(anyio_backend: str) -> None:
    from asynccube._core.cuda.driver import check, cu

    async with ac.open_client("cuda:0", config={"memory": {"pool": "expandable"}}) as client:
        free_before = int(check(cu().cuMemGetInfo())[0])
        handles = [client.empty(64 << 20) for _ in range(4)]
        await client.sync()
        assert (await client.memory_usage()).bytes_reserved >= 256 << 20
        del handles
        await client.sync()
        client.memory_cleanup()  # unmaps the chunks at once
        assert (await client.memory_usage()).bytes_reserved == 0
        free_after = int(check(cu().cuMemGetInfo())[0])
        assert free_after >= free_before - (64 << 20), (free_before, free_after)


def test_a_plan_of_an_expandable_run_says_there_is_nothing_to_plan() -> None:
    m, _, _ = manager()
    m.reserve(5 * MiB)
    with pytest.raises(ac.InvalidArgument, match="maps what it uses"):
        m.report().plan()
