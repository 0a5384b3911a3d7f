"""Configuration: ``asynccube.toml`` (or ``[tool.asynccube]``), overridden by the environment.

The sections follow cubecl's ``GlobalConfig`` (streaming, memory, autotune, compilation,
profiling). Values are resolved in three layers, each overriding the one before:

1. the defaults of the dataclasses below;
2. a file, found by walking up from the working directory: in each directory,
   ``asynccube.toml`` if present, else ``pyproject.toml`` if it has a
   ``[tool.asynccube]`` table (a ``pyproject.toml`` without one is passed over).
   ``ASYNCCUBE_CONFIG=/path/to/file.toml`` names the file instead of searching;
3. environment variables ``ASYNCCUBE_<SECTION>_<KEY>``, e.g.
   ``ASYNCCUBE_STREAMING_MAX_STREAMS=8``. An empty variable counts as unset. Variables
   whose name does not start with a section (``ASYNCCUBE_CONFIG``, ``ASYNCCUBE_DEVICE``)
   are not config keys and are left alone.

An unknown section or key, a value of the wrong type or outside its choices, or a file
that is not valid TOML raises :class:`~asynccube.errors.ConfigError` naming the key, the
value and the file or environment variable. Relative paths in a file are relative to
the file's directory; in the environment, to the working directory.

Example ``asynccube.toml`` (every key shown with its default)::

    [streaming]
    max_streams = 32          # 1..=255; stream index = stream id mod max_streams
    priority = "normal"       # "normal" | "high"
    logging = "disabled"      # "disabled" | "basic" | "full"

    [memory]
    pool = "default"          # "default" | "exclusive"
    persistent_memory = "enabled"   # "enabled" | "disabled" | "enforced"
    logging = "disabled"      # "disabled" | "basic" | "full"

    [autotune]
    level = "balanced"        # "minimal" | "balanced" | "extensive" | "full"
    cache = true
    cache_dir = "~/.cache/asynccube/autotune"    # platform user cache dir
    logging = "disabled"      # "disabled" | "minimal" | "full"

    [compilation]
    cache = true
    cache_dir = "~/.cache/asynccube/compilation"
    check_mode = "checked"    # default ExecutionMode: "checked" | "unchecked"
    logging = "disabled"      # "disabled" | "basic" | "full"

    [profiling]
    level = "disabled"        # "disabled" | "basic" | "medium" | "full"
    logging = "disabled"      # "disabled" | "basic" | "medium" | "full"
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import sys
import tomllib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from .errors import ConfigError
from .types import ExecutionMode

__all__ = [
    "CONFIG_FILE_NAME",
    "ENV_CONFIG_FILE",
    "ENV_PREFIX",
    "AsyncCubeConfig",
    "AutotuneConfig",
    "AutotuneLevel",
    "CompilationConfig",
    "EffectiveConfig",
    "LogLevel",
    "MemoryConfig",
    "PersistentMemory",
    "PoolPreset",
    "ProfilingConfig",
    "ProfilingLevel",
    "StreamPriority",
    "StreamingConfig",
    "default_cache_dir",
    "find_config_file",
    "format_config",
    "format_value",
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


class LogLevel(enum.IntEnum):
    """How much an area logs (cubecl's per-area ``*LogLevel``), ordered by verbosity.

    Each area accepts the subset cubecl has for it: streaming, memory and compilation
    take disabled/basic/full; autotune disabled/minimal/full; profiling
    disabled/basic/medium/full. Written lower-case in files and the environment.
    """

    DISABLED = 0
    MINIMAL = 1
    BASIC = 2
    MEDIUM = 3
    FULL = 4


class ProfilingLevel(enum.IntEnum):
    """What the runtime records for profiling, beyond explicit start/end_profile.

    * ``DISABLED``: nothing (``start_profile``/``end_profile`` still work).
    * ``BASIC``: named profiles (``client.profile(name)``) are aggregated into a
      :class:`~asynccube._core.profiling.ProfileSummary`.
    * ``MEDIUM``: also one :class:`~asynccube._core.profiling.KernelRecord` per kernel,
      copy and wait, with host timestamps.
    * ``FULL``: as medium, with device timestamps (CUDA events around each operation).
    """

    DISABLED = 0
    BASIC = 1
    MEDIUM = 2
    FULL = 3


class StreamPriority(enum.StrEnum):
    """Priority of the device streams a client creates."""

    NORMAL = "normal"
    """The driver's default (its lowest) stream priority."""
    HIGH = "high"
    """The greatest priority the device offers (``cuCtxGetStreamPriorityRange``)."""


class PoolPreset(enum.StrEnum):
    """How memory pools are laid out (cubecl's ``MemoryConfiguration``)."""

    DEFAULT = "default"
    """Sliced pages for small buffers, exclusive pages for large ones."""
    EXCLUSIVE = "exclusive"
    """One buffer per page: no sharing, more padding, simplest reuse."""


class PersistentMemory(enum.StrEnum):
    """Use of the persistent pool (cubecl's ``PersistentMemory``)."""

    ENABLED = "enabled"
    """Allocations made in ``MemoryAllocationMode.PERSISTENT`` go to the persistent pool."""
    DISABLED = "disabled"
    """The persistent mode is ignored; everything comes from the ordinary pools."""
    ENFORCED = "enforced"
    """Every allocation goes to the persistent pool."""


class AutotuneLevel(enum.StrEnum):
    """How hard the autotuner searches (cubecl's ``AutotuneLevel``)."""

    MINIMAL = "minimal"
    BALANCED = "balanced"
    EXTENSIVE = "extensive"
    FULL = "full"


# -- value parsers ---------------------------------------------------------------------


class _BadValue(Exception):
    """A value did not parse; ``expected`` says what would have."""

    def __init__(self, expected: str) -> None:
        super().__init__(expected)
        self.expected = expected


Parser = Callable[[object, bool, Path], object]
"""Parses a raw value: (value, from_env, base directory for relative paths)."""


def _int_range(lo: int, hi: int) -> Parser:
    def parse(raw: object, from_env: bool, base: Path) -> object:
        expected = f"an integer from {lo} to {hi}"
        value = _as_int(raw, from_env, expected)
        if not lo <= value <= hi:
            raise _BadValue(expected)
        return value

    return parse


def _as_int(raw: object, from_env: bool, expected: str) -> int:
    if from_env:
        try:
            return int(str(raw).strip())
        except ValueError:
            raise _BadValue(expected) from None
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise _BadValue(expected)
    return raw


_TRUE: Final = frozenset({"1", "true", "yes", "on"})
_FALSE: Final = frozenset({"0", "false", "no", "off"})


def _parse_bool(raw: object, from_env: bool, base: Path) -> object:
    if from_env and isinstance(raw, str):
        text = raw.strip().lower()
        if text in _TRUE or text in _FALSE:
            return text in _TRUE
        raise _BadValue("a boolean (true/false, 1/0, yes/no, on/off)")
    if not isinstance(raw, bool):
        raise _BadValue("a boolean (true or false)")
    return raw


def _parse_path(raw: object, from_env: bool, base: Path) -> object:
    if not isinstance(raw, str) or not raw.strip():
        raise _BadValue("a path (a non-empty string)")
    path = Path(raw.strip()).expanduser()
    return path if path.is_absolute() else base / path


def _choice(members: tuple[enum.Enum, ...]) -> Parser:
    by_text = {_enum_text(m): m for m in members}
    expected = "one of " + ", ".join(json.dumps(t) for t in by_text)

    def parse(raw: object, from_env: bool, base: Path) -> object:
        if not isinstance(raw, str) or raw.strip().lower() not in by_text:
            raise _BadValue(expected)
        return by_text[raw.strip().lower()]

    return parse


def _enum_text(member: enum.Enum) -> str:
    """How an enum member is written in a file: lower-case name or string value."""
    if isinstance(member, enum.IntEnum):
        return member.name.lower()
    return str(member.value)


def _meta(parser: Parser) -> dict[str, Parser]:
    return {"parse": parser}


def _default_autotune_dir() -> Path:
    return default_cache_dir("autotune")


def _default_compilation_dir() -> Path:
    return default_cache_dir("compilation")


def _levels(*names: str) -> Parser:
    return _choice(tuple(LogLevel[n.upper()] for n in names))


_BASIC_FULL: Final = ("disabled", "basic", "full")


# -- sections ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StreamingConfig:
    """``[streaming]``: the bounded stream pool and its logging.

    Attributes:
        max_streams: Device streams in the pool (1 to 255); a stream's index in the
            pool is its id modulo ``max_streams``.
        priority: Priority of the device streams.
        logging: Level of ``asynccube.streaming`` (disabled, basic, full).
    """

    max_streams: int = field(default=32, metadata=_meta(_int_range(1, 255)))
    priority: StreamPriority = field(
        default=StreamPriority.NORMAL, metadata=_meta(_choice(tuple(StreamPriority)))
    )
    logging: LogLevel = field(default=LogLevel.DISABLED, metadata=_meta(_levels(*_BASIC_FULL)))


@dataclass(frozen=True, slots=True)
class MemoryConfig:
    """``[memory]``: pool layout, the persistent pool, and logging.

    Attributes:
        pool: Pool preset.
        persistent_memory: Persistent pool policy.
        logging: Level of ``asynccube.memory`` (disabled, basic, full).
    """

    pool: PoolPreset = field(default=PoolPreset.DEFAULT, metadata=_meta(_choice(tuple(PoolPreset))))
    persistent_memory: PersistentMemory = field(
        default=PersistentMemory.ENABLED, metadata=_meta(_choice(tuple(PersistentMemory)))
    )
    logging: LogLevel = field(default=LogLevel.DISABLED, metadata=_meta(_levels(*_BASIC_FULL)))


@dataclass(frozen=True, slots=True)
class AutotuneConfig:
    """``[autotune]``: search level, the on-disk result cache, and logging.

    Attributes:
        level: How hard the autotuner searches.
        cache: Whether tuning results are kept on disk.
        cache_dir: Where they are kept (default: the user cache dir, ``.../autotune``).
        logging: Level of ``asynccube.autotune`` (disabled, minimal, full).
    """

    level: AutotuneLevel = field(
        default=AutotuneLevel.BALANCED, metadata=_meta(_choice(tuple(AutotuneLevel)))
    )
    cache: bool = field(default=True, metadata=_meta(_parse_bool))
    cache_dir: Path = field(default_factory=_default_autotune_dir, metadata=_meta(_parse_path))
    logging: LogLevel = field(
        default=LogLevel.DISABLED, metadata=_meta(_levels("disabled", "minimal", "full"))
    )


@dataclass(frozen=True, slots=True)
class CompilationConfig:
    """``[compilation]``: the on-disk kernel cache, default execution mode, logging.

    Attributes:
        cache: Whether compiled kernels are kept on disk.
        cache_dir: Where they are kept (default: the user cache dir, ``.../compilation``).
        check_mode: The execution mode used when ``execute`` is given none.
        logging: Level of ``asynccube.compilation`` (disabled, basic, full).
    """

    cache: bool = field(default=True, metadata=_meta(_parse_bool))
    cache_dir: Path = field(default_factory=_default_compilation_dir, metadata=_meta(_parse_path))
    check_mode: ExecutionMode = field(
        default=ExecutionMode.CHECKED, metadata=_meta(_choice(tuple(ExecutionMode)))
    )
    logging: LogLevel = field(default=LogLevel.DISABLED, metadata=_meta(_levels(*_BASIC_FULL)))


@dataclass(frozen=True, slots=True)
class ProfilingConfig:
    """``[profiling]``: what is recorded and logging.

    Attributes:
        level: What is recorded (see :class:`ProfilingLevel`).
        logging: Level of ``asynccube.profiling`` (disabled, basic, medium, full).
    """

    level: ProfilingLevel = field(
        default=ProfilingLevel.DISABLED, metadata=_meta(_choice(tuple(ProfilingLevel)))
    )
    logging: LogLevel = field(
        default=LogLevel.DISABLED,
        metadata=_meta(_levels("disabled", "basic", "medium", "full")),
    )


@dataclass(frozen=True, slots=True)
class AsyncCubeConfig:
    """The whole configuration: one frozen dataclass per section."""

    streaming: StreamingConfig = field(default_factory=StreamingConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    autotune: AutotuneConfig = field(default_factory=AutotuneConfig)
    compilation: CompilationConfig = field(default_factory=CompilationConfig)
    profiling: ProfilingConfig = field(default_factory=ProfilingConfig)

    def log_levels(self) -> dict[str, LogLevel]:
        """Each area's log level, keyed by area (section) name."""
        return {name: getattr(self, name).logging for name in _SECTIONS}


_SECTIONS: Final[dict[str, type]] = {
    "streaming": StreamingConfig,
    "memory": MemoryConfig,
    "autotune": AutotuneConfig,
    "compilation": CompilationConfig,
    "profiling": ProfilingConfig,
}


def _section_fields(section: str) -> dict[str, dataclasses.Field[Any]]:
    return {f.name: f for f in dataclasses.fields(_SECTIONS[section])}


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
        from .html import html_table

        rows = [(f"{s}.{k}", format_value(v), src) for s, k, v, src in self.items()]
        caption = f"asynccube configuration ({self.file or 'no config file'})"
        return html_table(("key", "value", "source"), rows, caption=caption, numeric_from=99)


def load_config(
    cwd: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None
) -> AsyncCubeConfig:
    """The configuration for ``cwd`` (default: the working directory) and ``env``
    (default: ``os.environ``): defaults, overridden by the file, then the environment.

    Raises:
        ConfigError: naming the key, the value and the file or environment variable.
    """
    return load_effective_config(cwd, env).config


def load_effective_config(
    cwd: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None
) -> EffectiveConfig:
    """Like :func:`load_config`, and also where each value came from."""
    environ = os.environ if env is None else env
    start = Path.cwd() if cwd is None else Path(cwd)
    path = find_config_file(start, environ)
    layers = _Layers(_env_defaults(environ))
    if path is not None:
        layers.apply_file(path)
    layers.apply_env(environ, start)
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


def default_cache_dir(kind: str, env: Mapping[str, str] | None = None) -> Path:
    """The platform's user cache directory for asynccube's ``kind`` cache.

    ``$XDG_CACHE_HOME/asynccube/<kind>`` when ``XDG_CACHE_HOME`` is set to an absolute
    path (on any platform); else ``~/.cache`` on Linux, ``~/Library/Caches`` on macOS,
    ``%LOCALAPPDATA%`` on Windows.
    """
    environ = os.environ if env is None else env
    xdg = environ.get("XDG_CACHE_HOME", "")
    if xdg and Path(xdg).is_absolute():
        return Path(xdg) / "asynccube" / kind
    return _platform_cache_root(environ) / "asynccube" / kind


def _platform_cache_root(environ: Mapping[str, str]) -> Path:
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches"
    if sys.platform == "win32" and environ.get("LOCALAPPDATA"):
        return Path(environ["LOCALAPPDATA"])
    return Path.home() / ".cache"


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
            self._apply_section(section, table, path, prefix)

    def _apply_section(self, section: str, table: object, path: Path, prefix: str) -> None:
        where = f"{path}: [{prefix}{section}]"
        if section not in _SECTIONS:
            raise ConfigError(f"{where}: unknown section; the sections are {_known(_SECTIONS)}")
        if not isinstance(table, dict):
            raise ConfigError(f"{where} must be a table, got {format_value(table)}")
        fields = _section_fields(section)
        for key, raw in table.items():
            if key not in fields:
                raise ConfigError(
                    f"{path}: unknown key {prefix}{section}.{key} = {format_value(raw)}; "
                    f"the keys of [{section}] are {_known(fields)}"
                )
            value = _parse(fields[key], raw, False, path.parent, f"{path}: {prefix}{section}.{key}")
            self._values[section, key] = (value, str(path))

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
    except _BadValue as bad:
        shown = repr(raw) if from_env else format_value(raw)
        sep = "=" if from_env else " = "
        raise ConfigError(f"{where}{sep}{shown}: expected {bad.expected}") from None


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


def format_value(value: object) -> str:
    """A config value as TOML writes it (``true``, ``8``, ``"full"``, ``"/a/path"``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return json.dumps(_enum_text(value))
    if isinstance(value, str | Path):
        return json.dumps(str(value))
    if isinstance(value, dict):
        return "a table"
    return repr(value)


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
