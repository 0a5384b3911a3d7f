"""Dry runs and measured plans (issue 31, point 3): a dry run records launches without
running them, still autotunes, reserves memory through the pools without mapping it,
and reads zeros; its report (peaks per pool and per size class) plans a layout that
serves the real run without growing; on each device, under asyncio and trio."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

import asynccube as ac
import asynccube._core.channel.trio_loop  # imported now, not on a probed loop
import asynccube._core.server.settings  # the same: open_client imports it late
from asynccube._core.memory.storage import DryStorage
from asynccube._core.tune.cache import device_fingerprint

from .kernels import ADD, NOOP, add_bindings, blocks
from .tune_helpers import SizeKey, three_speeds
from .tune_helpers import tuner as make_tuner

pytestmark = pytest.mark.anyio

SIZES = (100, 10_000, 300_000, 1_500_000)
"""float32 counts of the workload's buffers: one in each of four pools of the default
preset (and of its CUDA alignment)."""
INPUTS = {n: np.full(n, 1.5, np.float32) for n in SIZES}
"""Made once, off the probed loop."""


async def _workload(client: ac.ComputeClient) -> list[bytes]:
    """Allocate, add, read, drop: the same sequence in the dry and the real run."""
    results = []
    for n in SIZES:
        a, b, out = (client.create(INPUTS[n]) for _ in range(3))
        client.execute(ADD, blocks(n), add_bindings(a, b, out, n))
        (data,) = await client.read([out.binding()])
        results.append(data)
        del a, b, out
        await client.sync()
    return results


async def test_a_dry_run_plans_a_layout_the_real_run_serves_without_growing(
    device: str,
) -> None:
    async with ac.open_client(device, dry_run=True) as dry:
        assert dry.dry_run and "(dry run)" in dry.properties.name
        results = await _workload(dry)
        assert [len(r) for r in results] == [4 * n for n in SIZES]
        assert all(not any(r[:: 1 << 12]) and not any(r[-64:]) for r in results)  # zeros
        report = await dry.memory_report()
        records = [r for r in (await dry.timeline()).records if r.kind == "kernel"]
        assert [r.name for r in records] == [ADD.id] * len(SIZES)
        assert all(r.duration_ns == 0 for r in records)  # recorded, not run
    assert sum(p.reserved_peak for p in report.pools) > 0
    classes = {c.upper: c for c in report.size_classes}
    for n in SIZES:
        upper = 1 << (4 * n - 1).bit_length()
        assert classes[upper].peak_count == 3 and classes[upper].requests == 3
    plan = report.plan()
    used = [i for i, p in enumerate(report.pools) if p.reserved_peak]
    assert len(used) >= 3
    async with ac.open_client(device, config={"memory": {"pools": plan.pools}}) as real:
        assert not real.dry_run
        before = await real.memory_report()
        results = await _workload(real)
        after = await real.memory_report()
    assert [np.frombuffer(r, np.float32)[0] for r in results] == [3.0] * len(SIZES)
    assert [p.pages_allocated for p in after.pools] == [p.pages_allocated for p in before.pools]
    for planned, measured in zip(after.pools, report.pools, strict=True):
        assert planned.reserved_peak == measured.reserved_peak


async def test_a_dry_run_maps_no_memory(host_dry: ac.ComputeClient) -> None:
    h = host_dry.empty(1 << 30)  # a GiB, accounted only
    usage = await host_dry.memory_usage()
    assert usage.bytes_in_use == 1 << 30 and usage.bytes_reserved >= 1 << 30
    storage = host_dry._server.memory.storage  # type: ignore[attr-defined]
    assert isinstance(storage, DryStorage) and storage.allocated == usage.bytes_reserved
    resource = await host_dry.get_resource(h.binding())
    assert not resource.resource.flags.writeable and resource.resource.nbytes == 1 << 30
    del h


async def test_a_dry_run_checks_what_the_real_run_would_refuse(
    host_dry: ac.ComputeClient,
) -> None:
    h = host_dry.empty(16)
    cuda_only = ac.Kernel("cuda_only", cuda=ac.CudaSource("__global__ void k() {}", entry="k"))
    host_dry.execute(cuda_only, ac.CubeCount(1), ac.Bindings().with_buffers([h.binding()]))
    with pytest.raises(ac.KernelNotSupported, match="no host part"):
        await host_dry.sync()  # raised at the next await, as by the host server
    host_dry.write([(h.copy_descriptor((8,), (1,), 4), b"\0" * 16)])  # 32 bytes expected
    with pytest.raises(ac.InvalidArgument):
        await host_dry.sync()
    host_dry.execute(NOOP, ac.CubeCount(1), ac.Bindings().with_buffers([h.binding()]))
    await host_dry.sync()
    del h


async def test_a_dry_run_autotunes_and_measures_the_tuning_inputs(
    host_dry: ac.ComputeClient, tmp_path: Path
) -> None:
    calls: Counter[str] = Counter()
    tuner = make_tuner(tmp_path, "test_dry_run_tune", samples=2)
    await tuner.execute(host_dry, three_speeds(calls), 1000)
    result = tuner.result(host_dry, SizeKey(1024))
    assert result is not None and len(result.outcomes) == 3  # every candidate ran its cycle
    assert sum(calls.values()) == 3 * (1 + 2) + 1  # warm-up, samples, then the pick
    assert (await host_dry.memory_report()).size_classes  # its buffers were accounted
    assert "(dry run)" in device_fingerprint(host_dry)  # its picks never reach a real client
    records = [r for r in (await host_dry.timeline()).records if r.kind == "kernel"]
    assert len(records) == sum(calls.values()) and all(r.duration_ns == 0 for r in records)


@pytest.fixture
async def host_dry() -> AsyncIterator[ac.ComputeClient]:
    """A dry run of the host server."""
    async with ac.open_client("host", dry_run=True) as client:
        yield client


async def test_dry_run_must_be_a_bool() -> None:
    with pytest.raises(ac.InvalidArgument, match="dry_run must be True or False"):
        await ac.connect("host", dry_run="yes")  # type: ignore[arg-type]


@pytest.mark.cuda
async def test_a_dry_run_of_a_gpu_is_sized_like_it() -> None:
    async with ac.open_client("cuda:0") as real:
        props = real.properties
    async with ac.open_client("cuda:0", dry_run=True) as dry:
        assert dry.device == "cuda (dry run)" and dry.dry_run
        assert dry.properties.name == f"{props.name} (dry run)"
        assert dry.properties.max_allocation == props.max_allocation
        h = dry.empty(100)
        usage = (await dry.memory_report()).pools[0].usage
        assert usage.bytes_padding == 512 - 100  # the GPU's alignment, not the host's
        del h
