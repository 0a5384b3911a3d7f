"""Bounded and adaptive autotune on the host server: a time bound that ends the search
at the first implementation within it, adaptive sampling that stops timing those far
behind the leader, and results that say why they picked what they did. Timings come
from host kernels that sleep known amounts (a sleep never ends early, so a bound below
the shortest sleep is never met and a slow sleeper is always far behind)."""

from __future__ import annotations

import logging
import math
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import asynccube as ac

from .tune_helpers import SizeKey, size_key, sleeper, tuner

SLOW_MS = 25.0
"""Far behind a 0 ms sleeper at any load (the prune ratio is 2)."""


def speeds(calls: Counter[str], *ms: float, **kwargs: Any) -> ac.TunableSet[SizeKey, int, str]:
    """A set of sleepers named ``t0``, ``t1``, ... sleeping ``ms`` each."""
    tunables = [sleeper(m, calls, f"t{i}") for i, m in enumerate(ms)]
    return ac.TunableSet(size_key, tunables=tunables, **kwargs)


def samples_of(result: ac.TuneResult) -> dict[str, int]:
    return {o.name: len(o.samples_ns) for o in result.outcomes}


# -- adaptive sampling ---------------------------------------------------------------


@pytest.mark.asyncio
async def test_adaptive_prunes_those_far_behind_and_stops_with_one_left(
    host_client: ac.ComputeClient, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    calls: Counter[str] = Counter()
    sampling = ac.AdaptiveSampling(min_samples=2, max_samples=8)
    ts = speeds(calls, SLOW_MS, SLOW_MS, 0, SLOW_MS, sampling=sampling)
    with caplog.at_level(logging.INFO, logger="asynccube.autotune"):
        result = await tuner(tmp_path).tune(host_client, ts, 100)
    assert result.fastest_name == "t2"
    assert result.reason is ac.TuneReason.PRUNED
    assert sorted(result.pruned) == ["t0", "t1", "t3"]
    # Pruned after min_samples; the leader, left alone, needs no more samples.
    assert samples_of(result) == {"t0": 2, "t1": 2, "t2": 2, "t3": 2}
    assert calls == {"t0": 3, "t1": 3, "t2": 3, "t3": 3}  # warm-up + 2 samples each
    assert [o.pruned for o in result.outcomes] == [False, True, True, True]
    assert "pruned early: t0, t1, t3" in result.explain()
    logged = [r.getMessage() for r in caplog.records if "Fastest result" in r.getMessage()]
    assert len(logged) == 1
    assert "pruned early" in logged[0]


@pytest.mark.asyncio
async def test_adaptive_contenders_continue_to_the_maximum(
    host_client: ac.ComputeClient, tmp_path: Path
) -> None:
    calls: Counter[str] = Counter()
    sampling = ac.AdaptiveSampling(min_samples=2, max_samples=5, prune_ratio=50.0)
    ts = speeds(calls, 1, SLOW_MS * 4, 1, sampling=sampling)
    result = await tuner(tmp_path).tune(host_client, ts, 100)
    assert result.fastest_name in ("t0", "t2")
    assert result.pruned == ("t1",)
    assert samples_of(result) == {"t0": 5, "t1": 2, "t2": 5}
    assert result.reason is ac.TuneReason.PRUNED


@pytest.mark.asyncio
async def test_fixed_count_when_sampling_is_off_or_nobody_is_behind(
    host_client: ac.ComputeClient, tmp_path: Path
) -> None:
    calls: Counter[str] = Counter()
    fixed = await tuner(tmp_path, samples=4).tune(
        host_client, speeds(calls, SLOW_MS, 0, sampling=False), 100
    )
    assert fixed.reason is ac.TuneReason.ALL_BENCHMARKED
    assert samples_of(fixed) == {"t0": 4, "t1": 4}
    assert fixed.pruned == ()
    close = ac.AdaptiveSampling(min_samples=1, max_samples=4, prune_ratio=1e5)
    result = await tuner(tmp_path, name="close").tune(
        host_client, speeds(calls, 2, 1, sampling=close), 100
    )
    assert result.reason is ac.TuneReason.ALL_BENCHMARKED  # nobody is 1e5x behind
    assert samples_of(result) == {"t0": 4, "t1": 4}


@pytest.mark.asyncio
async def test_adaptive_sampling_from_the_configuration(tmp_path: Path) -> None:
    config = {"autotune": {"adaptive": True, "min_samples": 2, "prune_ratio": 3.0}}
    async with ac.open_client("host", config=config) as client:
        calls: Counter[str] = Counter()
        t = tuner(tmp_path, samples=6)
        result = await t.tune(client, speeds(calls, SLOW_MS, 0), 100)
        assert result.reason is ac.TuneReason.PRUNED
        assert samples_of(result) == {"t0": 2, "t1": 2}
        # A set that says False keeps the fixed count whatever the configuration.
        off = await t.tune(client, speeds(calls, SLOW_MS, 0, version="2", sampling=False), 5000)
        assert samples_of(off) == {"t0": 6, "t1": 6}


@pytest.mark.asyncio
async def test_adaptive_sampling_from_the_environment(
    host_client: ac.ComputeClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ASYNCCUBE_AUTOTUNE_ADAPTIVE", "true")
    monkeypatch.setenv("ASYNCCUBE_AUTOTUNE_MIN_SAMPLES", "1")
    monkeypatch.setenv("ASYNCCUBE_AUTOTUNE_PRUNE_RATIO", "2.5")
    result = await tuner(tmp_path, samples=5).tune(host_client, speeds(Counter(), SLOW_MS, 0), 9)
    assert samples_of(result) == {"t0": 1, "t1": 1}
    assert result.reason is ac.TuneReason.PRUNED


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("prune_ratio", 1.0, "prune_ratio"),
        ("prune_ratio", "fast", "prune_ratio"),
        ("min_samples", 0, "min_samples"),
        ("adaptive", "sometimes", "adaptive"),
    ],
)
@pytest.mark.asyncio
async def test_bad_adaptive_configuration_is_refused(key: str, value: object, match: str) -> None:
    with pytest.raises(ac.ConfigError, match=match):
        async with ac.open_client("host", config={"autotune": {key: value}}):
            pass


