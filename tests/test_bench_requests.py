"""benchmarks/bench_requests.py (issue 38) runs a tiny configuration on the host server:
both tables carry a row per (body, tasks) with a figure for each loop, the peers that
need a GPU are named as skipped; its profile tool prints the phases and the profiles, on
the host server and on the CUDA server over the no-op driver; the report judges the goals
against the best blocking peer, and a wrong answer fails a figure."""

from __future__ import annotations

import asyncio
import importlib
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

ROOT = Path(__file__).parent.parent
BENCH = ROOT / "benchmarks"


def _run(script: str, *args: str) -> str:
    cmd = [sys.executable, str(BENCH / script), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _rows(text: str, body: str) -> list[list[str]]:
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("|") and cells[0] == body:
            rows.append(cells)
    return rows


def test_a_tiny_run_has_a_row_per_body_and_task_count() -> None:
    out = _run("bench_requests.py", "--device", "host", "--quick", "--sizes", "1024,4096",
               "--tasks", "1,4", "--loops", "asyncio,trio", "--scale", "0.1",
               "--no-write")  # fmt: skip
    assert "| body | tasks | asynccube asyncio | asynccube trio |" in out
    for body in ("1 KiB", "4 KiB"):
        rows = _rows(out, body)
        assert [r[1] for r in rows] == ["1", "4", "1", "4"]  # µs, then the loop's CPU
        for row in rows:
            assert float(row[2]) > 0  # asyncio's figure
        assert float(rows[0][7]) > 0  # numpy on the loop, at 1 task
    assert _rows(out, "1 KiB")[0][3] != "-"  # trio at the first size
    assert _rows(out, "4 KiB")[0][3] == "-"
    skipped = re.search(r"Skipped: (.*)\.", out)
    assert skipped is not None
    for peer in ("torch", "cupy", "cupy_threads", "c_floor"):
        assert f"{peer}: needs a GPU" in skipped.group(1)


def test_the_profile_tool_prints_phases_and_calls_per_request() -> None:
    out = _run("profile_requests.py", "--device", "host", "--tasks", "1,4", "--requests", "64",
               "--top", "5")  # fmt: skip
    phases = [r for r in _rows(out, "1") + _rows(out, "4") if len(r) == 11]
    assert [r[0] for r in phases] == ["1", "4"]
    assert all(float(c) >= 0 for r in phases for c in r[1:])
    assert out.count("Calls per request: ") == 2
    assert "| Channel.send | 4.00 |" in out  # create, empty, execute, read


def test_the_profile_tool_runs_the_cuda_path_on_the_no_op_driver() -> None:
    if shutil.which("cc") is None:
        pytest.skip("no C compiler (cc) to build the no-op libcuda.so.1")
    try:
        from asynccube._core.cuda import compiler

        compiler.nvrtc_version()
    except Exception as exc:
        pytest.skip(f"NVRTC is not available: {exc}")
    out = _run("profile_requests.py", "--fake-cuda", "--tasks", "1,4", "--requests", "64",
               "--top", "3")  # fmt: skip
    assert "on cuda (no-op driver)" in out
    routes = [r for r in _rows(out, "1") + _rows(out, "4") if len(r) == 7]
    assert [r[0] for r in routes] == ["1", "4"]
    for row in routes:  # two allocations, a launch and a read offered to the routes
        assert float(row[1]) + float(row[2]) == pytest.approx(4.0, abs=0.05)
        # create's write, offered once its allocation was taken: taken once warm
        assert 0.5 < float(row[5]) <= float(row[5]) + float(row[6]) <= 1.05
    assert out.count("Calls per request: ") == 2


@pytest.fixture
def bench() -> Iterator[ModuleType]:
    sys.path.insert(0, str(BENCH))
    try:
        yield importlib.import_module("bench_requests")
    finally:
        sys.path.remove(str(BENCH))


def _judged(bench: ModuleType, ours: dict[int, list[tuple[float, float]]]) -> list[list[str]]:
    plan = bench.Plan("cuda:0", [bench.work_for(1024)], [1, 64], {1024: 16}, ["asyncio"])
    results = bench.Results()
    for run in zip(ours[1], ours[64], strict=True):
        results.add("asyncio", {(1024, 1): run[0], (1024, 64): run[1]})
    results.add("torch", {(1024, 1): (100.0, 100.0)})
    results.add("cupy", {(1024, 1): (60.0, 60.0)})
    body, figures = bench.report(plan, results)
    assert figures["series"]["asyncio"]["1024/64"] == [list(r) for r in ours[64]]
    return _rows(body, "1 KiB")  # µs at 1 and 64 tasks, then the loop's CPU


def test_the_report_judges_the_goals_against_the_best_blocking_peer(bench: ModuleType) -> None:
    one, many, _, cpu = _judged(bench, {1: [(80.0, 70.0)], 64: [(40.0, 30.0)]})
    assert one[-2:] == ["1.33x (cupy)", "<= 0.9x: missed"]
    assert many[-2:] == ["0.67x (cupy)", "<= 0.5x and below 1 task: missed"]
    assert cpu[-1] == "<= 25: missed"
    # the median of three runs: 50 and 25 µs, 20 µs of the loop's CPU
    runs = {1: [(50.0, 20.0), (80.0, 70.0), (40.0, 20.0)],
            64: [(25.0, 20.0), (40.0, 30.0), (20.0, 10.0)]}  # fmt: skip
    one, many, _, cpu = _judged(bench, runs)
    assert one[-2:] == ["0.83x (cupy)", "<= 0.9x: met"]
    assert many[-2:] == ["0.42x (cupy)", "<= 0.5x and below 1 task: met"]
    assert cpu[-1] == "<= 25: met"
    one, many, _, _ = _judged(bench, {1: [(20.0, 20.0)], 64: [(25.0, 20.0)]})
    assert many[-1] == "<= 0.5x and below 1 task: missed"  # 64 tasks dearer than one


def test_a_wrong_answer_fails_the_figure(bench: ModuleType) -> None:
    work = bench.work_for(1024)

    async def numpy(body: bytes) -> object:
        return 2 * np.frombuffer(body, np.float32) + 1

    async def off_by_one(body: bytes) -> object:
        return 2 * np.frombuffer(body, np.float32) + 2

    wall, cpu = asyncio.run(bench.measure("asyncio", numpy, work, 4, 16))
    assert wall > 0
    assert cpu >= 0
    with pytest.raises(bench.WrongAnswer, match="1 KiB, task 0: wrong answer"):
        asyncio.run(bench.measure("asyncio", off_by_one, work, 4, 16))


def test_a_failing_peer_is_noted_and_the_run_goes_on(bench: ModuleType) -> None:
    results = bench.Results()

    def broken() -> dict[tuple[int, int], tuple[float, float]]:
        raise RuntimeError("CUDA_ERROR_LAUNCH_FAILED")

    bench._peer_figures(results, "torch", broken)
    bench._peer_figures(results, "cupy", lambda: {(1024, 1): (5.0, 5.0)})
    assert results.skipped == {"torch": "RuntimeError: CUDA_ERROR_LAUNCH_FAILED"}
    assert results.median("cupy", (1024, 1)) == 5.0
    bench._peer_figures(results, "torch", lambda: {(1024, 1): (1.0, 1.0)})  # not retried
    assert results.median("torch", (1024, 1)) is None
