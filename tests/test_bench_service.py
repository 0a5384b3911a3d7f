"""benchmarks/bench_service.py runs on the host server: the asynccube service answers
every request correctly under load from other processes (with the default and a small
batch budget, and the numpy floor); GPU peers are skipped with the reason; ``--admit``
bounds the requests inside each handler, and the GC's pauses are reported; the echo floor
(the body sent back, no compute) and ``--runs N``; the compute-bound workload over HTTP
and with no HTTP, its answers' checks, the goals of issue 30 met or missed per column,
and the per-phase profile (issue 30)."""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).parent.parent
BENCH = ROOT / "benchmarks"


def _run(script: str, *args: str) -> dict[str, Any]:
    cmd = [sys.executable, str(BENCH / script), "--device", "host", *args, "--json-only"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=100, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    figures: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def _service(*args: str) -> dict[str, Any]:
    return _run("bench_service.py", "--loops", "asyncio", "--runs", "1", *args)


def _ok(r: dict[str, Any]) -> None:
    assert r["checked"] > 0 and r["requests_per_s"] > 0, r
    assert r["mismatches"] == 0 and r["errors"] == 0, r
    assert r["loop_lag_p99_ms"] >= 0


@pytest.mark.slow
def test_service_benchmark_runs_on_the_host_server() -> None:
    pytest.importorskip("aiohttp")
    peers = (
        "asynccube,asynccube_lowlag,numpy_loop,cupy_thread,cupy_streams,torch_thread,cupy_blocking"
    )
    figures = _service("--workload", "small", "--peers", peers, "--clients", "8", "--procs",
                       "2", "--seconds", "1", "--warmup", "0.5")  # fmt: skip
    assert set(figures) == {"small", "kernel"}  # no compute, and no no-HTTP table for small
    by_loop = figures["small"]["http"]
    for name in ("asynccube", "asynccube_lowlag", "numpy_loop"):
        _ok(by_loop["asyncio"][name])
    assert by_loop["asyncio"]["asynccube_lowlag"]["server"].endswith("batch_us 200")
    for peer in ("cupy_thread", "cupy_streams", "torch_thread", "cupy_blocking"):
        assert "needs a GPU" in by_loop["asyncio"][peer]["skipped"]


@pytest.mark.slow
def test_admission_bounds_the_requests_inside_the_handler() -> None:
    pytest.importorskip("aiohttp")
    figures = _service("--workload", "small", "--peers", "asynccube,numpy_loop", "--clients",
                       "8", "--procs", "1", "--seconds", "1", "--warmup", "0.5", "--admit", "2",
                       "--gc-freeze")  # fmt: skip
    for name in ("asynccube", "numpy_loop"):
        r = figures["small"]["http"]["asyncio"][name]
        _ok(r)
        assert 1 <= r["handler_max"] <= 2
        assert r["gc_ms_per_s"] >= 0 and r["gc_max_ms"] >= 0 and r["gc_full"] >= 0


@pytest.mark.slow
def test_the_loop_iteration_diagnostic_runs_on_the_host_server() -> None:
    pytest.importorskip("aiohttp")
    cmd = [sys.executable, str(BENCH / "service_iterations.py"), "--device",
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
    figures = _run("bench_service.py", "--loops", "asyncio", "--workload", "small", "--peers",
                   "asynccube,echo", "--clients", "4", "--procs", "1", "--seconds", "0.5",
                   "--warmup", "0.3", "--runs", "2")  # fmt: skip
    by_loop = figures["small"]["http"]
    echo, ours = by_loop["asyncio"]["echo"], by_loop["asyncio"]["asynccube"]
    assert echo["server"] == "echo (no compute)"
    for r in (echo, ours):  # the echo's answers are checked against the bodies sent
        _ok(r)
        assert len(r["runs_requests_per_s"]) == 2
        assert r["requests_per_s"] == min(r["runs_requests_per_s"])  # the median of two
    args = argparse.Namespace(clients=4, procs=1, warmup=0.3, seconds=0.5, gc_freeze=False,
                              admit=0, runs=2, device="host")  # fmt: skip
    text = _module("_service_report").render_http("small", by_loop, args, {})
    ratio = ours["requests_per_s"] / echo["requests_per_s"]
    assert "| vs echo floor (goal >= 0.75x) |" in text and f"| {ratio:.2f}x m" in text
    low, high = min(echo["runs_requests_per_s"]), max(echo["runs_requests_per_s"])
    assert f"| {echo['requests_per_s']:.0f} ({low:.0f}-{high:.0f}) |" in text
    assert "--runs 2" in text


@pytest.mark.slow
def test_the_compute_workload_over_http_and_with_no_http() -> None:
    pytest.importorskip("aiohttp")
    figures = _service("--workload", "compute", "--clients", "4", "--procs", "2",
                       "--seconds", "0.5", "--warmup", "0.3")  # fmt: skip
    assert figures["kernel"]["iters"] == 16  # the host server's numpy iterations
    http, direct = figures["compute"]["http"]["asyncio"], figures["compute"]["no_http"]["asyncio"]
    assert list(http) == ["asynccube", "cupy_streams", "cupy_blocking", "echo"]
    assert list(direct) == ["asynccube", "cupy_blocking", "cupy_streams"]
    _ok(http["asynccube"])
    _ok(http["echo"])
    _ok(direct["asynccube"])
    assert direct["asynccube"]["server"].endswith("4 tasks, no HTTP")
    for peers in (http, direct):
        assert "needs a GPU" in peers["cupy_streams"]["skipped"]
        assert "needs a GPU" in peers["cupy_blocking"]["skipped"]


def test_the_compute_answers_are_checked() -> None:
    work = _module("_service_work").workload("compute", 16)
    x = np.random.default_rng(1).standard_normal(work.n_floats).astype(np.float32)
    bodies = [x.tobytes()]
    right = work.host(x)  # numpy's multiply-then-add, as the host server runs it
    assert not np.array_equal(right, x)
    wrong = right.copy()
    wrong[7] += np.float32(0.01)
    check = _module("_service_work").Checker(work, bodies)
    assert not check.ok(0, wrong.tobytes())
    assert not check.ok(0, right.tobytes()[:-4])
    assert check.ok(0, right.tobytes())
    nearby = right.copy()
    nearby[3] = np.nextafter(nearby[3], np.float32(10))  # within tolerance, but not the same
    assert not check.ok(0, nearby.tobytes())  # later answers: byte for byte as the first
    assert check.ok(0, right.tobytes())


def _peers(**rps: float) -> dict[str, Any]:
    return {p: {"requests_per_s": v, "loop_lag_p99_ms": 4.0, "p50_ms": 10.0, "p99_ms": 40.0}
            for p, v in rps.items()}  # fmt: skip


def test_each_goal_is_met_or_missed_in_its_own_column() -> None:
    report = _module("_service_report")
    peers = _peers(asynccube=900, numpy_loop=1000, echo=1200, cupy_streams=500, torch_thread=600)
    small = {"uvloop": peers | {"cupy_blocking": {"skipped": "no GPU"}}}
    text = report.verdicts("small", small)
    assert "| loop lag p99 (goal <= 5 ms) |" in text and "vs best GPU peer (goal >= 1.6x)" in text
    row = "| uvloop, asynccube | 0.90x met | 0.75x met | 1.50x missed (torch_thread 600/s) |"
    assert row + " 4.00 ms met |" in text
    compute = {"asyncio": _peers(asynccube=1000, echo=1300, cupy_streams=300, cupy_blocking=200)}
    text = report.verdicts("compute", compute)
    assert "| p99 / p50 (goal <= 3x) |" in text
    assert "| asyncio, asynccube | 0.77x missed | 3.33x met | 5.00x met | 4.00x missed |" in text
    del compute["asyncio"]["cupy_streams"]
    assert "| n/a (not measured) |" in report.verdicts("compute", compute)


def test_the_default_gpu_run_fits_one_call() -> None:
    bench = _module("bench_service")
    args = argparse.Namespace(device="cuda:0", workload="both", no_http="compute", peers="",
                              loops="asyncio,uvloop", runs=3, warmup=1.0, seconds=3.0)  # fmt: skip
    plan = bench._plan(args)
    assert [(w, len(http), len(direct)) for w, http, direct in plan] == [
        ("small", 7, 0),
        ("compute", 4, 3),
    ]
    assert 6 * 60 < bench.expected_seconds(args) < 8.5 * 60


@pytest.mark.slow
def test_the_per_phase_profile_runs_on_the_host_server() -> None:
    pytest.importorskip("aiohttp")
    figures = _run("service_profile.py", "--workload", "compute", "--clients", "4",
                   "--procs", "1", "--seconds", "0.7", "--warmup", "0.3", "--floor-seconds",
                   "0.2")  # fmt: skip
    ours, echo = figures["compute"]["asynccube"], figures["compute"]["echo"]
    assert ours["wrong"] == 0 and echo["wrong"] == 0
    assert ours["requests_per_s"] > 0 and echo["requests_per_s"] > 0
    for phase in ("body_in", "create", "launch", "read", "body_out"):
        assert ours["us"][phase] > 0, ours  # the loop's time in each phase, per request
    assert ours["completion_ms"] > 0 and 0 < ours["busy"] <= 1.0
    floor = ours["floor"]  # the tight loop, no HTTP
    assert floor["requests"] > 1 and floor["us"]["create"] > 0 and "body_in" not in floor["us"]
    assert echo["us"]["body_in"] > 0 and echo["us"]["body_out"] > 0 and "create" not in echo["us"]
    text = _module("service_profile").render("compute", ours, echo)
    assert "| create (`client.create`) |" in text and "| **total loop time per request** |" in text


def _module(name: str) -> ModuleType:
    sys.path.insert(0, str(BENCH))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCH))
