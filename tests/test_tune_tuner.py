"""The tuner on the host server, with tunables of known, clearly different cost."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

import asynccube as ac

from .tune_helpers import (
    SAMPLES,
    SizeKey,
    kernel_failer,
    raiser,
    size_key,
    sleeper,
    three_speeds,
    tuner,
)

RUNS_PER_TUNABLE = 1 + SAMPLES  # warm-up + samples
ROOT = Path(__file__).resolve().parents[1]


def cache_file(client: ac.ComputeClient, t: ac.Tuner) -> Path:
    path = t.cache(client).path
    assert path is not None
    return path


@pytest.mark.asyncio
async def test_fastest_is_chosen_and_every_outcome_kept(
    host_client: ac.ComputeClient, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    calls: Counter[str] = Counter()
    ts = three_speeds(calls)
    t = tuner(tmp_path)
    with caplog.at_level(logging.INFO, logger="asynccube.autotune"):
        out = await t.execute(host_client, ts, 1000)
    assert out == "fast"
    result = t.result(host_client, SizeKey(1024))
    assert result is not None
    assert (result.fastest_name, result.fastest_index, result.source) == ("fast", 2, "tuned")
    assert [o.name for o in result.outcomes] == ["fast", "medium", "slow"]
    assert all(o.ok and len(o.samples_ns) == SAMPLES for o in result.outcomes)
    medians = [o.median_ns for o in result.outcomes]
    assert medians == sorted(medians)  # type: ignore[type-var]
    assert result.outcomes[-1].min_ns >= 4_000_000  # type: ignore[operator]  # slow: 5 ms
    assert calls == {
        "slow": RUNS_PER_TUNABLE,
        "medium": RUNS_PER_TUNABLE,
        "fast": RUNS_PER_TUNABLE + 1,
    }
    assert t.runs == 1
    top = [r.getMessage() for r in caplog.records if "Top 3 times" in r.getMessage()]
    assert len(top) == 1
    assert all(name in top[0] for name in ("fast", "medium", "slow"))


@pytest.mark.asyncio
async def test_known_key_runs_without_tuning(host_client: ac.ComputeClient, tmp_path: Path) -> None:
    calls: Counter[str] = Counter()
    ts = three_speeds(calls)
    t = tuner(tmp_path)
    await t.execute(host_client, ts, 1000)
    calls.clear()
    assert await t.execute(host_client, ts, 600) == "fast"  # anchors to the same key
    assert calls == {"fast": 1}
    assert t.runs == 1
    assert await t.execute(host_client, ts, 5000) == "fast"  # a new key: tuned again
    assert t.runs == 2


@pytest.mark.asyncio
async def test_single_tunable_skips_benchmarking(
    host_client: ac.ComputeClient, tmp_path: Path
) -> None:
    calls: Counter[str] = Counter()
    ts = ac.TunableSet(size_key, tunables=[sleeper(1, calls, "only")])
    t = tuner(tmp_path)
    assert await t.execute(host_client, ts, 10) == "only"
    assert calls == {"only": 1}
    assert t.runs == 0
    result = t.result(host_client, SizeKey(16))
    assert result is not None
    assert result.source == "single"
    assert result.outcomes == ()


@pytest.mark.asyncio
async def test_second_client_and_new_tuner_read_the_persisted_result(
    host_client: ac.ComputeClient, tmp_path: Path
) -> None:
    calls: Counter[str] = Counter()
    first = tuner(tmp_path)
    await first.execute(host_client, three_speeds(calls), 1000)
    assert json.loads(cache_file(host_client, first).read_text())["entries"]

    async with ac.open_client("host") as other:
        calls.clear()
        assert await first.execute(other, three_speeds(calls), 1000) == "fast"  # memory
        assert first.runs == 1
        assert calls == {"fast": 1}

        calls.clear()
        fresh = tuner(tmp_path)  # new process-like state: only the disk is shared
        assert await fresh.execute(other, three_speeds(calls), 1000) == "fast"
        assert fresh.runs == 0
        assert calls == {"fast": 1}
        result = fresh.result(other, SizeKey(1024))
        assert result is not None
        assert result.source == "disk"
        assert [o.name for o in result.outcomes] == ["fast", "medium", "slow"]


SECOND_PROCESS = """
import asyncio, json, sys
from collections import Counter
import asynccube as ac
from tests.tune_helpers import three_speeds, tuner