# -- bounds ---------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_bound_takes_the_first_within_it_and_benchmarks_no_more(
    host_client: ac.ComputeClient, tmp_path: Path
) -> None:
    calls: Counter[str] = Counter()
    ts = speeds(calls, SLOW_MS, 0, 0, SLOW_MS, bound=ac.TuneBound(SLOW_MS / 2e3))
    t = tuner(tmp_path)
    assert await t.execute(host_client, ts, 100) == "t1"
    result = t.result(host_client, SizeKey(128))
    assert result is not None
    assert result.reason is ac.TuneReason.BOUND_MET
    assert result.skipped == ("t2", "t3")
    assert result.within_bound is True
    assert result.bound_s == pytest.approx(SLOW_MS / 2e3)
    assert [o.name for o in result.outcomes] == ["t1", "t0"]
    assert calls == {"t0": 4, "t1": 5}  # t2 and t3 never ran
    assert "2 not benchmarked" in result.explain()


@pytest.mark.asyncio
async def test_bound_nobody_meets_benchmarks_all_and_takes_the_fastest(
    host_client: ac.ComputeClient, tmp_path: Path
) -> None:
    calls: Counter[str] = Counter()
    ts = speeds(calls, 6, 2, 4, bound=1e-3)  # seconds: below every sleep
    result = await tuner(tmp_path).tune(host_client, ts, 100)
    assert result.fastest_name == "t1"
    assert result.reason is ac.TuneReason.ALL_BENCHMARKED
    assert result.within_bound is False
    assert result.skipped == ()
    assert calls == {"t0": 4, "t1": 4, "t2": 4}
    assert "none within the bound" in result.explain()


