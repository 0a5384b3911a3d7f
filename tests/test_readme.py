"""The README's example runs and prints what it says."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).parent.parent / "README.md"


@pytest.mark.slow
def test_readme_example_runs(tmp_path: Path) -> None:
    text = README.read_text()
    code = text.split("## Example", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    script = tmp_path / "example.py"
    script.write_text(code)
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert out.startswith("[2. 2. 2.")
    assert len(code.strip().splitlines()) <= 18


@pytest.mark.slow
def test_readme_example_runs_under_trio(tmp_path: Path) -> None:
    pytest.importorskip("trio")
    text = README.read_text().split("## Example", 1)[1]
    code, rest = text.split("```python", 1)[1].split("```", 1)
    starter = rest.split("```python", 1)[1].split("```", 1)[0]
    assert 'anyio.run(main, backend="trio")' in starter
    script = tmp_path / "example_trio.py"
    script.write_text(code.replace("asyncio.run(main())", starter))
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert out.startswith("[2. 2. 2.")