async def main():
    calls = Counter()
    t = tuner(sys.argv[1])
    async with ac.open_client("host") as client:
        out = await t.execute(client, three_speeds(calls), 1000)
    print(json.dumps({"out": out, "runs": t.runs, "calls": dict(calls)}))

asyncio.run(main())
"""


def test_second_process_reads_the_persisted_result(tmp_path: Path) -> None:
    async def tune_here() -> None:
        async with ac.open_client("host") as client:
            t = tuner(tmp_path)
            await t.execute(client, three_speeds(Counter()), 1000)
            assert t.runs == 1

    asyncio.run(tune_here())
    done = subprocess.run(
        [sys.executable, "-c", SECOND_PROCESS, str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report == {"out": "fast", "runs": 0, "calls": {"fast": 1}}


@pytest.mark.asyncio
async def test_changed_tunable_set_invalidates_the_entry(
    host_client: ac.ComputeClient, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    await tuner(tmp_path).execute(host_client, three_speeds(Counter()), 1000)

    bumped = tuner(tmp_path)
    calls: Counter[str] = Counter()
    with caplog.at_level(logging.INFO, logger="asynccube.autotune"):
        await bumped.execute(host_client, three_speeds(calls, version="2"), 1000)
    assert bumped.runs == 1
    assert calls["slow"] == RUNS_PER_TUNABLE
    assert any("changed" in r.getMessage() for r in caplog.records)

    calls.clear()
    grown = tuner(tmp_path)
    ts = three_speeds(calls, version="2").add(sleeper(1, calls, "extra"))
    await grown.execute(host_client, ts, 1000)
    assert grown.runs == 1
    assert calls["extra"] == RUNS_PER_TUNABLE
    entry = json.loads(cache_file(host_client, grown).read_text())["entries"]['{"n":1024}']
    assert entry["checksum"] == ts.checksum()
    assert {o["name"] for o in entry["outcomes"]} == {"slow", "medium", "fast", "extra"}


@pytest.mark.parametrize(
    "content",
    [
        b"\x00\xff garbage \xfe",
        b'{"format": 1, "entries": ',
        b"[1, 2, 3]",
        b'{"format": 1, "entries": {"{\\"n\\":1024}": {"checksum": 5}}}',
        b'{"format": 1, "entries": {"{\\"n\\":1024}": "nope"}}',
    ],
    ids=["binary", "truncated", "not-a-cache", "malformed-entry", "entry-not-object"],
)
@pytest.mark.asyncio
async def test_corrupt_cache_file_is_survived(
    host_client: ac.ComputeClient,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    content: bytes,
) -> None:
    first = tuner(tmp_path)
    await first.execute(host_client, three_speeds(Counter()), 1000)
    path = cache_file(host_client, first)
    path.write_bytes(content)

    t = tuner(tmp_path)
    with caplog.at_level(logging.WARNING, logger="asynccube.autotune"):
        assert await t.execute(host_client, three_speeds(Counter()), 1000) == "fast"
    assert t.runs == 1  # tuned afresh
    assert [r for r in caplog.records if r.levelno == logging.WARNING]
    data = json.loads(path.read_text())  # replaced by a valid file
    assert data["entries"]['{"n":1024}']["fastest_name"] == "fast"


@pytest.mark.asyncio
async def test_unusable_cache_directory_costs_only_persistence(
    host_client: ac.ComputeClient, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "file-not-dir"
    blocker.write_text("x")
    t = tuner(blocker)  # every path under it fails
    with caplog.at_level(logging.WARNING, logger="asynccube.autotune"):
        assert await t.execute(host_client, three_speeds(Counter()), 1000) == "fast"
        assert await t.execute(host_client, three_speeds(Counter()), 1000) == "fast"
    assert t.runs == 1
    assert any("could not be written" in r.getMessage() for r in caplog.records)


@pytest.mark.asyncio
async def test_background_mode_serves_the_default_then_switches(
    host_client: ac.ComputeClient, tmp_path: Path
) -> None:
    calls: Counter[str] = Counter()
    ts = three_speeds(calls)  # default: slow (index 0)
    t = tuner(tmp_path, mode=ac.TuneMode.BACKGROUND)
    assert await t.execute(host_client, ts, 1000) == "slow"
    assert t.runs == 1
    assert t.cache(host_client).pending(SizeKey(1024)) is not None
    served = [await t.execute(host_client, ts, 1000) for _ in range(3)]
    assert served == ["slow"] * 3  # still tuning
    assert t.runs == 1
    await t.wait()
    assert t.cache(host_client).pending(SizeKey(1024)) is None
    assert await t.execute(host_client, ts, 1000) == "fast"
    assert t.runs == 1


@pytest.mark.asyncio
async def test_background_default_by_name(host_client: ac.ComputeClient, tmp_path: Path) -> None:
    calls: Counter[str] = Counter()
    ts = ac.TunableSet(
        size_key,
        default="medium",
        tunables=[
            sleeper(5, calls, "slow"),
            sleeper(2, calls, "medium"),
            sleeper(0, calls, "fast"),
        ],
    )
    t = tuner(tmp_path, mode="background")
    assert await t.execute(host_client, ts, 1000) == "medium"
    await t.wait()
    assert await t.execute(host_client, ts, 1000) == "fast"


@pytest.mark.parametrize("mode", [ac.TuneMode.BLOCKING, ac.TuneMode.BACKGROUND])
@pytest.mark.asyncio
async def test_fifty_concurrent_callers_start_one_tuning_run(
    host_client: ac.ComputeClient, tmp_path: Path, mode: ac.TuneMode
) -> None:
    calls: Counter[str] = Counter()
    ts = three_speeds(calls)
    t = tuner(tmp_path, mode=mode)
    outs = await asyncio.gather(*(t.execute(host_client, ts, 1000) for _ in range(50)))
    await t.wait()
    assert t.runs == 1
    expected = "fast" if mode is ac.TuneMode.BLOCKING else "slow"
    assert outs == [expected] * 50
    assert calls["medium"] == RUNS_PER_TUNABLE  # benchmarked once, not 50 times
    served = 50 if mode is ac.TuneMode.BLOCKING else 0
    assert calls["fast"] == RUNS_PER_TUNABLE + served


@pytest.mark.asyncio
async def test_failures_are_recorded_and_the_rest_still_tuned(
    host_client: ac.ComputeClient, tmp_path: Path
) -> None:
    calls: Counter[str] = Counter()
    ts = ac.TunableSet(
        size_key,
        tunables=[
            raiser("no luck", calls, "broken"),
            sleeper(1, calls, "works"),
            kernel_failer(calls, "crashes"),
        ],
    )
    t = tuner(tmp_path)
    assert await t.execute(host_client, ts, 1000) == "works"
    result = t.result(host_client, SizeKey(1024))
    assert result is not None
    by_name = {o.name: o for o in result.outcomes}
    assert by_name["works"].ok
    assert by_name["broken"].error == "ValueError: no luck"
    assert "kernel exploded" in (by_name["crashes"].error or "")
    assert result.outcomes[0].name == "works"
    stored = json.loads(cache_file(host_client, t).read_text())["entries"]['{"n":1024}']
    assert {o["name"]: "error" in o for o in stored["outcomes"]} == {
        "works": False,
        "broken": True,
        "crashes": True,
    }


@pytest.mark.asyncio
async def test_all_failing_raises_autotune_error_naming_each(
    host_client: ac.ComputeClient, tmp_path: Path
) -> None:
    calls: Counter[str] = Counter()
    ts = ac.TunableSet(
        size_key,
        tunables=[raiser("first reason", calls, "alpha"), kernel_failer(calls, "beta")],
    )
    t = tuner(tmp_path)
    results = await asyncio.gather(
        *(t.execute(host_client, ts, 1000) for _ in range(5)), return_exceptions=True
    )
    assert all(isinstance(r, ac.AutotuneError) for r in results)
    message = str(results[0])
    assert "alpha" in message
    assert "first reason" in message
    assert "beta" in message
    assert "kernel exploded" in message
    assert t.runs == 1
    with pytest.raises(ac.AutotuneError, match="alpha"):  # kept: not retuned
        await t.execute(host_client, ts, 1000)
    assert t.runs == 1
    assert not cache_file(host_client, t).exists()  # failures never reach disk
    # Background mode falls back to the default, which raises its own error.
    assert await t.select(host_client, ts, 1000, mode="background") == 0


@pytest.mark.asyncio
async def test_tune_waits_even_in_background_mode(
    host_client: ac.ComputeClient, tmp_path: Path
) -> None:
    t = tuner(tmp_path, mode=ac.TuneMode.BACKGROUND)
    result = await t.tune(host_client, three_speeds(Counter()), 1000)
    assert result.fastest_name == "fast"
    assert (await t.fastest(host_client, three_speeds(Counter()), 1000)).name == "fast"


@pytest.mark.asyncio
async def test_forget_drops_memory_but_not_disk(
    host_client: ac.ComputeClient, tmp_path: Path
) -> None:
    t = tuner(tmp_path)
    await t.execute(host_client, three_speeds(Counter()), 1000)
    t.forget()
    assert t.result(host_client, SizeKey(1024)) is None
    await t.execute(host_client, three_speeds(Counter()), 1000)
    assert t.runs == 1  # from disk


@pytest.mark.asyncio
async def test_failures_of_a_closed_client_are_not_kept(tmp_path: Path) -> None:
    t = tuner(tmp_path, mode=ac.TuneMode.BACKGROUND)
    ts = three_speeds(Counter())
    client = await ac.connect("host")
    assert await t.execute(client, ts, 1000) == "slow"  # tuning starts in the background
    await client.close()
    await t.wait()
    assert t.result(client, SizeKey(1024)) is None
    async with ac.open_client("host") as other:
        assert await t.execute(other, ts, 1000, mode="blocking") == "fast"
    assert t.runs == 2


@pytest.mark.asyncio
async def test_empty_set_is_refused(host_client: ac.ComputeClient, tmp_path: Path) -> None:
    empty: ac.TunableSet[SizeKey, int, str] = ac.TunableSet(size_key)
    with pytest.raises(ac.InvalidArgument, match="no tunables"):
        await tuner(tmp_path).execute(host_client, empty, 1)


def test_tuner_rejects_bad_options() -> None:
    with pytest.raises(ac.InvalidArgument):
        ac.Tuner("")
    with pytest.raises(ac.InvalidArgument):
        ac.Tuner("x", samples=0)
    with pytest.raises(ac.InvalidArgument):
        ac.Tuner("x", warmup=-1)
    with pytest.raises(ac.InvalidArgument, match="tune mode"):
        ac.Tuner("x", mode="sometimes")


def test_autotune_level_sets_the_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    from asynccube._core.tune.tuner import SAMPLES_BY_LEVEL, configured_samples

    for level, samples in SAMPLES_BY_LEVEL.items():
        monkeypatch.setenv("ASYNCCUBE_AUTOTUNE_LEVEL", level)
        assert configured_samples() == samples
    assert SAMPLES_BY_LEVEL["minimal"] < SAMPLES_BY_LEVEL["full"]
