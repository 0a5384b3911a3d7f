"""Config discovery, precedence (default < file < environment), sources and errors."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest

from asynccube._core.config.config import (
    AsyncCubeConfig,
    AutotuneLevel,
    LogLevel,
    PersistentMemory,
    PoolPreset,
    ProfilingLevel,
    StreamPriority,
    default_cache_dir,
    find_config_file,
    format_config,
    load_config,
    load_effective_config,
)
from asynccube._core.errors import ConfigError
from asynccube._core.values.types import ExecutionMode

ENV: dict[str, str] = {"XDG_CACHE_HOME": "/xdg-cache"}


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


# -- defaults and discovery ---------------------------------------------------------------


def test_defaults_without_file_or_env(tmp_path: Path) -> None:
    eff = load_effective_config(tmp_path, ENV)
    cfg = eff.config
    assert eff.file is None
    assert cfg.streaming.max_streams == 32
    assert cfg.streaming.priority is StreamPriority.NORMAL
    assert cfg.memory.pool is PoolPreset.DEFAULT
    assert cfg.memory.persistent_memory is PersistentMemory.ENABLED
    assert cfg.autotune.level is AutotuneLevel.BALANCED
    assert cfg.autotune.cache is True
    assert cfg.autotune.cache_dir == Path("/xdg-cache/asynccube/autotune")
    assert cfg.compilation.cache_dir == Path("/xdg-cache/asynccube/compilation")
    assert cfg.compilation.check_mode is ExecutionMode.CHECKED
    assert cfg.profiling.level is ProfilingLevel.DISABLED
    assert all(level is LogLevel.DISABLED for level in cfg.log_levels().values())
    assert set(eff.sources.values()) == {"default"}


def test_default_cache_dir_without_xdg_is_under_home(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Path, "home", classmethod(lambda cls: Path("/home/someone")))
    got = default_cache_dir("autotune", {})
    assert got.parts[-2:] == ("asynccube", "autotune")
    assert str(got).startswith("/home/someone")


def test_relative_xdg_cache_home_is_ignored() -> None:
    assert default_cache_dir("autotune", {"XDG_CACHE_HOME": "rel"}) != Path(
        "rel/asynccube/autotune"
    )


def test_config_objects_are_frozen() -> None:
    cfg = AsyncCubeConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.streaming.max_streams = 4  # type: ignore[misc]


def test_pyproject_found_walking_up_from_nested_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pyproject = write(
        tmp_path / "pyproject.toml",
        '[project]\nname = "demo"\n\n[tool.asynccube.streaming]\nmax_streams = 8\n',
    )
    nested = tmp_path / "src" / "pkg" / "deep"
    nested.mkdir(parents=True)
    monkeypatch.chdir(nested)
    eff = load_effective_config(env=ENV)
    assert eff.file == pyproject.resolve()
    assert eff.config.streaming.max_streams == 8
    assert eff.source("streaming", "max_streams") == str(pyproject.resolve())


def test_pyproject_without_tool_table_is_passed_over(tmp_path: Path) -> None:
    outer = write(tmp_path / "asynccube.toml", "[streaming]\nmax_streams = 3\n")
    write(tmp_path / "inner" / "pyproject.toml", '[project]\nname = "x"\n[tool.ruff]\n')
    assert find_config_file(tmp_path / "inner", ENV) == outer.resolve()
    assert load_config(tmp_path / "inner", ENV).streaming.max_streams == 3


def test_unrelated_malformed_pyproject_is_passed_over(tmp_path: Path) -> None:
    outer = write(tmp_path / "asynccube.toml", "[streaming]\nmax_streams = 3\n")
    write(tmp_path / "inner" / "pyproject.toml", "[project\nname = 'x'\n")
    assert find_config_file(tmp_path / "inner", ENV) == outer.resolve()


def test_asynccube_toml_wins_over_pyproject_in_same_dir(tmp_path: Path) -> None:
    write(tmp_path / "pyproject.toml", "[tool.asynccube.streaming]\nmax_streams = 2\n")
    own = write(tmp_path / "asynccube.toml", "[streaming]\nmax_streams = 5\n")
    assert find_config_file(tmp_path, ENV) == own.resolve()
    assert load_config(tmp_path, ENV).streaming.max_streams == 5


def test_nearest_file_wins(tmp_path: Path) -> None:
    write(tmp_path / "asynccube.toml", "[streaming]\nmax_streams = 2\n")
    write(tmp_path / "a" / "asynccube.toml", "[streaming]\nmax_streams = 7\n")
    assert load_config(tmp_path / "a", ENV).streaming.max_streams == 7


def test_env_names_the_config_file(tmp_path: Path) -> None:
    named = write(tmp_path / "elsewhere" / "custom.toml", "[memory]\npool = 'exclusive'\n")
    write(tmp_path / "asynccube.toml", "[memory]\npool = 'default'\n")
    env = {**ENV, "ASYNCCUBE_CONFIG": str(named)}
    eff = load_effective_config(tmp_path, env)
    assert eff.file == named
    assert eff.config.memory.pool is PoolPreset.EXCLUSIVE


def test_env_config_file_missing_is_an_error(tmp_path: Path) -> None:
    env = {**ENV, "ASYNCCUBE_CONFIG": str(tmp_path / "missing.toml")}
    with pytest.raises(ConfigError, match=r"ASYNCCUBE_CONFIG=.*missing\.toml"):
        load_config(tmp_path, env)


# -- precedence and sources --------------------------------------------------------------------


def test_precedence_default_file_env(tmp_path: Path) -> None:
    path = write(
        tmp_path / "asynccube.toml",
        """
