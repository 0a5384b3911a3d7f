"""The README's and the example's claims hold where a test can check them (issue 10,
finding 9): cache directories, configuration keys and logging values, example flags."""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

import pytest

from asynccube._core.config import AsyncCubeConfig, ConfigError, default_cache_dir, load_config

from .tune_example import load_example

ROOT = Path(__file__).parent.parent
README = " ".join((ROOT / "README.md").read_text().split())  # one line: wraps do not matter
SECTIONS = ("streaming", "memory", "autotune", "compilation", "profiling")


def test_cache_dirs_are_the_configs_defaults() -> None:
    found = re.findall(r"`\[(\w+)\] cache_dir`,? \(?default `\$XDG_CACHE_HOME/(\S+)`", README)
    assert {section for section, _ in found} == {"autotune", "compilation"}
    for section, path in found:
        assert default_cache_dir(section, {"XDG_CACHE_HOME": "/x"}) == Path("/x") / path


def test_sections_and_keys_are_the_configs() -> None:
    for section in SECTIONS:
        match = re.search(rf"`{section}` \(([a-z_, ]+)\)", README)
        assert match is not None, section
        keys = [f.name for f in dataclasses.fields(getattr(AsyncCubeConfig(), section))]
        assert match.group(1).split(", ") == keys, section


def test_logging_values_are_the_configs(tmp_path: Path) -> None:
    said = dict.fromkeys(SECTIONS, "")
    sentence = README.split("`logging` takes ", 1)[1].split(". ", 1)[0]
    for values, sections in re.findall(r"`([a-z| ]+)` in ((?:`\w+`(?:, | and )?)+)", sentence):
        for section in re.findall(r"`(\w+)`", sections):
            said[section] = values
    candidates = ("disabled", "minimal", "basic", "medium", "full")
    for section in SECTIONS:
        accepted = []
        for value in candidates:
            env = {f"ASYNCCUBE_{section.upper()}_LOGGING": value}
            try:
                load_config(tmp_path, env)
            except ConfigError:
                continue
            accepted.append(value)
        assert said[section].split(" | ") == accepted, section


def test_the_examples_documented_command_lines_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    example = load_example()
    lines = [line.strip() for line in (example.__doc__ or "").splitlines()]
    commands = [line.split("#")[0].split()[2:] for line in lines if line.startswith("python ")]
    assert len(commands) >= 2
    for argv in commands:
        monkeypatch.setattr(sys, "argv", ["tuned_reduction.py", *argv])
        example._parse()  # SystemExit(2) on an unknown flag
