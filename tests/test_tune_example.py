"""The tuned reduction example on the host server, and its CUDA source through NVRTC."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import asynccube as ac

from .tune_example import EXAMPLE, load_example

ex = load_example()
DATA = np.random.default_rng(1).random(100_003, dtype=np.float32)


@pytest.mark.asyncio
async def test_tuned_sum_on_the_host(host_client: ac.ComputeClient, tmp_path: Path) -> None:
    tuner = ex.make_tuner(tmp_path, samples=2)
    x = host_client.create_array(DATA)
    total = await ex.tuned_sum(host_client, tuner, x)
    assert total == pytest.approx(float(DATA.sum(dtype=np.float64)), rel=1e-5)
    result = tuner.result(host_client, ex.SUM.generate_key(x))
    assert result is not None
    assert result.source == "tuned"
    assert sorted(o.name for o in result.outcomes) == sorted(ex.SUM.names)
    assert all(o.ok for o in result.outcomes)
    assert tuner.check_reports[0].ok
    for n in (1, 255, 1025):
        small = host_client.create_array(DATA[:n])
        expected = float(DATA[:n].sum(dtype=np.float64))
        assert await ex.tuned_sum(host_client, tuner, small) == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("block", ex.BLOCK_SIZES)
def test_every_variant_compiles_with_nvrtc(block: int) -> None:
    compiler = pytest.importorskip("asynccube._core.cuda.compiler")
    try:
        compiler.nvrtc_version()
    except ac.CompilationError as exc:
        pytest.skip(f"NVRTC is not available: {exc}")
    kernel = ex.sum_kernel(block)
    assert kernel.cuda.block == (block, 1, 1)
    assert compiler.compile_cubin(kernel.cuda, "sm_90a", cache_dir=None)


def test_example_runs_as_a_script(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(EXAMPLE),
            "--device",
            "host",
            "--n",
            "50000",
            "--cache-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "fastest: block_" in done.stdout
    assert list(tmp_path.glob("*/host_*/example_sum_f32.json"))
