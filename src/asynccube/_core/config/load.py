"""Loading the configuration: defaults, then a file, the environment and code, in layers.

See :mod:`.config` for the file format and the order of the layers; the schema (the
sections, keys and their parsers) is in :mod:`.config_schema`.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from ..errors import ConfigError, MemoryLayoutError
from ..html import html_table
from .schema import (
    _SECTIONS,
    AsyncCubeConfig,
    Parser,
    _BadValue,
    _section_fields,
    default_cache_dir,
    format_value,
)

__all__ = [
    "CODE_SOURCE",
    "CONFIG_FILE_NAME",
    "DEFAULT_SOURCE",
    "ENV_CONFIG_FILE",
    "ENV_PREFIX",
    "ConfigOverrides",
    "EffectiveConfig",
    "find_config_file",
    "format_config",
    "load_config",
    "load_effective_config",
]

CONFIG_FILE_NAME: Final = "asynccube.toml"
"""The dedicated config file, looked for in each directory from cwd upward."""
ENV_PREFIX: Final = "ASYNCCUBE_"
"""Prefix of the environment variables that override the file."""
ENV_CONFIG_FILE: Final = "ASYNCCUBE_CONFIG"
"""Environment variable naming a config file to use instead of searching."""
DEFAULT_SOURCE: Final = "default"
"""The source recorded for a value nobody set."""
CODE_SOURCE: Final = "config= argument"
"""The source recorded for a value given in code (``open_client(config=...)``)."""

ConfigOverrides = Mapping[str, Mapping[str, object]]
"""Configuration given in code: ``{"section": {"key": value}}``, as in the file."""


# -- effective config with sources -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EffectiveConfig:
    """The configuration in force and where each value came from.

    Attributes:
        config: The resolved configuration.
        sources: ``"section.key"`` -> ``"default"``, the config file's path, or the
            environment variable's name.
        file: The config file that was read, or ``None``.
        searched_from: The directory the file search started from.
    """

    config: AsyncCubeConfig
    sources: Mapping[str, str]
    file: Path | None
    searched_from: Path

    def source(self, section: str, key: str) -> str:
        """Where ``section.key`` came from."""
        return self.sources[f"{section}.{key}"]

    def items(self) -> Iterator[tuple[str, str, object, str]]:
        """``(section, key, value, source)`` for every key, in declaration order."""
        for section in _SECTIONS:
            values = getattr(self.config, section)
            for key in _section_fields(section):
                yield section, key, getattr(values, key), self.source(section, key)

    def __str__(self) -> str:
        return format_config(self)

    def _repr_html_(self) -> str:
        rows = [(f"{s}.{k}", format_value(v), src) for s, k, v, src in self.items()]
        caption = f"asynccube configuration ({self.file or 'no config file'})"
        return html_table(("key", "value", "source"), rows, caption=caption, numeric_from=99)


def load_config(
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    overrides: ConfigOverrides | None = None,
) -> AsyncCubeConfig:
    """The configuration for ``cwd`` (default: the working directory) and ``env``
    (default: ``os.environ``): defaults, overridden by the file, then the environment,
    then ``overrides`` given in code (``{"section": {"key": value}}``, validated like
    the file).

    Raises:
        ConfigError: naming the key, the value and the file, environment variable or
            ``config=`` argument.
    """
    return load_effective_config(cwd, env, overrides).config


def load_effective_config(
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    overrides: ConfigOverrides | None = None,
) -> EffectiveConfig:
    """Like :func:`load_config`, and also where each value came from."""
    environ = os.environ if env is None else env
    start = Path.cwd() if cwd is None else Path(cwd)
    path = find_config_file(start, environ)
    layers = _Layers(_env_defaults(environ))
    if path is not None:
        layers.apply_file(path)
    layers.apply_env(environ, start)
    if overrides is not None:
        layers.apply_code(overrides, start)
    return EffectiveConfig(layers.build(), layers.sources(), path, start)


def find_config_file(
    cwd: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None
) -> Path | None:
    """The config file in force: ``$ASYNCCUBE_CONFIG``, or the nearest ``asynccube.toml``
    or ``pyproject.toml`` with ``[tool.asynccube]`` from ``cwd`` upward; ``None`` if none.
    """
    environ = os.environ if env is None else env
    start = (Path.cwd() if cwd is None else Path(cwd)).resolve()
    named = environ.get(ENV_CONFIG_FILE, "").strip()
    if named:
        return _named_file(named, start)
    for directory in (start, *start.parents):
        found = _config_in(directory)
        if found is not None:
            return found
    return None


def _named_file(named: str, start: Path) -> Path:
    path = Path(named).expanduser()
    path = path if path.is_absolute() else start / path
    if not path.is_file():
        raise ConfigError(f"{ENV_CONFIG_FILE}={named!r}: no such file ({path})")
    return path


def _config_in(directory: Path) -> Path | None:
    own = directory / CONFIG_FILE_NAME
    if own.is_file():
        return own
    pyproject = directory / "pyproject.toml"
    if pyproject.is_file() and _has_tool_table(pyproject):
        return pyproject
    return None


def _has_tool_table(pyproject: Path) -> bool:
    """True if ``pyproject`` has ``[tool.asynccube]`` (parsed only if it mentions us)."""
    try:
        mentions = b"asynccube" in pyproject.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{pyproject}: cannot be read: {exc}") from exc
    tool = _read_toml(pyproject).get("tool", {}) if mentions else {}
    return isinstance(tool, dict) and "asynccube" in tool


def _env_defaults(environ: Mapping[str, str]) -> dict[tuple[str, str], object]:
    return {
        ("autotune", "cache_dir"): default_cache_dir("autotune", environ),
        ("compilation", "cache_dir"): default_cache_dir("compilation", environ),
    }


class _Layers:
    """Values set so far, per (section, key), with their sources."""

    def __init__(self, defaults: dict[tuple[str, str], object]) -> None:
        self._values: dict[tuple[str, str], tuple[object, str]] = {
            k: (v, DEFAULT_SOURCE) for k, v in defaults.items()
        }

    def apply_file(self, path: Path) -> None:
        data = _read_toml(path)
        prefix = ""
        if path.name == "pyproject.toml":
            data, prefix = _tool_table(data, path), "tool.asynccube."
        for section, table in data.items():
            self._apply_section(section, table, str(path), prefix, path.parent)

    def apply_code(self, overrides: Mapping[str, object], cwd: Path) -> None:
        """Values given in code (``open_client(config=...)``), validated like a file's."""
        if not isinstance(overrides, Mapping):
            raise ConfigError(
                f"{CODE_SOURCE}: expected a mapping of sections to tables, e.g. "
                f"{{'streaming': {{'max_streams': 8}}}}, got {overrides!r}"
            )
        for section, table in overrides.items():
            if isinstance(table, Mapping):
                table = {k: os.fspath(v) if isinstance(v, os.PathLike) else v
                         for k, v in table.items()}  # fmt: skip
            self._apply_section(str(section), table, CODE_SOURCE, "", cwd)

    def _apply_section(
        self, section: str, table: object, origin: str, prefix: str, base: Path
    ) -> None:
        where = f"{origin}: [{prefix}{section}]"
        if section not in _SECTIONS:
            raise ConfigError(f"{where}: unknown section; the sections are {_known(_SECTIONS)}")
        if not isinstance(table, dict):
            raise ConfigError(f"{where} must be a table, got {format_value(table)}")
        fields = _section_fields(section)
        for key, raw in table.items():
            if key not in fields:
                raise ConfigError(
                    f"{origin}: unknown key {prefix}{section}.{key} = {format_value(raw)}; "
                    f"the keys of [{section}] are {_known(fields)}"
                )
            value = _parse(fields[key], raw, False, base, f"{origin}: {prefix}{section}.{key}")
            self._values[section, key] = (value, origin)

    def apply_env(self, environ: Mapping[str, str], cwd: Path) -> None:
        for name in sorted(environ):
            target = _env_target(name)
            if target is not None and environ[name].strip():
                self._apply_env_var(name, environ[name], target, cwd)

    def _apply_env_var(self, name: str, raw: str, target: tuple[str, str], cwd: Path) -> None:
        section, key = target
        fields = _section_fields(section)
        if key not in fields:
            keys = ", ".join(_env_name(section, k) for k in fields)
            raise ConfigError(
                f"environment variable {name}={raw!r}: {section} has no key {key!r}; "
                f"the variables for [{section}] are {keys}"
            )
        value = _parse(fields[key], raw, True, cwd, f"environment variable {name}")
        self._values[section, key] = (value, name)

    def build(self) -> AsyncCubeConfig:
        sections = {
            section: cls(**{k: v for (s, k), (v, _) in self._values.items() if s == section})
            for section, cls in _SECTIONS.items()
        }
        return AsyncCubeConfig(**sections)

    def sources(self) -> dict[str, str]:
        return {
            f"{section}.{key}": self._values.get((section, key), (None, DEFAULT_SOURCE))[1]
            for section in _SECTIONS
            for key in _section_fields(section)
        }


