"""The documentation's and the example's claims hold where a test can check them (issue
10, finding 9): cache directories, configuration keys and logging values, example flags;
and the site is whole (issue 26, part 3): every page in the navigation, every public name
in the API reference, the README's links."""

from __future__ import annotations

import dataclasses
import re
import sys
import tomllib
from pathlib import Path

import pytest

import asynccube as ac
from asynccube._core.config import AsyncCubeConfig, ConfigError, default_cache_dir, load_config

from .tune_example import load_example

ROOT = Path(__file__).parent.parent
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
# Every page on one line: wraps and page breaks do not matter.
TEXT = " ".join(" ".join(page.read_text().split()) for page in PAGES)
CONFIG_PAGE = (DOCS / "guide" / "configuration.md").read_text()
SECTIONS = ("streaming", "memory", "autotune", "compilation", "profiling")


def test_cache_dirs_are_the_configs_defaults() -> None:
    found = re.findall(r"`\[(\w+)\] cache_dir`,? \(?default `\$XDG_CACHE_HOME/(\S+)`", TEXT)
    assert {section for section, _ in found} == {"autotune", "compilation"}
    for section, path in found:
        assert default_cache_dir(section, {"XDG_CACHE_HOME": "/x"}) == Path("/x") / path


def test_sections_and_keys_are_the_configs() -> None:
    for section in SECTIONS:
        match = re.search(rf"`{section}` \(([a-z_, ]+)\)", TEXT)
        assert match is not None, section
        keys = [f.name for f in dataclasses.fields(getattr(AsyncCubeConfig(), section))]
        assert match.group(1).split(", ") == keys, section


def test_logging_values_are_the_configs(tmp_path: Path) -> None:
    said = dict.fromkeys(SECTIONS, "")
    sentence = TEXT.split("`logging` takes ", 1)[1].split(". ", 1)[0]
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


def test_the_configuration_pages_toml_is_a_valid_file(tmp_path: Path) -> None:
    block = CONFIG_PAGE.split("```toml\n", 1)[1].split("```", 1)[0]
    tomllib.loads(block)
    (tmp_path / "asynccube.toml").write_text(block)
    config = load_config(tmp_path, {})  # ConfigError on an unknown key or a bad value
    assert config.streaming.max_streams == 8
    assert config.profiling.level.name == "MEDIUM"


def test_the_navigation_lists_every_page_once() -> None:
    nav = re.findall(r":\s+(\S+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M)
    assert sorted(nav) == sorted(str(page.relative_to(DOCS)) for page in PAGES)


def test_the_reference_renders_every_public_name_once() -> None:
    reference = "".join(page.read_text() for page in sorted((DOCS / "reference").glob("*.md")))
    rendered = re.findall(r"^::: asynccube\.(\S+)\s*$", reference, re.M)
    assert len(rendered) == len(set(rendered)), "a name rendered twice"
    assert sorted(rendered) == sorted(ac.__all__)


def test_no_page_names_a_private_module() -> None:
    # The modules behind the public names move; pages name ``asynccube.Name`` only.
    for page in [*PAGES, ROOT / "README.md"]:
        assert "_core" not in page.read_text(), page


def test_the_readme_links_every_guide_page_and_each_link_resolves() -> None:
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\((docs/[^)#]+)(?:#[^)]*)?\)", readme)
    for link in links:
        assert (ROOT / link).is_file(), link
    guide = {str(page.relative_to(ROOT)) for page in (DOCS / "guide").glob("*.md")}
    assert guide <= set(links), guide - set(links)


def test_the_readme_keeps_set_up_test_command_and_example() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "pip install . && python -m asynccube demo" in readme
    marker = "<!-- test-command: .ci/run runs exactly the next line -->\n```bash\n"
    assert marker + "pip install '.[test]' && python -m pytest\n```" in readme
    assert "## Example" in readme
    assert len(readme.splitlines()) < 200, "the README links to the docs instead"
