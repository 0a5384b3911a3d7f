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
    pool = "default"          # "default" | "exclusive"; unless [[memory.pools]] lists pools
    persistent_memory = "enabled"   # "enabled" | "disabled" | "enforced"
    host_limit_bytes = 0      # host server's largest allocation; 0: physical memory
    logging = "disabled"      # "disabled" | "basic" | "full"

    [[memory.pools]]          # optional, repeated: the pools, in routing order
    kind = "sliced"           # "sliced" | "exclusive" | "persistent" | "direct"
    max_slice = 262144        # the largest request the pool accepts (bytes)
    page_size = 2097152       # sliced pools only
    max_total = 67108864      # optional cap; a full pool spills to the next that fits

    [autotune]
    level = "balanced"        # "minimal" | "balanced" | "extensive" | "full"
    cache = true
    cache_dir = "~/.cache/asynccube/autotune"    # platform user cache dir
    logging = "disabled"      # "disabled" | "minimal" | "full"
    progress = true           # a progress bar while tuning (tqdm, terminal/notebook)
    adaptive = false          # stop sampling implementations far behind the leader
    min_samples = 3           # adaptive: samples before one may be pruned (1..=10000)
    prune_ratio = 2.0         # adaptive: pruned when its best > ratio x leader's median

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

from ..errors import ConfigError
from .load import (
    CODE_SOURCE,
    CONFIG_FILE_NAME,
    DEFAULT_SOURCE,
    ENV_CONFIG_FILE,
    ENV_PREFIX,
    ConfigOverrides,
    EffectiveConfig,
    find_config_file,
    format_config,
    load_config,
    load_effective_config,
)
from .schema import (
    AsyncCubeConfig,
    AutotuneConfig,
    AutotuneLevel,
    CompilationConfig,
    LogLevel,
    MemoryConfig,
    PersistentMemory,
    PoolPreset,
    ProfilingConfig,
    ProfilingLevel,
    StreamingConfig,
    StreamPriority,
    config_keys,
    default_cache_dir,
    format_value,
)

__all__ = [
    "CODE_SOURCE",
    "CONFIG_FILE_NAME",
    "DEFAULT_SOURCE",
    "ENV_CONFIG_FILE",
    "ENV_PREFIX",
    "AsyncCubeConfig",
    "AutotuneConfig",
    "AutotuneLevel",
    "CompilationConfig",
    "ConfigError",
    "ConfigOverrides",
    "EffectiveConfig",
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
    "find_config_file",
    "format_config",
    "format_value",
    "load_config",
    "load_effective_config",
]
