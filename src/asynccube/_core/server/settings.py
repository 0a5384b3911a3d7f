"""The effective settings of new servers, read from the configuration."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config.config import AsyncCubeConfig, ConfigOverrides, PoolPreset, load_config
from ..config.logging import ServerLogger
from ..config.pools import MemoryLayout
from ..memory import MemoryConfig as PoolLayout
from ..profiling.records import KernelRecorder

__all__ = ["Settings", "host_workers", "load_settings"]


@dataclass(frozen=True, slots=True)
class Settings:
    """Server options derived from an :class:`AsyncCubeConfig`."""

    config: AsyncCubeConfig

    def logger(self) -> ServerLogger:
        """A per-area logger at the configured levels."""
        return ServerLogger.from_config(self.config)

    def pool_layout(self, max_allocation: int | None = None) -> PoolLayout:
        """The pools of ``[[memory.pools]]``, else the preset (``max_allocation``: None
        for the storage's limit)."""
        memory = self.config.memory
        if memory.pools:
            layout = PoolLayout.from_layout(MemoryLayout(memory.pools), max_allocation)
        elif memory.pool is PoolPreset.EXCLUSIVE:
            layout = PoolLayout.exclusive_pages(max_allocation=max_allocation)
        elif memory.pool is PoolPreset.EXPANDABLE:
            layout = PoolLayout.expandable(max_allocation=max_allocation)
        else:
            layout = PoolLayout.default(max_allocation=max_allocation)
        if memory.high_water_bytes:
            layout = dataclasses.replace(layout, high_water=memory.high_water_bytes)
        return layout

    def host_limit(self) -> int | None:
        """``[memory] host_limit_bytes``, or None for the machine's physical memory."""
        return self.config.memory.host_limit_bytes or None

    def host_server_options(self) -> dict[str, Any]:
        """Keyword arguments for ``HostServer``."""
        return {
            "max_streams": min(self.config.streaming.max_streams, host_workers()),
            "memory": self.pool_layout(self.host_limit()),
            "logger": self.logger(),
            "recorder": KernelRecorder.from_config(self.config.profiling),
        }


def host_workers() -> int:
    """Worker threads the host server uses at most: one per core (at least 2).

    More workers than cores only contend for the GIL and the cores; the configured
    ``streaming.max_streams`` still caps it.
    """
    return max(2, os.cpu_count() or 2)


def load_settings(
    cwd: Path | None = None, overrides: ConfigOverrides | AsyncCubeConfig | None = None
) -> Settings:
    """Read the configuration (file, ``ASYNCCUBE_*``, then ``overrides`` given in code,
    validated like the file); blocking, call it off the loop. A ready
    :class:`AsyncCubeConfig` is used as it is."""
    if isinstance(overrides, AsyncCubeConfig):
        return Settings(overrides)
    return Settings(load_config(cwd, overrides=overrides))
