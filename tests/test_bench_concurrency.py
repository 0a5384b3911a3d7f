"""``benchmarks/bench_concurrency.py`` (issue 38): its report, and its refusal on the host
(it needs a GPU; the GPU run is the benchmark itself)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_concurrency
from bench_requests import Unavailable


def test_the_report_says_where_the_time_per_request_falls() -> None:
    figs = {("asyncio", 20, 1): 46.0, ("asyncio", 20, 8): 31.0, ("asyncio", 20, 64): 30.0,
            ("uvloop", 20, 1): 44.0, ("cupy", 20, 1): 60.0,
            ("cupy_threads", 20, 64): 90.0}  # fmt: skip
    body, figures = bench_concurrency.report(figs, [20], ["asyncio", "uvloop"], "--quick")
    rows = [line for line in body.splitlines() if line.startswith("| 20 µs")]
    assert len(rows) == 3
    assert "| 0.77x | - |" in rows[0]  # 46 / 60; the 1-task row compares with nothing
    assert rows[2].endswith("| 0.50x | 0.65x |")  # 30 / 60, and 30 / 46: concurrency pays
    assert "90.0" in rows[2] and figures["asyncio/20us/64"] == 30.0


def test_it_needs_a_gpu() -> None:
    with pytest.raises(Unavailable, match="needs a GPU"):
        bench_concurrency.main(["--device", "host", "--no-write"])