@pytest.mark.asyncio
async def test_bound_without_short_circuit_benchmarks_all(
    host_client: ac.ComputeClient, tmp_path: Path
) -> None:
    calls: Counter[str] = Counter()
    bound = ac.TuneBound(SLOW_MS / 1e3 * 4, short_circuit=False)  # everyone is within
    ts = speeds(calls, 2, 0, bound=bound)
    result = await tuner(tmp_path).tune(host_client, ts, 100)
    assert result.fastest_name == "t1"
    assert result.reason is ac.TuneReason.ALL_BENCHMARKED
    assert result.within_bound is True
    assert calls == {"t0": 4, "t1": 4}
    assert ts.checksum() == speeds(Counter(), 2, 0).checksum()  # the pick means the same


@pytest.mark.asyncio
async def test_bound_with_adaptive_sampling_prunes_those_far_beyond_it(
    host_client: ac.ComputeClient, tmp_path: Path
) -> None:
    calls: Counter[str] = Counter()
    sampling = ac.AdaptiveSampling(min_samples=1, max_samples=4)
    ts = speeds(calls, SLOW_MS, SLOW_MS, 0, 0, bound=5e-3, sampling=sampling)
    result = await tuner(tmp_path).tune(host_client, ts, 100)
    assert result.fastest_name == "t2"
    assert result.reason is ac.TuneReason.BOUND_MET
    assert sorted(result.pruned) == ["t0", "t1"]  # 25 ms > 2 x 5 ms after one sample
    assert samples_of(result) == {"t0": 1, "t1": 1, "t2": 4}
    assert result.skipped == ("t3",)


@pytest.mark.asyncio
async def test_bound_from_a_throughput_target_per_key(
    host_client: ac.ComputeClient, tmp_path: Path
) -> None:
    def bound(key: SizeKey) -> ac.TuneBound:
        return ac.TuneBound.throughput(key.n * 1000, 1e9)  # 1 us per unit of n

    calls: Counter[str] = Counter()
    ts = speeds(calls, SLOW_MS, 0, bound=bound)
    result = await tuner(tmp_path).tune(host_client, ts, 10_000)  # key n = 16384
    assert result.bound_s == pytest.approx(16384 * 1e-6)
    assert result.reason is ac.TuneReason.BOUND_MET
    assert result.fastest_name == "t1"
    assert ac.TuneBound.throughput(4e6, 1e9).seconds == pytest.approx(4e-3)
    assert ac.TuneBound.throughput(4e6, 1e9).ns == 4_000_000


@pytest.mark.asyncio
async def test_reasons_are_kept_on_disk_and_a_changed_bound_retunes(
    host_client: ac.ComputeClient, tmp_path: Path
) -> None:
    sampling = ac.AdaptiveSampling(min_samples=1, max_samples=3)
    ts = speeds(Counter(), SLOW_MS, 0, 0, bound=0.01, sampling=sampling)
    first = tuner(tmp_path)
    tuned = await first.tune(host_client, ts, 100)
    fresh = tuner(tmp_path)
    stored = await fresh.tune(host_client, ts, 100)
    assert fresh.runs == 0
    assert stored.source == "disk"
    assert stored == tuned
    assert (stored.reason, stored.skipped, stored.pruned) == (
        ac.TuneReason.BOUND_MET,
        ("t2",),
        ("t0",),
    )
    assert stored.bound_s == pytest.approx(0.01)
    # Another bound: the stored pick was the first within 10 ms, so it is retuned.
    other = speeds(Counter(), SLOW_MS, 0, 0, bound=0.02, sampling=sampling)
    assert other.checksum() != ts.checksum()
    await fresh.tune(host_client, other, 100)
    assert fresh.runs == 1


def test_entries_written_before_reasons_read_as_all_benchmarked() -> None:
    record = {
        "fastest_index": 1,
        "fastest_name": "b",
        "checksum": "c",
        "outcomes": [{"name": "b", "index": 1, "median_ns": 5, "samples_ns": [5]}],
    }
    result = ac.TuneResult.from_dict(record)
    assert result.reason is ac.TuneReason.ALL_BENCHMARKED
    assert (result.bound_s, result.skipped, result.pruned) == (None, (), ())
    with pytest.raises(ValueError):
        ac.TuneResult.from_dict(record | {"reason": "because"})
    with pytest.raises(TypeError):
        ac.TuneResult.from_dict(record | {"bound_s": "soon"})


