"""benchmarks/bench_fastapi.py runs on the host server: the example FastAPI service under
uvicorn answers every request correctly under load from other processes, beside the echo
floor, and its LoopMonitor's figures over the measured window come back (issue 39)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).parent.parent / "benchmarks"


@pytest.mark.slow
def test_fastapi_benchmark_runs_on_the_host_server() -> None:
    for module in ("fastapi", "uvicorn", "aiohttp"):
        pytest.importorskip(module)
    cmd = [sys.executable, str(BENCH / "bench_fastapi.py"), "--device", "host", "--quick",
           "--loops", "asyncio", "--peers", "asynccube,echo", "--clients", "4", "--procs",
           "1", "--seconds", "0.6", "--warmup", "0.3", "--json-only"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=100, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    by_loop: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    for peer in ("asynccube", "echo"):
        r = by_loop["asyncio"][peer]
        assert r["checked"] > 0 and r["requests_per_s"] > 0, r
        assert r["mismatches"] == 0 and r["errors"] == 0, r
        assert r["served"] >= r["checked"] and r["refused"] == {}, r
        assert 0 < r["monitor_window_s"] <= 0.6 + 1e-6 and r["monitor_samples"] > 0, r
        assert 0 <= r["loop_lag_p50_ms"] <= r["loop_lag_p99_ms"] <= r["loop_lag_max_ms"], r
    assert "FastAPI on uvicorn" in by_loop["asyncio"]["asynccube"]["server"]
    assert by_loop["asyncio"]["echo"]["server"].endswith("no device")
