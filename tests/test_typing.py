"""User code type-checks: the README's example, ``examples/`` and a typed user program
are clean under ``mypy --strict`` (issue 10, finding 3); the program also runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from . import typed_program

ROOT = Path(__file__).parent.parent
README = ROOT / "README.md"


def readme_example() -> str:
    """The README's example program (its first python block after "## Example")."""
    text = README.read_text()
    return text.split("## Example", 1)[1].split("```python", 1)[1].split("```", 1)[0]


@pytest.mark.slow
def test_user_code_is_clean_under_mypy_strict(tmp_path: Path) -> None:
    pytest.importorskip("mypy")
    example = tmp_path / "readme_example.py"
    example.write_text(readme_example())
    program = Path(typed_program.__file__)
    env = {**os.environ, "MYPYPATH": str(ROOT / "src")}
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(example),
         str(program), "examples"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.asyncio
async def test_the_typed_program_runs() -> None:
    result, timeline = await typed_program.run("host")
    np.testing.assert_array_equal(result, 2 * np.arange(8, dtype=np.float32) + 1)
    assert timeline.device == "host"


@pytest.mark.slow
def test_mypy_flags_an_unawaited_call(tmp_path: Path) -> None:
    pytest.importorskip("mypy")
    program = tmp_path / "forgot.py"
    program.write_text(
        "import asynccube as ac\n\n\n"
        "async def forgot(client: ac.ComputeClient) -> None:\n"
        "    client.sync()\n"
    )
    env = {**os.environ, "MYPYPATH": str(ROOT / "src")}
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental",
         "--enable-error-code", "unused-awaitable", str(program)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 1 and "unused-awaitable" in result.stdout, result.stdout
