"""benchmarks/bench_peer.py (issue 32) runs between host clients: the curve with its
floor, every copy checked, the ordering check without a host wait; a device that is not
there gets a clear message; its report judges the 256 MiB goals run by run.
benchmarks/bench_pipeline.py takes ``--devices A,B`` (a stage on each)."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).parent.parent
BENCH = ROOT / "benchmarks"


def _run(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(BENCH / script), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)


def _figures(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert done.returncode == 0, done.stdout + done.stderr
    figures: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def test_peer_benchmark_runs_between_host_clients() -> None:
    figs = _figures(_run("bench_peer.py", "--src", "host", "--dst", "host", "--max-mib", "1",
                         "--batch-mib", "16", "--runs", "2", "--spin-ms", "100",
                         "--json-only"))  # fmt: skip
    assert [r["size"] for r in figs["sizes"]] == [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20]
    for row in figs["sizes"]:
        assert len(row["runs"]) == 2
        assert row["gbps"]["asynccube"] > 0
        assert row["gbps"]["raw"] > 0
        assert row["checked"] == {"asynccube": True, "raw": True}
    assert figs["raw"] == "np.copyto"
    assert "torch" in figs["skipped"]
    assert figs["path"].startswith("staged")
    order = figs["ordering"]
    assert order["data_ok"], order
    assert order["no_host_wait"], order


def test_peer_benchmark_names_a_missing_device() -> None:
    done = _run("bench_peer.py", "--src", "host", "--dst", "cuda:99", "--json-only")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "bench_peer: " in done.stderr
    assert "cuda:99" in done.stderr


@pytest.fixture
def report() -> Iterator[ModuleType]:
    sys.path.insert(0, str(BENCH))
    try:
        yield importlib.import_module("_peer_report")
    finally:
        sys.path.remove(str(BENCH))


def _figs(torch_runs: list[float], raw_runs: list[float]) -> dict[str, Any]:
    runs = [
        {"asynccube": 100.0, "torch": 100.0 / t, "raw": 100.0 / r}
        for t, r in zip(torch_runs, raw_runs, strict=True)
    ]
    row = {"size": 256 << 20, "copies": 16, "gbps": {"asynccube": 100.0, "torch": 100.0,
           "raw": 100.0}, "runs": runs, "checked": {"asynccube": True}}  # fmt: skip
    order = {"size": 256 << 20, "spin_ms": 100.0, "to_client_us": 20.0, "data_ok": True,
             "no_host_wait": True, "tries": []}  # fmt: skip
    args = {"src": "cuda:0", "dst": "cuda:1", "max_mib": 1024, "batch_mib": 4096, "runs": 3}
    return {"raw": "cuMemcpyPeerAsync", "args": args, "skipped": {}, "src": "cuda:0",
            "dst": "cuda:1", "path": "peer", "sizes": [row], "ordering": order}  # fmt: skip


def test_the_report_judges_the_goals_in_every_run(report: ModuleType) -> None:
    text = report.render(_figs([0.95, 0.89, 0.97], [0.90, 0.88, 0.86]))
    assert (
        "0.950, 0.890, 0.970 (min 0.890, median 0.950); goal >= 0.90 in every run: **missed**"
        in text
    )
    assert "goal >= 0.85 in every run: **met**" in text
    assert "| 256 MiB | 16 |" in text
    assert report.size_name(1 << 30) == "1 GiB"
    assert report.size_name(4 << 10) == "4 KiB"


def test_pipeline_benchmark_takes_two_devices() -> None:
    figs = _figures(_run("bench_pipeline.py", "--devices", "host,host", "--items", "8",
                         "--size", "4096", "--runs", "1", "--no-ray", "--json-only"))  # fmt: skip
    assert figs["args"]["devices"] == ["host", "host"]
    for mode in ("handles", "numpy", "plain"):
        assert figs["one_host"][mode]["per_s"] > 0
    assert figs["copy_floor"]["per_s"] > 0


def test_pipeline_benchmark_refuses_a_mixed_pair() -> None:
    done = _run("bench_pipeline.py", "--devices", "host,cuda:0", "--json-only")
    assert done.returncode == 2
    assert "both host or both cuda" in done.stderr