[streaming]
max_streams = 16
logging = "basic"

[autotune]
level = "extensive"
cache = false
""",
    )
    env = {
        **ENV,
        "ASYNCCUBE_STREAMING_MAX_STREAMS": "8",
        "ASYNCCUBE_AUTOTUNE_CACHE": "yes",
        "ASYNCCUBE_PROFILING_LEVEL": "FULL",
    }
    eff = load_effective_config(tmp_path, env)
    cfg = eff.config
    assert cfg.streaming.max_streams == 8  # env over file
    assert cfg.streaming.logging is LogLevel.BASIC  # file over default
    assert cfg.streaming.priority is StreamPriority.NORMAL  # default
    assert cfg.autotune.level is AutotuneLevel.EXTENSIVE
    assert cfg.autotune.cache is True  # env over file
    assert cfg.profiling.level is ProfilingLevel.FULL  # env over default
    assert eff.source("streaming", "max_streams") == "ASYNCCUBE_STREAMING_MAX_STREAMS"
    assert eff.source("streaming", "logging") == str(path.resolve())
    assert eff.source("streaming", "priority") == "default"
    assert eff.source("profiling", "level") == "ASYNCCUBE_PROFILING_LEVEL"


def test_every_key_round_trips_through_file_and_env(tmp_path: Path) -> None:
    text = """
