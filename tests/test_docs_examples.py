"""The documentation's code examples run (issue 26, part 3).

Every ```` ```python ```` block of ``docs/**/*.md`` is compiled, and run on the host
server, in page order. The convention, also written down in ``docs/development.md``:

- A plain block runs as in a notebook (top-level ``await``), in one namespace per page
  that starts with ``np`` (numpy), ``ac`` (asynccube) and ``client``, a client of the
  host server opened on the test's loop. Blocks see the names earlier blocks of their
  page defined. The client is closed after the page, so an error nobody awaited fails
  the test, as it would fail the reader's program.
- ``<!-- docs-test: program -->`` on the line before a block: a complete program, run
  on its own in a fresh interpreter (it must exit with status 0).
- ``<!-- docs-test: skip REASON -->``: compiled only, not run; REASON says what it
  needs that the host server cannot give (a GPU, torch, a Ray cluster).
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import re
import subprocess
import sys
import textwrap
import types
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import asynccube as ac

ROOT = Path(__file__).parent.parent
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
MARKER = re.compile(r"^\s*<!-- docs-test: (\w+)\s*(.*?)\s*-->\s*$")
KINDS = ("run", "program", "skip")


@dataclass(frozen=True)
class Block:
    """One fenced Python block: where it starts (its first code line), how it runs."""

    page: Path
    line: int
    kind: str
    reason: str
    code: str

    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    def compiled(self) -> object:
        # Padded with blank lines: a traceback names the Markdown file and its line.
        source = "\n" * (self.line - 1) + self.code
        return compile(source, str(self.page), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


def blocks(page: Path) -> list[Block]:
    """The page's Python blocks (indented ones, in lists, included), with their marker."""
    lines = page.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        fence = re.match(r"^(\s*)```python\s*$", lines[i])
        if fence is None:
            i += 1
            continue
        indent = fence.group(1)
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
        previous = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = MARKER.match(previous)
        kind, reason = (marker.group(1), marker.group(2)) if marker else ("run", "")
        body = [line.removeprefix(indent) for line in lines[i + 1 : end]]
        code = textwrap.dedent("\n".join(body)) + "\n"
        found.append(Block(page, i + 2, kind, reason, code))
        i = end + 1
    return found


def _ids(page: Path) -> str:
    return str(page.relative_to(DOCS))


def test_there_are_examples_of_every_kind() -> None:
    kinds = {b.kind for page in PAGES for b in blocks(page)}
    assert kinds == set(KINDS), kinds


@pytest.mark.parametrize("page", PAGES, ids=_ids)
def test_blocks_compile_and_are_marked_well(page: Path) -> None:
    for block in blocks(page):
        assert block.kind in KINDS, f"{block.where()}: unknown docs-test kind {block.kind!r}"
        if block.kind == "skip":
            assert block.reason, f"{block.where()}: a skipped block says why"
        block.compiled()  # a SyntaxError names the page and line


@pytest.mark.asyncio
@pytest.mark.parametrize("page", PAGES, ids=_ids)
async def test_page_examples_run_on_the_host(page: Path) -> None:
    runnable = [b for b in blocks(page) if b.kind == "run"]
    if not runnable:
        return
    client = await ac.connect("host")
    # A module of its own, as a script's __main__ is (dataclasses look their module up).
    module = types.ModuleType("asynccube_docs_example")
    namespace = module.__dict__
    namespace.update(ac=ac, np=np, client=client)
    sys.modules[module.__name__] = module
    try:
        for block in runnable:
            result = eval(block.compiled(), namespace)  # the docs' own code
            if inspect.iscoroutine(result):
                await result
            await asyncio.sleep(0)  # one block, one loop step at most: as notebook cells
    finally:
        try:
            await client.close()  # raises any error an example left unawaited
        finally:
            del sys.modules[module.__name__]
            namespace.clear()


PROGRAMS = [b for page in PAGES for b in blocks(page) if b.kind == "program"]


@pytest.mark.slow
@pytest.mark.parametrize("block", PROGRAMS, ids=[b.where() for b in PROGRAMS])
def test_program_examples_run(block: Block, tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(block.code)
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert result.returncode == 0, f"{block.where()}:\n{result.stdout}{result.stderr}"