def _parse(
    fld: dataclasses.Field[Any], raw: object, from_env: bool, base: Path, where: str
) -> object:
    parser: Parser = fld.metadata["parse"]
    try:
        return parser(raw, from_env, base)
    except (_BadValue, MemoryLayoutError) as bad:
        shown = repr(raw) if from_env else format_value(raw)
        sep = "=" if from_env else " = "
        expected = bad.expected if isinstance(bad, _BadValue) else f"a valid pool layout ({bad})"
        raise ConfigError(f"{where}{sep}{shown}: expected {expected}") from None


def _env_target(name: str) -> tuple[str, str] | None:
    """``(section, key)`` for an ``ASYNCCUBE_<SECTION>_<KEY>`` variable, else None."""
    if not name.startswith(ENV_PREFIX):
        return None
    rest = name[len(ENV_PREFIX) :]
    for section in _SECTIONS:
        head = section.upper() + "_"
        if rest.startswith(head) and len(rest) > len(head):
            return section, rest[len(head) :].lower()
    return None


def _env_name(section: str, key: str) -> str:
    return f"{ENV_PREFIX}{section}_{key}".upper()


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_bytes().decode("utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot be read: {exc}") from exc


def _tool_table(data: dict[str, Any], path: Path) -> dict[str, Any]:
    tool = data.get("tool", {})
    table = tool.get("asynccube", {}) if isinstance(tool, dict) else {}
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [tool.asynccube] must be a table, got {format_value(table)}")
    return table


def _known(names: Mapping[str, object]) -> str:
    return ", ".join(names)


# -- printing ------------------------------------------------------------------------------


def format_config(effective: EffectiveConfig) -> str:
    """The effective configuration as TOML, each value commented with its source.

    This is what ``python -m asynccube config`` prints; the output is itself a valid
    ``asynccube.toml``.
    """
    if effective.file is not None:
        head = f"# config file: {effective.file}"
    else:
        head = f"# no config file found (searched upward from {effective.searched_from})"
    lines = ["# asynccube configuration", head]
    for section in _SECTIONS:
        lines += ["", f"[{section}]", *_format_section(effective, section)]
    return "\n".join(lines) + "\n"


def _format_section(effective: EffectiveConfig, section: str) -> list[str]:
    values = getattr(effective.config, section)
    rows = [
        (f"{key} = {format_value(getattr(values, key))}", effective.source(section, key))
        for key in _section_fields(section)
    ]
    width = max(len(text) for text, _ in rows)
    return [f"{text:<{width}}  # {source}" for text, source in rows]
