"""The tuned reduction example, tuned on the GPU (device timing, NVRTC variants)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

import asynccube as ac

from .tune_example import load_example

pytestmark = pytest.mark.cuda

ex = load_example()
N = 1 << 20


def _data(n: int) -> np.ndarray:
    return np.random.default_rng(2).random(n, dtype=np.float32)


@pytest.mark.asyncio
async def test_tuned_reduction_on_the_gpu(tmp_path: Path) -> None:
    data = await asyncio.to_thread(_data, N)
    expected = float(data.sum(dtype=np.float64))
    async with ac.open_client("cuda:0") as client:
        tuner = ex.make_tuner(tmp_path, samples=5)
        x = client.create_array(data)
        total = await ex.tuned_sum(client, tuner, x)
        assert total == pytest.approx(expected, rel=1e-4)

        result = tuner.result(client, ex.SUM.generate_key(x))
        assert result is not None
        assert result.source == "tuned"
        assert sorted(o.name for o in result.outcomes) == sorted(ex.SUM.names)
        assert all(o.ok and o.min_ns and o.min_ns > 0 for o in result.outcomes), result
        assert len(tuner.check_reports) == 1
        assert tuner.check_reports[0].ok, tuner.check_reports[0]
        assert tuner.runs == 1

        # The tuner's samples are device timings on CUDA.
        async with client.profile() as timing:
            await ex.SUM[result.fastest_index](client, x)
        assert timing[0].method is ac.TimingMethod.DEVICE

        # Sizes that do not fill a block, and one past a power of two.
        for n in (1, 1000, 12_345, (1 << 16) + 3):
            part = client.create_array(data[:n])
            want = float(data[:n].sum(dtype=np.float64))
            assert await ex.tuned_sum(client, tuner, part) == pytest.approx(want, rel=1e-4)

        # A new tuner (as a new process would) reads the result from disk.
        again = ex.make_tuner(tmp_path)
        assert await ex.tuned_sum(client, again, x) == pytest.approx(expected, rel=1e-4)
        assert again.runs == 0
        cached = again.result(client, ex.SUM.generate_key(x))
        assert cached is not None
        assert cached.source == "disk"
        assert cached.fastest_name == result.fastest_name
        path = again.cache(client).path
        assert path is not None
        assert path.is_relative_to(tmp_path)
        assert "cuda_0" in str(path)


@pytest.mark.asyncio
async def test_background_tuning_on_the_gpu(tmp_path: Path) -> None:
    data = await asyncio.to_thread(_data, N)
    expected = float(data.sum(dtype=np.float64))
    async with ac.open_client("cuda:0") as client:
        tuner = ex.make_tuner(tmp_path, mode=ac.TuneMode.BACKGROUND, samples=3)
        x = client.create_array(data)
        sums = await asyncio.gather(*(ex.tuned_sum(client, tuner, x) for _ in range(20)))
        assert sums == pytest.approx([expected] * 20, rel=1e-4)
        await tuner.wait()
        assert tuner.runs == 1
        assert tuner.result(client, ex.SUM.generate_key(x)) is not None
        assert await ex.tuned_sum(client, tuner, x) == pytest.approx(expected, rel=1e-4)


def _repeated(times: int) -> ac.Tunable[ac.Tensor, ac.Tensor]:
    """The 256-thread sum launched ``times`` times: far behind on any GPU."""
    base = ex.SUM["block_256"]

    async def fn(client: ac.ComputeClient, x: ac.Tensor) -> ac.Tensor:
        out = await base(client, x)
        for i in range(times - 1):
            out = await base(client, x)
            if i % 10 == 0:
                await asyncio.sleep(0)  # launches queue inline: let the loop breathe
        return out

    return ac.Tunable(f"block_256_x{times}", fn)


@pytest.mark.asyncio
async def test_bounded_and_adaptive_tuning_on_the_gpu(tmp_path: Path) -> None:
    data = await asyncio.to_thread(_data, N)
    async with ac.open_client("cuda:0") as client:
        x = client.create_array(data)
        # Adaptive: the 200-fold variant is pruned after 2 device-timed samples.
        sampling = ac.AdaptiveSampling(min_samples=2, max_samples=6)
        adaptive = ac.TunableSet(
            ex.SUM.generate_key, tunables=[_repeated(200), *ex.SUM], sampling=sampling
        )
        tuner = ac.Tuner("cuda_adaptive", cache_dir=tmp_path)
        result = await tuner.tune(client, adaptive, x)
        assert result.reason is ac.TuneReason.PRUNED
        assert "block_256_x200" in result.pruned
        assert result.fastest_name in ex.SUM.names
        slow = next(o for o in result.outcomes if o.name == "block_256_x200")
        assert len(slow.samples_ns) == 2
        # Bounded: 4 bytes per element at 1 GB/s is far above any variant's time, so
        # the first one is taken and the rest are not benchmarked.
        bounded = ac.TunableSet(
            ex.SUM.generate_key,
            tunables=list(ex.SUM),
            bound=lambda key: ac.TuneBound.throughput(4 * key.n, 1e9),
        )
        result = await ac.Tuner("cuda_bounded", cache_dir=tmp_path).tune(client, bounded, x)
        assert result.reason is ac.TuneReason.BOUND_MET
        assert result.fastest_name == ex.SUM.names[0]
        assert result.skipped == ex.SUM.names[1:]
        assert result.within_bound is True
