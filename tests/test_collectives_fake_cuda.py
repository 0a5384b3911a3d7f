"""The collectives' one-step route on the real client -> channel -> CudaServer path,
without a GPU: the scenarios of ``fast_collective_scenario.py`` (two CUDA servers over
the no-op driver of ``benchmarks/bench_overhead.py``, a recording fake NCCL) in a
process of their own, on the compiled hot path and on its pure-Python twin."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import native_module

SCRIPT = "fast_collective_scenario.py"
SCENARIOS = (
    "one_step",
    "two_switches_a_call",
    "nccl_moves_the_context",
    "await_falls_back",
    "dropped_buffer_kept",
    "queued_calls",
    "busy_route",
    "failure_held",
)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("twin", [False, True], ids=["native", "python"])
def test_the_one_step_scenarios_over_the_no_op_driver(twin: bool) -> None:
    if not twin and native_module() is None:
        pytest.skip("the compiled extension is not built here (pip install . builds it)")
    if shutil.which("cc") is None:
        pytest.skip("no C compiler (cc) to build the no-op libcuda.so.1")
    env = dict(os.environ)
    env["ASYNCCUBE_NO_EXTENSIONS"] = "1" if twin else ""
    env["PYTHONPATH"] = os.pathsep.join([*sys.path, env.get("PYTHONPATH", "")])
    out = subprocess.run(
        [sys.executable, str(Path(__file__).with_name(SCRIPT))],
        capture_output=True,
        text=True,
        env=env,
        timeout=110,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    path = "python" if twin else "native"
    for name in SCENARIOS:
        assert f"ok {name} {path}" in out.stdout, out.stdout + out.stderr


def test_every_scenario_is_run() -> None:
    source = Path(__file__).with_name(SCRIPT).read_text()
    assert sorted(SCENARIOS) == sorted(
        line.split("(")[0].removeprefix("async def ")
        for line in source.splitlines()
        if line.startswith("async def ")
    )
