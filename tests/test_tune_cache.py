"""The tune cache: outcomes, the file's place and format, concurrent writers."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import asynccube as ac
from asynccube._core.tune.cache import _merge_entry, _read_entries

from .tune_helpers import SizeKey

ROOT = Path(__file__).resolve().parents[1]


def result(index: int = 1, checksum: str = "c0") -> ac.TuneResult:
    outcomes = (
        ac.AutotuneOutcome.from_samples("b", 1, [3_000, 1_000, 2_000]),
        ac.AutotuneOutcome.failed("a", 0, ValueError("nope")),
    )
    return ac.TuneResult(index, "b", checksum, outcomes)


def test_outcome_statistics_and_round_trip() -> None:
    ok = ac.AutotuneOutcome.from_samples("x", 2, [5, 1, 3, 9])
    assert (ok.median_ns, ok.min_ns, ok.max_ns, ok.mean_ns) == (4, 1, 9, 4)
    assert ok.ok
    assert "median" in str(ok)
    failed = ac.AutotuneOutcome.failed("y", 0, KeyError("k"))
    assert not failed.ok
    assert failed.error == "KeyError: 'k'"
    assert "failed" in str(failed)
    for outcome in (ok, failed):
        assert ac.AutotuneOutcome.from_dict(json.loads(json.dumps(outcome.to_dict()))) == outcome


def test_result_round_trip() -> None:
    original = result()
    record = json.loads(json.dumps(original.to_dict(SizeKey(8))))
    assert record["key"] == {"n": 8}
    assert record["fastest_name"] == "b"
    back = ac.TuneResult.from_dict(record)
    assert back == original
    assert back.source == "disk"


@pytest.mark.asyncio
async def test_cache_file_is_namespaced_by_version_device_and_name(tmp_path: Path) -> None:
    cache = ac.TuneCache("my op/v1", "cuda:0 NVIDIA H100 80GB HBM3", cache_dir=tmp_path)
    await cache.load()
    await cache.persist(SizeKey(8), result())
    assert cache.path == tmp_path / ac.__version__ / "cuda_0_NVIDIA_H100_80GB_HBM3" / (
        "my_op_v1.json"
    )
    doc = json.loads(cache.path.read_text())
    assert doc["format"] == 1
    assert doc["asynccube"] == ac.__version__
    assert doc["device"] == "cuda:0 NVIDIA H100 80GB HBM3"
    assert doc["tuner"] == "my op/v1"

    again = ac.TuneCache("my op/v1", "cuda:0 NVIDIA H100 80GB HBM3", cache_dir=tmp_path)
    await again.load()
    assert again.persisted(SizeKey(8), "c0") == result()
    assert again.persisted(SizeKey(8), "other checksum") is None  # and dropped
    assert again.persisted(SizeKey(8), "c0") is None
    other_device = ac.TuneCache("my op/v1", "cuda:1 NVIDIA A100", cache_dir=tmp_path)
    await other_device.load()
    assert other_device.persisted(SizeKey(8), "c0") is None


@pytest.mark.asyncio
async def test_default_directory_honors_xdg_cache_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("ASYNCCUBE_AUTOTUNE_CACHE_DIR", raising=False)
    monkeypatch.delenv("ASYNCCUBE_AUTOTUNE_CACHE", raising=False)
    monkeypatch.delenv("ASYNCCUBE_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)
    cache = ac.TuneCache("op", "host", persistent=True)
    await cache.load()
    assert cache.path is not None
    assert cache.path.is_relative_to(tmp_path / "xdg" / "asynccube" / "autotune")


@pytest.mark.asyncio
async def test_not_persistent_touches_no_disk(tmp_path: Path) -> None:
    cache = ac.TuneCache("op", "host", cache_dir=tmp_path, persistent=False)
    await cache.load()
    await cache.persist(SizeKey(8), result())
    assert cache.path is None
    assert await asyncio.to_thread(lambda: list(tmp_path.iterdir())) == []


def test_threads_merging_into_one_file_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "v" / "dev" / "op.json"

    def writer(tag: int) -> None:
        for i in range(15):
            key = SizeKey(tag * 100 + i)
            _merge_entry(path, "dev", "op", key.to_json(), result().to_dict(key))

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(_read_entries(path, "dev", "op")) == 60
    assert not [p for p in path.parent.iterdir() if p.suffix == ".tmp"]


WRITER = """
import asyncio, pathlib, sys, time
import asynccube as ac
from tests.tune_helpers import SizeKey

async def main(root, tag):
    (root / f"ready-{tag}").touch()  # start together, so that the writes overlap
    deadline = time.monotonic() + 20
    while len(list(root.glob("ready-*"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.001)
    cache = ac.TuneCache("conc", "dev", cache_dir=root)
    await cache.load()
    for i in range(40):
        outcome = ac.AutotuneOutcome.from_samples("a", 0, [i + 1])
        await cache.persist(SizeKey(tag * 1000 + i), ac.TuneResult(0, "a", "c", (outcome,)))

asyncio.run(main(pathlib.Path(sys.argv[1]), int(sys.argv[2])))
"""


def test_two_processes_writing_at_once_lose_nothing(tmp_path: Path) -> None:
    # Without the lock, about a third of the entries are lost here.
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(tmp_path), str(tag)],
            cwd=ROOT,
            stderr=subprocess.PIPE,
            text=True,
        )
        for tag in (1, 2)
    ]
    for p in procs:
        _, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
    (path,) = tmp_path.glob("*/dev/conc.json")
    entries = json.loads(path.read_text())["entries"]
    assert len(entries) == 80
    assert {json.loads(k)["n"] // 1000 for k in entries} == {1, 2}
