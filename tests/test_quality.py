"""The quality bar holds: ruff (lint and format) and mypy --strict are clean."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_ruff_check_is_clean() -> None:
    if shutil.which("ruff") is None:
        pytest.skip("ruff is not installed (pip install '.[test]')")
    result = _run("ruff", "check", "src", "tests", "benchmarks")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_ruff_format_is_clean() -> None:
    if shutil.which("ruff") is None:
        pytest.skip("ruff is not installed (pip install '.[test]')")
    result = _run("ruff", "format", "--check", "src", "tests", "benchmarks")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_mypy_strict_is_clean() -> None:
    pytest.importorskip("mypy")
    result = _run(sys.executable, "-m", "mypy", "--strict", "src")
    assert result.returncode == 0, result.stdout + result.stderr
