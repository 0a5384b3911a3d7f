"""benchmarks/bench_service.py runs on the host server: the asynccube service answers
every request correctly under load from another process (with the default and a small
batch budget, and the numpy floor); GPU peers are skipped with the reason; ``--admit``
bounds the requests inside each handler, and the GC's pauses are reported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
