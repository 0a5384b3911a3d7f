"""benchmarks/bench_service.py runs on the host server: the asynccube service answers
every request correctly under load from another process (with the default and a small
batch budget, and the numpy floor); GPU peers are skipped with the reason; ``--admit``
bounds the requests inside each handler, and the GC's pauses are reported; the echo floor
(the body sent back, no compute) and ``--runs N`` (issue 30)."""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).parent.parent


@pytest.mark.slow
def test_service_benchmark_runs_on_the_host_server() -> None:
    pytest.importorskip("aiohttp")
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_service.py"), "--device", "host",
           "--loops", "asyncio", "--clients", "8", "--procs", "1", "--seconds", "1",
           "--warmup", "0.5", "--json-only"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=100, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    by_loop = json.loads(done.stdout.strip().splitlines()[-1])
    for name in ("asynccube", "asynccube_lowlag", "numpy_loop"):
        ours = by_loop["asyncio"][name]
        assert ours["checked"] > 0
        assert ours["requests_per_s"] > 0
        assert ours["mismatches"] == 0
        assert ours["errors"] == 0
        assert ours["loop_lag_p99_ms"] >= 0
    assert by_loop["asyncio"]["asynccube_lowlag"]["server"].endswith("batch_us 200")
    for peer in ("cupy_thread", "torch_thread", "cupy_blocking"):
        assert "needs a GPU" in by_loop["asyncio"][peer]["skipped"]


@pytest.mark.slow
def test_admission_bounds_the_requests_inside_the_handler() -> None:
    pytest.importorskip("aiohttp")
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_service.py"), "--device", "host",
           "--loops", "asyncio", "--peers", "asynccube,numpy_loop", "--clients", "8",
           "--procs", "1", "--seconds", "1", "--warmup", "0.5", "--json-only", "--admit", "2",
           "--gc-freeze"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=100, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    by_loop = json.loads(done.stdout.strip().splitlines()[-1])
    for name in ("asynccube", "numpy_loop"):
        r = by_loop["asyncio"][name]
        assert r["checked"] > 0 and r["mismatches"] == 0 and r["errors"] == 0
        assert 1 <= r["handler_max"] <= 2
        assert r["gc_ms_per_s"] >= 0 and r["gc_max_ms"] >= 0 and r["gc_full"] >= 0


@pytest.mark.slow
def test_the_loop_iteration_diagnostic_runs_on_the_host_server() -> None:
    pytest.importorskip("aiohttp")
    cmd = [sys.executable, str(ROOT / "benchmarks" / "service_iterations.py"), "--device",
           "host", "--peers", "asynccube", "--clients", "4", "--procs", "1", "--seconds",
           "1", "--warmup", "0.5", "--admit", "2"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=100, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    (line,) = done.stdout.strip().splitlines()
    assert line.startswith("asynccube (admit 2): ") and ", 0 wrong; " in line, line
    iterations = int(line.split(" wrong; ")[1].split()[0])
    assert iterations > 100, line  # every iteration of the measured second is counted


@pytest.mark.slow
def test_the_echo_floor_and_several_runs() -> None:
    pytest.importorskip("aiohttp")
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_service.py"), "--device", "host",
           "--loops", "asyncio", "--peers", "asynccube,echo", "--clients", "4", "--procs", "1",
           "--seconds", "0.5", "--warmup", "0.3", "--json-only", "--runs", "2"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=100, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    by_loop = json.loads(done.stdout.strip().splitlines()[-1])
    echo, ours = by_loop["asyncio"]["echo"], by_loop["asyncio"]["asynccube"]
    assert echo["server"] == "echo (no compute)"
    for r in (echo, ours):  # the echo's answers are checked against the bodies sent
        assert r["checked"] > 0 and r["mismatches"] == 0 and r["errors"] == 0
        assert len(r["runs_requests_per_s"]) == 2
        assert r["requests_per_s"] == min(r["runs_requests_per_s"])  # the median of two
    bench = _bench_service()
    args = argparse.Namespace(clients=4, procs=1, warmup=0.3, seconds=0.5, gc_freeze=False,
                              admit=0, runs=2, device="host")  # fmt: skip
    text = bench.render(by_loop, args)
    ratio = ours["requests_per_s"] / echo["requests_per_s"]
    assert "| vs echo floor |" in text and f"| {ratio:.2f}x |" in text
    low, high = min(echo["runs_requests_per_s"]), max(echo["runs_requests_per_s"])
    assert f"| {echo['requests_per_s']:.0f} ({low:.0f}-{high:.0f}) |" in text
    assert "--runs 2" in text


def _bench_service() -> ModuleType:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        return importlib.import_module("bench_service")
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
