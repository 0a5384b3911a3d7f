"""The effective settings of servers, read from the configuration."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Settings", "current_settings"]


@dataclass(frozen=True, slots=True)
class Settings:
    """Server options derived from the configuration."""

    max_streams: int = 8

    def host_server_options(self) -> dict[str, Any]:
        """Keyword arguments for ``HostServer``."""
        return {"max_streams": self.max_streams}


def current_settings() -> Settings:
    """The settings for a new server."""
    return Settings()
