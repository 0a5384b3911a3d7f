"""Random alloc/free sequences: live slices never overlap and the accounting adds up."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asynccube._core.errors import BufferTooBig
from asynccube._core.memory import (
    ExclusivePages,
    MemoryConfig,
    MemoryManagement,
    SlicedPages,
    SliceHandle,
)
from asynccube._core.values.types import MemoryAllocationMode

from .memory_fakes import FakeStorage

KiB = 1024
MiB = 1024 * KiB

CONFIGS = {
    "default": MemoryConfig.default(),
    "default-no-cache": MemoryConfig.default(cache_ratio=None),
    "exclusive_pages": MemoryConfig.exclusive_pages(),
    "tiny": MemoryConfig.custom(
        [
            SlicedPages(1 * KiB, 256),
            SlicedPages(8 * KiB, 8 * KiB),
            ExclusivePages(256 * KiB, dealloc_period=20, size_classes=4, max_waste=0.25),
            SlicedPages(64 * KiB, 4 * MiB),
        ],
        cache_ratio=0.1,
    ),
}

sizes = st.one_of(
    st.integers(0, 600),
    st.integers(600, 20 * KiB),
    st.integers(20 * KiB, 5 * MiB),
    st.integers(5 * MiB, 300 * MiB),
)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("alloc"), sizes),
        st.tuples(st.just("free"), st.integers(0, 10**6)),
        st.tuples(st.just("mode"), st.booleans()),
        st.tuples(st.just("cleanup"), st.booleans()),
    ),
    max_size=120,
)


def _check(mm: MemoryManagement[Any], live: list[tuple[SliceHandle, int]]) -> None:
    storage: FakeStorage = mm.storage  # type: ignore[assignment]
    spans = []
    for handle, size in live:
        where = mm.storage_handle(handle)
        assert where.size == size
        assert where.offset % mm.alignment == 0
        assert where.id in storage.sizes
        assert where.offset + size <= storage.sizes[where.id]
        extent = max(size, 1)  # a zero-size slice still owns its unit
        spans.append((where.id, where.offset, where.offset + extent))
    spans.sort()
    for (id_a, _, end_a), (id_b, start_b, _) in itertools.pairwise(spans):
        assert id_a != id_b or end_a <= start_b, "live slices overlap"
    usage = mm.memory_usage()
    assert usage.number_allocs == len(live)
    assert usage.bytes_in_use == sum(size for _, size in live)
    assert usage.bytes_reserved == mm.bytes_reserved == storage.allocated


@pytest.mark.parametrize("name", sorted(CONFIGS))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=ops)
def test_random_sequences_keep_slices_apart(
    name: str, program: list[tuple[str, int | bool]]
) -> None:
    mm = MemoryManagement(FakeStorage(alignment=512), CONFIGS[name], owner_id=1)
    live: list[tuple[SliceHandle, int]] = []
    for op, arg in program:
        if op == "alloc" and arg > mm.max_allocation:
            with pytest.raises(BufferTooBig):
                mm.reserve(int(arg))
        elif op == "alloc":
            live.append((mm.reserve(int(arg)), int(arg)))
        elif op == "free" and live:
            live.pop(int(arg) % len(live))
        elif op == "mode":
            mode = MemoryAllocationMode.PERSISTENT if arg else MemoryAllocationMode.AUTO
            mm.mode(mode)
        elif op == "cleanup":
            mm.cleanup(explicit=bool(arg))
        _check(mm, live)
    live.clear()
    mm.cleanup(explicit=True)
    usage = mm.memory_usage()
    assert usage.bytes_reserved == 0
    assert usage.number_allocs == usage.bytes_in_use == 0
    assert mm.storage.sizes == {}  # type: ignore[attr-defined]
    mm.close()
