"""Memory pool layouts configured in code and in the file (issue 31, point 2): the rules
a layout must keep (typed errors naming the pool), caps that spill to the next pool,
every kind's empty pages unmapped by ``memory_cleanup``, the report pool by pool, and
the layout replaced in place on a live client; on each device, under asyncio and trio.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import asynccube as ac
import asynccube._core.channel.trio_loop  # imported now, not on a probed loop
import asynccube._core.server.settings  # the same: open_client imports it late
from asynccube._core.config.config import format_config, load_config, load_effective_config
from asynccube._core.config.pools import parse_pools
from asynccube._core.memory import MemoryConfig, MemoryManagement

from .kernels import ADD, SLOW_FILL, add_bindings, blocks
from .memory_fakes import FakeStorage

KiB = 1024
MiB = 1024 * KiB

SLICED = ac.PoolKind.SLICED
EXCLUSIVE = ac.PoolKind.EXCLUSIVE
DIRECT = ac.PoolKind.DIRECT
PERSISTENT = ac.PoolKind.PERSISTENT


def _four_kinds() -> ac.MemoryLayout:
    return ac.MemoryLayout(
        [
            ac.MemoryPool(SLICED, max_slice=16 * KiB, page_size=64 * KiB, max_total=64 * KiB),
            ac.MemoryPool(EXCLUSIVE, max_slice=256 * KiB),
            ac.MemoryPool(DIRECT, max_slice=4 * MiB),
            ac.MemoryPool(PERSISTENT, max_slice=4 * MiB),
        ]
    )


# -- the rules ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pools", "index", "match"),
    [
        ([{"kind": "sliced", "max_slice": 0, "page_size": 4096}], 0, r"max_slice=0 must be"),
        ([{"kind": "sliced", "max_slice": -1, "page_size": 4096}], 0, r"max_slice=-1"),
        ([{"kind": "sliced", "max_slice": 64}], 0, r"needs a page_size"),
        (
            [{"kind": "sliced", "max_slice": 64, "page_size": 4096, "max_total": 1024}],
            0,
            r"below one page",
        ),
        ([{"kind": "exclusive", "max_slice": 64, "page_size": 4096}], 0, r"sliced pools only"),
        ([{"kind": "paged", "max_slice": 64}], 0, r"kind 'paged' is not one of"),
        (
            [
                {"kind": "exclusive", "max_slice": 1 * MiB},
                {"kind": "sliced", "max_slice": 4096, "page_size": 65536},
            ],
            1,
            r"unreachable: pool 0 \(no cap, up to 1048576 bytes\)",
        ),
        (
            [
                {"kind": "exclusive", "max_slice": 4096},
                {"kind": "direct", "max_slice": 4096},
            ],
            1,
            r"unreachable",
        ),
        (
            [{"kind": "direct", "max_slice": 64}, {"kind": "direct", "max_slice": 0}],
            1,
            r"max_slice=0",
        ),
        (
            [
                {"kind": "direct", "max_slice": 64},
                {"kind": "persistent", "max_slice": 64},
                {"kind": "persistent", "max_slice": 128},
            ],
            2,
            r"at most one persistent",
        ),
        ([{"kind": "direct", "max_slice": 64, "sizes": 3}], 0, r"unknown key 'sizes'"),
    ],
)
def test_bad_layouts_name_the_pool(pools: list[dict[str, object]], index: int, match: str) -> None:
    with pytest.raises(ac.MemoryLayoutError, match=match) as caught:
        parse_pools(pools, False)  # as MemoryLayout([MemoryPool(**p), ...]) checks them
    assert caught.value.pool == index
    with pytest.raises(ac.ConfigError, match=rf"memory\.pools.*pool {index}: .*{match}"):
        load_config(overrides={"memory": {"pools": pools}})


def test_a_capped_pool_before_a_narrower_one_is_a_valid_spill_route() -> None:
    layout = ac.MemoryLayout(
        [
            ac.MemoryPool(EXCLUSIVE, max_slice=1 * MiB, max_total=4 * MiB),
            ac.MemoryPool(DIRECT, max_slice=1 * MiB),
        ]
    )
    assert [p.kind for p in layout.routed] == [EXCLUSIVE, DIRECT]
    with pytest.raises(ac.MemoryLayoutError, match="at least one sliced, exclusive or direct"):
        ac.MemoryLayout([ac.MemoryPool(PERSISTENT, max_slice=64)])
    with pytest.raises(ac.MemoryLayoutError, match="cache_ratio"):
        ac.MemoryLayout(layout.pools, cache_ratio=-1.0)
    assert isinstance(ac.MemoryLayoutError("x"), ac.InvalidArgument)


# -- the file and the environment ----------------------------------------------------------


def test_pools_from_a_toml_file(tmp_path: Path) -> None:
    (tmp_path / "asynccube.toml").write_text(
        """