[streaming]
max_streams = 4
priority = "high"
logging = "full"
[memory]
pool = "exclusive"
persistent_memory = "enforced"
logging = "basic"
[autotune]
level = "minimal"
cache = false
cache_dir = "tune"
logging = "minimal"
[compilation]
cache = false
cache_dir = "/abs/kernels"
check_mode = "unchecked"
logging = "full"
[profiling]
level = "medium"
logging = "medium"
"""
    write(tmp_path / "asynccube.toml", text)
    cfg = load_config(tmp_path, ENV)
    assert cfg.streaming.priority is StreamPriority.HIGH
    assert cfg.memory.persistent_memory is PersistentMemory.ENFORCED
    assert cfg.autotune.cache_dir == tmp_path.resolve() / "tune"  # relative to the file
    assert cfg.compilation.cache_dir == Path("/abs/kernels")
    assert cfg.compilation.check_mode is ExecutionMode.UNCHECKED
    assert cfg.profiling.logging is LogLevel.MEDIUM
    assert cfg.autotune.logging is LogLevel.MINIMAL


def test_env_path_is_relative_to_cwd_and_expands_home(tmp_path: Path) -> None:
    env = {
        **ENV,
        "ASYNCCUBE_AUTOTUNE_CACHE_DIR": "rel/dir",
        "ASYNCCUBE_COMPILATION_CACHE_DIR": "~/kc",
    }
    cfg = load_config(tmp_path, env)
    assert cfg.autotune.cache_dir == tmp_path / "rel" / "dir"
    assert cfg.compilation.cache_dir == Path.home() / "kc"


def test_unrelated_and_empty_env_vars_are_ignored(tmp_path: Path) -> None:
    env = {
        **ENV,
        "ASYNCCUBE_DEVICE": "cuda:0",
        "ASYNCCUBE_STREAMING_MAX_STREAMS": "",
        "OTHER_STREAMING_MAX_STREAMS": "x",
    }
    eff = load_effective_config(tmp_path, env)
    assert eff.config.streaming.max_streams == 32
    assert eff.source("streaming", "max_streams") == "default"


def test_format_config_is_toml_that_reloads_to_the_same_config(tmp_path: Path) -> None:
    write(tmp_path / "a" / "asynccube.toml", "[memory]\npool = 'exclusive'\n")
    env = {**ENV, "ASYNCCUBE_STREAMING_PRIORITY": "high", "ASYNCCUBE_COMPILATION_CACHE": "0"}
    eff = load_effective_config(tmp_path / "a", env)
    text = format_config(eff)
    assert "# ASYNCCUBE_STREAMING_PRIORITY" in text
    assert "# default" in text
    assert str((tmp_path / "a" / "asynccube.toml").resolve()) in text
    assert tomllib.loads(text)["memory"]["pool"] == "exclusive"
    write(tmp_path / "b" / "asynccube.toml", text)
    assert load_config(tmp_path / "b", ENV) == eff.config


def test_format_config_says_when_no_file(tmp_path: Path) -> None:
    assert "no config file found" in format_config(load_effective_config(tmp_path, ENV))


def test_effective_config_html_lists_every_key(tmp_path: Path) -> None:
    eff = load_effective_config(tmp_path, ENV)
    page = eff._repr_html_()
    assert page.count("<tr>") == 1 + len(eff.sources)
    assert "streaming.max_streams" in page


# -- errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ("[streams]\nmax = 1\n", r"\[streams\]: unknown section"),
        ("[streaming]\nmax_stream = 4\n", r"unknown key streaming\.max_stream = 4"),
        ('[streaming]\nmax_streams = "8"\n', r'streaming\.max_streams = "8": expected an integer'),
        ("[streaming]\nmax_streams = true\n", r"max_streams = true: expected an integer"),
        ("[streaming]\nmax_streams = 0\n", r"max_streams = 0: expected an integer from 1 to 255"),
        ('[memory]\npool = "huge"\n', r'memory\.pool = "huge": expected one of "default"'),
        ("[autotune]\ncache = 1\n", r"autotune\.cache = 1: expected a boolean"),
        ('[autotune]\nlogging = "basic"\n', r'expected one of "disabled", "minimal", "full"'),
        ('[profiling]\nlevel = "minimal"\n', r'profiling\.level = "minimal"'),
        ('[compilation]\ncheck_mode = "fast"\n', r'check_mode = "fast": expected one of "checked"'),
        ("[compilation]\ncache_dir = 3\n", r"cache_dir = 3: expected a path"),
        ("streaming = 3\n", r"\[streaming\] must be a table"),
    ],
)
def test_bad_file_value_names_key_value_and_file(tmp_path: Path, text: str, pattern: str) -> None:
    path = write(tmp_path / "asynccube.toml", text)
    with pytest.raises(ConfigError, match=pattern) as info:
        load_config(tmp_path, ENV)
    assert str(path.resolve()) in str(info.value)


def test_malformed_toml_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path / "asynccube.toml", "[streaming\nmax_streams = 4\n")
    with pytest.raises(ConfigError, match="not valid TOML") as info:
        load_config(tmp_path, ENV)
    assert str(path.resolve()) in str(info.value)


def test_malformed_pyproject_mentioning_asynccube_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path / "pyproject.toml", "[tool.asynccube\nstreaming = 1\n")
    with pytest.raises(ConfigError, match="not valid TOML") as info:
        load_config(tmp_path, ENV)
    assert str(path) in str(info.value)


def test_pyproject_errors_use_the_tool_prefix(tmp_path: Path) -> None:
    write(tmp_path / "pyproject.toml", "[tool.asynccube.streaming]\nwidth = 2\n")
    with pytest.raises(ConfigError, match=r"unknown key tool\.asynccube\.streaming\.width = 2"):
        load_config(tmp_path, ENV)


def test_pyproject_tool_table_must_be_a_table(tmp_path: Path) -> None:
    write(tmp_path / "pyproject.toml", '[tool]\nasynccube = "yes"\n')
    with pytest.raises(ConfigError, match=r"\[tool\.asynccube\] must be a table"):
        load_config(tmp_path, ENV)


def test_non_utf8_file_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "asynccube.toml").write_bytes(b"[streaming]\nx = '\xff'\n")
    with pytest.raises(ConfigError, match=r"asynccube\.toml"):
        load_config(tmp_path, ENV)


@pytest.mark.parametrize(
    ("name", "value", "pattern"),
    [
        ("ASYNCCUBE_STREAMING_MAX_STREAMS", "eight", r"ASYNCCUBE_STREAMING_MAX_STREAMS='eight'"),
        ("ASYNCCUBE_STREAMING_MAX_STREAMS", "300", r"expected an integer from 1 to 255"),
        ("ASYNCCUBE_AUTOTUNE_CACHE", "maybe", r"ASYNCCUBE_AUTOTUNE_CACHE='maybe'.*boolean"),
        ("ASYNCCUBE_MEMORY_PERSISTENT_MEMORY", "always", r"expected one of \"enabled\""),
        ("ASYNCCUBE_STREAMING_MAX", "4", r"ASYNCCUBE_STREAMING_MAX='4': streaming has no key"),
        ("ASYNCCUBE_PROFILING_LOGGING", "minimal", r"ASYNCCUBE_PROFILING_LOGGING='minimal'"),
    ],
)
def test_bad_env_var_names_the_variable(
    tmp_path: Path, name: str, value: str, pattern: str
) -> None:
    with pytest.raises(ConfigError, match=pattern) as info:
        load_config(tmp_path, {**ENV, name: value})
    assert "environment variable" in str(info.value)


def test_env_error_wins_even_with_a_good_file(tmp_path: Path) -> None:
    write(tmp_path / "asynccube.toml", "[streaming]\nmax_streams = 4\n")
    with pytest.raises(ConfigError, match="ASYNCCUBE_STREAMING_MAX_STREAMS"):
        load_config(tmp_path, {**ENV, "ASYNCCUBE_STREAMING_MAX_STREAMS": "-1"})