@pytest.mark.asyncio
async def test_single_implementation_says_so(host_client: ac.ComputeClient, tmp_path: Path) -> None:
    result = await tuner(tmp_path).tune(host_client, speeds(Counter(), 1, bound=1.0), 1)
    assert result.reason is ac.TuneReason.SINGLE
    assert result.explain() == "the only implementation"


# -- bad input ------------------------------------------------------------------------


@pytest.mark.parametrize("seconds", [0, -1.0, math.inf, math.nan, True, "1"])
def test_bound_must_be_finite_and_positive(seconds: Any) -> None:
    with pytest.raises(ac.InvalidArgument, match="TuneBound"):
        ac.TuneBound(seconds)
    with pytest.raises(ac.InvalidArgument, match=r"(?i)bound"):
        speeds(Counter(), 1, 2, bound=seconds)


@pytest.mark.parametrize(("nbytes", "rate"), [(0, 1e9), (1e6, 0), (1e6, math.inf), (-1, 1)])
def test_throughput_must_be_finite_and_positive(nbytes: float, rate: float) -> None:
    with pytest.raises(ac.InvalidArgument, match="throughput"):
        ac.TuneBound.throughput(nbytes, rate)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"min_samples": 5, "max_samples": 3}, "min_samples=5 > max_samples=3"),
        ({"min_samples": 0}, "min_samples"),
        ({"max_samples": 0}, "max_samples"),
        ({"min_samples": 2.5}, "min_samples"),
        ({"prune_ratio": 1.0}, "prune_ratio must be > 1"),
        ({"prune_ratio": math.nan}, "prune_ratio"),
    ],
)
def test_adaptive_sampling_rejects_bad_counts(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ac.InvalidArgument, match=match):
        ac.AdaptiveSampling(**kwargs)


def test_tunable_set_rejects_bad_sampling_and_short_circuit() -> None:
    with pytest.raises(ac.InvalidArgument, match="sampling"):
        speeds(Counter(), 1, sampling="adaptive")
    with pytest.raises(ac.InvalidArgument, match="short_circuit"):
        ac.TuneBound(1.0, short_circuit="yes")  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_bound_function_returning_garbage_is_refused_and_the_client_serves(
    host_client: ac.ComputeClient, tmp_path: Path
) -> None:
    ts = speeds(Counter(), 1, 2, bound=lambda key: "soon")
    t = tuner(tmp_path)
    with pytest.raises(ac.InvalidArgument, match="returned 'soon'"):
        await t.tune(host_client, ts, 100)
    assert await host_client.read([host_client.create(b"ok").binding()]) == [b"ok"]
    ok = await t.tune(host_client, speeds(Counter(), 2, 0, version="2"), 100)
    assert ok.fastest_name == "t1"


# -- trio -----------------------------------------------------------------------------


def test_bounded_and_adaptive_under_trio(tmp_path: Path) -> None:
    trio = pytest.importorskip("trio")

    async def main() -> tuple[ac.TuneResult, ac.TuneResult]:
        sampling = ac.AdaptiveSampling(min_samples=2, max_samples=6)
        async with ac.open_client("host") as client:
            adaptive = await tuner(tmp_path).tune(
                client, speeds(Counter(), SLOW_MS, 0, SLOW_MS, sampling=sampling), 100
            )
            bounded = await tuner(tmp_path, name="bounded").tune(
                client, speeds(Counter(), SLOW_MS, 0, 0, bound=0.01), 100
            )
        return adaptive, bounded

    adaptive, bounded = trio.run(main)
    assert (adaptive.fastest_name, adaptive.reason) == ("t1", ac.TuneReason.PRUNED)
    assert samples_of(adaptive) == {"t0": 2, "t1": 2, "t2": 2}
    assert (bounded.fastest_name, bounded.reason, bounded.skipped) == (
        "t1",
        ac.TuneReason.BOUND_MET,
        ("t2",),
    )