[[memory.pools]]
kind = "sliced"
page_size = 65536
max_slice = 16384
max_total = 131072

[[memory.pools]]
kind = "direct"
max_slice = 4194304
"""
    )
    effective = load_effective_config(tmp_path, env={})
    pools = effective.config.memory.pools
    assert pools == (
        ac.MemoryPool(SLICED, 16384, page_size=65536, max_total=131072),
        ac.MemoryPool(DIRECT, 4194304),
    )
    # what ``python -m asynccube config`` prints is a valid file with the same pools
    (tmp_path / "again").mkdir()
    (tmp_path / "again" / "asynccube.toml").write_text(format_config(effective))
    assert load_config(tmp_path / "again", env={}).memory.pools == pools


def test_a_bad_pool_in_a_file_names_the_file_and_the_pool(tmp_path: Path) -> None:
    (tmp_path / "asynccube.toml").write_text(
        '[[memory.pools]]\nkind = "exclusive"\nmax_slice = 4096\n\n'
        '[[memory.pools]]\nkind = "sliced"\nmax_slice = 1024\npage_size = 4096\n'
    )
    with pytest.raises(ac.ConfigError, match=r"asynccube\.toml: memory\.pools = .*pool 1: unreach"):
        load_config(tmp_path, env={})


def test_pools_from_the_environment_as_json() -> None:
    env = {"ASYNCCUBE_MEMORY_POOLS": '[{"kind": "direct", "max_slice": 65536}]'}
    assert load_config(env=env).memory.pools == (ac.MemoryPool(DIRECT, 65536),)
    with pytest.raises(ac.ConfigError, match=r"ASYNCCUBE_MEMORY_POOLS.*not a JSON list"):
        load_config(env={"ASYNCCUBE_MEMORY_POOLS": "[{"})


# -- the manager (no client) ---------------------------------------------------------------


def _manager(layout: ac.MemoryLayout) -> tuple[MemoryManagement[object], FakeStorage]:
    storage = FakeStorage()
    return MemoryManagement(storage, MemoryConfig.from_layout(layout), owner_id=1), storage


def test_a_full_capped_pool_spills_to_the_next_that_accepts_the_size() -> None:
    memory, _ = _manager(
        ac.MemoryLayout(
            [
                ac.MemoryPool(SLICED, max_slice=4 * KiB, page_size=8 * KiB, max_total=8 * KiB),
                ac.MemoryPool(SLICED, max_slice=2 * KiB, page_size=4 * KiB),  # too small
                ac.MemoryPool(EXCLUSIVE, max_slice=64 * KiB),
            ]
        )
    )
    first = [memory.reserve(4 * KiB) for _ in range(2)]  # the capped pool's one page
    third = memory.reserve(4 * KiB)
    report = memory.report()
    assert [p.usage.number_allocs for p in report.pools] == [2, 0, 1]
    assert report.pools[0].reserved_peak == 8 * KiB and report.pools[0].max_total == 8 * KiB
    del first, third


def test_a_full_capped_pool_with_nowhere_to_spill_is_out_of_memory() -> None:
    memory, _ = _manager(
        ac.MemoryLayout([ac.MemoryPool(DIRECT, max_slice=4 * KiB, max_total=8 * KiB)])
    )
    held = [memory.reserve(4 * KiB), memory.reserve(4 * KiB)]
    with pytest.raises(ac.OutOfMemory, match=r"pool 0 \(direct\) is at its cap"):
        memory.reserve(64)
    held.pop()
    memory.reserve(64)  # room again once a buffer is gone: the manager kept serving


def test_a_capped_pool_releases_its_empty_pages_before_it_spills() -> None:
    memory, storage = _manager(
        ac.MemoryLayout(
            [
                ac.MemoryPool(EXCLUSIVE, max_slice=8 * KiB, max_total=8 * KiB),
                ac.MemoryPool(DIRECT, max_slice=8 * KiB),
            ]
        )
    )
    memory.reserve(4 * KiB)  # dropped at once: its page stays free in the pool
    keep = memory.reserve(8 * KiB)  # no room under the cap until that page goes
    assert memory.report().pools[0].usage.number_allocs == 1
    assert storage.sizes == {2: 8 * KiB}
    del keep


def test_cleanup_unmaps_the_empty_pages_of_every_kind() -> None:
    memory, storage = _manager(_four_kinds())
    handles = [memory.reserve(n) for n in (1 * KiB, 100 * KiB, 1 * MiB)]
    with memory.persistent():
        handles.append(memory.reserve(2 * MiB))
    assert [p.pages for p in memory.report().pools] == [1, 1, 1]
    assert memory.report().persistent.pages == 1
    handles.clear()
    memory._drain()
    assert memory.report().pools[2].pages == 0  # direct: given back with the buffer
    memory.cleanup(explicit=True)
    report = memory.report()
    assert [p.pages for p in (*report.pools, report.persistent)] == [0, 0, 0, 0]
    assert storage.sizes == {}


def test_replace_refuses_while_slices_live_and_returns_every_page() -> None:
    memory, storage = _manager(_four_kinds())
    live = memory.reserve(100)
    with pytest.raises(ac.MemoryInUse, match="1 buffer") as caught:
        memory.replace(MemoryConfig.default())
    assert caught.value.live == 1 and len(memory.pools) == 3  # nothing changed
    del live
    memory.replace(MemoryConfig.from_layout(ac.MemoryLayout([ac.MemoryPool(DIRECT, 4096)])))
    assert storage.sizes == {} and [p.kind for p in memory.pools] == ["direct"]
    assert memory.max_allocation == 4096


# -- on a client, each device, asyncio and trio -----------------------------------------------


@pytest.mark.anyio
async def test_a_layout_from_code_reaches_the_server_and_the_report(device: str) -> None:
    layout = _four_kinds()
    async with ac.open_client(device, config={"memory": {"pools": layout.pools}}) as client:
        assert client.config is not None and client.config.memory.pools == layout.pools
        handles = [client.create(np.ones(n, np.uint8)) for n in (1000, 50_000, 2_000_000)]
        report = await client.memory_report()
        assert [(p.kind, p.max_alloc_size, p.max_total) for p in report.pools] == [
            ("sliced", 16 * KiB, 64 * KiB),
            ("exclusive", 256 * KiB, None),
            ("direct", 4 * MiB, None),
        ]
        assert report.persistent.max_alloc_size == 4 * MiB
        assert [p.usage.number_allocs for p in report.pools] == [1, 1, 1]
        assert all(p.reserved_peak >= p.usage.bytes_in_use > 0 for p in report.pools)
        assert "cap 65536" in str(report)
        assert client.properties.max_allocation == 4 * MiB
        with pytest.raises(ac.BufferTooBig):
            client.empty(4 * MiB + 1)
        del handles


@pytest.mark.anyio
async def test_spill_when_capped_on_a_client(client: ac.ComputeClient) -> None:
    layout = ac.MemoryLayout(
        [
            ac.MemoryPool(SLICED, max_slice=64 * KiB, page_size=64 * KiB, max_total=64 * KiB),
            ac.MemoryPool(EXCLUSIVE, max_slice=1 * MiB),
        ]
    )
    await client.set_memory_layout(layout)
    handles = [client.create(np.zeros(16 * KiB, np.uint8)) for _ in range(6)]
    data = await client.read([h.binding() for h in handles])
    assert all(d == bytes(16 * KiB) for d in data)
    report = await client.memory_report()
    assert [p.usage.number_allocs for p in report.pools] == [4, 2]
    assert report.pools[0].usage.bytes_reserved == 64 * KiB
    del handles, data


@pytest.mark.anyio
async def test_cleanup_returns_memory_on_a_client(client: ac.ComputeClient) -> None:
    c = client
    await c.set_memory_layout(_four_kinds())
    handles = [c.empty(n) for n in (1 * KiB, 100 * KiB, 1 * MiB)]
    c.allocation_mode(ac.MemoryAllocationMode.PERSISTENT)
    handles.append(c.empty(2 * MiB))
    c.allocation_mode(ac.MemoryAllocationMode.AUTO)
    assert (await c.memory_usage()).bytes_reserved > 0
    handles.clear()
    await c.sync()
    c.memory_cleanup()
    report = await c.memory_report()
    assert [p.pages for p in (*report.pools, report.persistent)] == [0, 0, 0, 0]
    assert report.usage.bytes_reserved == 0


@pytest.mark.anyio
async def test_replace_the_layout_in_place_on_a_live_client(device: str) -> None:
    async with ac.open_client(device) as client:
        n = 1 << 16
        a, b, out = (client.create(np.full(n, 1.0, np.float32)) for _ in range(3))
        client.execute(ADD, blocks(n), add_bindings(a, b, out, n))
        (result,) = await client.read([out.binding()])
        assert np.frombuffer(result, np.float32)[0] == 2.0
        del a, b, out
        assert (await client.memory_usage()).bytes_reserved > 0
        layout = ac.MemoryLayout([ac.MemoryPool(SLICED, max_slice=1 * MiB, page_size=1 * MiB)])
        await client.set_memory_layout(layout)
        report = await client.memory_report()
        assert [p.kind for p in report.pools] == ["sliced"]
        assert report.usage.bytes_reserved == 0  # every page of the old pools went back
        assert client.properties.max_allocation == 1 * MiB
        h = client.create(np.arange(4, dtype=np.float32))  # the new pools serve
        (data,) = await client.read([h.binding()])
        assert np.frombuffer(data, np.float32).tolist() == [0, 1, 2, 3]
        with pytest.raises(ac.MemoryInUse, match="1 buffer") as caught:
            await client.set_memory_layout(_four_kinds())
        assert caught.value.live == 1
        (again,) = await client.read([h.binding()])  # the client kept serving
        assert again == data
        with pytest.raises(ac.InvalidArgument, match="must be a MemoryLayout"):
            await client.set_memory_layout([ac.MemoryPool(DIRECT, 64)])  # type: ignore[arg-type]
        del h


@pytest.mark.anyio
async def test_replace_waits_for_work_queued_before_it() -> None:
    async with ac.open_client("host") as client:
        h = client.empty(64)
        bindings = (
            ac.Bindings()
            .with_buffer(h.binding())
            .with_scalar(np.float32, [0.05])
            .with_scalar(np.uint8, [1])
        )
        client.execute(SLOW_FILL, ac.CubeCount(1), bindings)
        del h, bindings  # the queued launch still holds the buffer
        await client.set_memory_layout(ac.MemoryLayout([ac.MemoryPool(DIRECT, 1 * MiB)]))
        assert (await client.memory_report()).usage.bytes_reserved == 0
