"""The configuration's schema: its sections, keys, value types and defaults.

Each section is a frozen dataclass whose fields carry a parser (``metadata["parse"]``)
that turns a raw value (TOML, an environment variable's text, or a value given in code)
into the field's type, or says what was expected. :mod:`.config_load` applies them in
layers; :mod:`.config` is the public face and documents the file format.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from ..values.types import ExecutionMode
from .pools import MemoryPool, parse_pools, pools_toml

__all__ = [
    "AsyncCubeConfig",
    "AutotuneConfig",
    "AutotuneLevel",
    "CompilationConfig",
    "LogLevel",
    "MemoryConfig",
    "PersistentMemory",
    "PoolPreset",
    "ProfilingConfig",
    "ProfilingLevel",
    "StreamPriority",
    "StreamingConfig",
    "config_keys",
    "default_cache_dir",
    "format_value",
]


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
      :class:`~asynccube._core.profiling.records.ProfileSummary`.
    * ``MEDIUM``: also one :class:`~asynccube._core.profiling.records.KernelRecord` per kernel,
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
    """How memory pools are laid out (cubecl's ``MemoryConfiguration``), unless
    ``[[memory.pools]]`` lists the pools."""

    DEFAULT = "default"
    """Sliced pages for small buffers, exclusive pages for large ones."""
    EXCLUSIVE = "exclusive"
    """One buffer per page: no sharing, more padding, simplest reuse."""
    EXPANDABLE = "expandable"
    """One reserved range of device addresses grown in place, backed by physical chunks
    on demand (PyTorch's ``expandable_segments``): sizes that keep changing do not
    fragment. CUDA only: a host client refuses it at connect (``MemoryLayoutError``)."""


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


def _float_above(lo: float, hi: float) -> Parser:
    def parse(raw: object, from_env: bool, base: Path) -> object:
        expected = f"a number above {lo:g}, at most {hi:g}"
        if from_env:
            try:
                raw = float(str(raw).strip())
            except ValueError:
                raise _BadValue(expected) from None
        if isinstance(raw, bool) or not isinstance(raw, int | float) or not lo < raw <= hi:
            raise _BadValue(expected)
        return float(raw)

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


def _parse_pools(raw: object, from_env: bool, base: Path) -> object:
    return parse_pools(raw, from_env)  # MemoryLayoutError: "expected a valid pool layout"


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
        batch_us: Microseconds of commands a client runs in one loop iteration before
            it yields (10 to 1,000,000): commands run inline by their callers, then each
            slice of the actor's batch. Lower keeps the event loop's lag low under load;
            higher runs more commands per iteration.
        logging: Level of ``asynccube.streaming`` (disabled, basic, full).
    """

    max_streams: int = field(default=32, metadata=_meta(_int_range(1, 255)))
    priority: StreamPriority = field(
        default=StreamPriority.NORMAL, metadata=_meta(_choice(tuple(StreamPriority)))
    )
    batch_us: int = field(default=1000, metadata=_meta(_int_range(10, 1_000_000)))
    logging: LogLevel = field(default=LogLevel.DISABLED, metadata=_meta(_levels(*_BASIC_FULL)))


@dataclass(frozen=True, slots=True)
class MemoryConfig:
    """``[memory]``: pool layout, the persistent pool, and logging.

    Attributes:
        pool: Pool preset, used when ``pools`` is empty: ``"default"``,
            ``"exclusive"`` or ``"expandable"`` (CUDA only).
        pools: The pools, in routing order (``[[memory.pools]]`` tables, see
            :class:`~asynccube.MemoryPool`); empty: the ``pool`` preset.
        persistent_memory: Persistent pool policy.
        host_limit_bytes: The host server's largest single allocation, in bytes; a
            larger request raises ``BufferTooBig`` at the call. ``0`` (the default):
            the machine's physical memory.
        high_water_bytes: A bound on the bytes the pools keep reserved (for services):
            above it, empty pages are given back, largest first, as soon as buffers
            are released or the next request comes. ``0`` (the default): no bound.
        logging: Level of ``asynccube.memory`` (disabled, basic, full).
    """

    pool: PoolPreset = field(default=PoolPreset.DEFAULT, metadata=_meta(_choice(tuple(PoolPreset))))
    pools: tuple[MemoryPool, ...] = field(default=(), metadata=_meta(_parse_pools))
    persistent_memory: PersistentMemory = field(
        default=PersistentMemory.ENABLED, metadata=_meta(_choice(tuple(PersistentMemory)))
    )
    host_limit_bytes: int = field(default=0, metadata=_meta(_int_range(0, 2**62)))
    high_water_bytes: int = field(default=0, metadata=_meta(_int_range(0, 2**62)))
    logging: LogLevel = field(default=LogLevel.DISABLED, metadata=_meta(_levels(*_BASIC_FULL)))


@dataclass(frozen=True, slots=True)
class AutotuneConfig:
    """``[autotune]``: search level, the on-disk result cache, and logging.

    Attributes:
        level: How hard the autotuner searches.
        cache: Whether tuning results are kept on disk.
        cache_dir: Where they are kept (default: the user cache dir, ``.../autotune``).
        logging: Level of ``asynccube.autotune`` (disabled, minimal, full).
        progress: Show a progress bar while tuning (where tqdm is installed and a
            terminal or notebook shows it).
        adaptive: Sample adaptively (``AdaptiveSampling``) where a tunable set says
            nothing: stop sampling implementations far behind the leader.
        min_samples: Adaptive sampling: samples before an implementation may be pruned.
        prune_ratio: Adaptive sampling: an implementation whose fastest sample is more
            than this many times the leader's median is pruned (> 1).
    """

    level: AutotuneLevel = field(
        default=AutotuneLevel.BALANCED, metadata=_meta(_choice(tuple(AutotuneLevel)))
    )
    cache: bool = field(default=True, metadata=_meta(_parse_bool))
    cache_dir: Path = field(default_factory=_default_autotune_dir, metadata=_meta(_parse_path))
    logging: LogLevel = field(
        default=LogLevel.DISABLED, metadata=_meta(_levels("disabled", "minimal", "full"))
    )
    progress: bool = field(default=True, metadata=_meta(_parse_bool))
    adaptive: bool = field(default=False, metadata=_meta(_parse_bool))
    min_samples: int = field(default=3, metadata=_meta(_int_range(1, 10_000)))
    prune_ratio: float = field(default=2.0, metadata=_meta(_float_above(1.0, 1e6)))


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


def config_keys(config: AsyncCubeConfig) -> Iterator[tuple[str, str, object]]:
    """``(section, key, value)`` for every key of ``config``, in declaration order."""
    for section in _SECTIONS:
        values = getattr(config, section)
        for key in _section_fields(section):
            yield section, key, getattr(values, key)


def _section_fields(section: str) -> dict[str, dataclasses.Field[Any]]:
    return {f.name: f for f in dataclasses.fields(_SECTIONS[section])}


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
    if isinstance(value, tuple) and all(isinstance(v, MemoryPool) for v in value):
        return pools_toml(value)
    if isinstance(value, list | tuple):
        return json.dumps(value, default=repr)
    return repr(value)
