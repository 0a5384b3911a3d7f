"""Per-area logging through the stdlib ``logging`` module (cubecl's ``ServerLogger``).

One logger per area: ``asynccube.streaming``, ``asynccube.memory``,
``asynccube.autotune``, ``asynccube.compilation``, ``asynccube.profiling``. Each area
has a :class:`~asynccube._core.config.config.LogLevel` from its config section; a message is
emitted only when its level is at most the area's. Records carry the stdlib level
``INFO`` for minimal and basic messages and ``DEBUG`` for medium and full ones.

:meth:`ServerLogger.from_config` also sets each area logger's stdlib level so that
configured messages get through (basic/minimal -> ``INFO``, medium/full -> ``DEBUG``,
disabled -> ``WARNING``, so warnings and errors still pass). asynccube adds no handler
other than a ``NullHandler``
on the ``asynccube`` logger: where messages go is the application's choice
(``logging.basicConfig()`` is enough to see them).

On a hot path, guard with the area's attribute so that nothing is built when the area
is disabled (one attribute truth test)::

    if log.streaming:
        log.log_streaming(LogLevel.FULL, lambda: f"stream {sid} waits on {other}")
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Final, Literal

from ..errors import InvalidArgument
from .config import LogLevel

if TYPE_CHECKING:
    from .config import AsyncCubeConfig

__all__ = [
    "AREAS",
    "DISABLED_THRESHOLD",
    "PACKAGE_LOGGER",
    "Area",
    "Message",
    "ServerLogger",
    "apply_levels",
    "area_logger",
    "record_level",
]

Area = Literal["streaming", "memory", "autotune", "compilation", "profiling"]
"""The name of a logging area (and of its config section)."""
AREAS: Final[tuple[Area, ...]] = ("streaming", "memory", "autotune", "compilation", "profiling")
PACKAGE_LOGGER: Final = "asynccube"
DISABLED_THRESHOLD: Final = logging.WARNING
"""The stdlib level given to a disabled area's logger: cubecl's informational records
(basic, full) are dropped, while warnings and errors (a corrupt cache file, an
out-of-memory retry) still reach the application."""

Message = str | Callable[[], str]
"""A message, or a function building it (called only when the message is emitted)."""

_LOGGERS: Final[dict[str, logging.Logger]] = {
    area: logging.getLogger(f"{PACKAGE_LOGGER}.{area}") for area in AREAS
}
_RECORD_LEVEL: Final = {
    LogLevel.MINIMAL: logging.INFO,
    LogLevel.BASIC: logging.INFO,
    LogLevel.MEDIUM: logging.DEBUG,
    LogLevel.FULL: logging.DEBUG,
}


def _install_null_handler() -> None:
    package = logging.getLogger(PACKAGE_LOGGER)
    if not any(isinstance(h, logging.NullHandler) for h in package.handlers):
        package.addHandler(logging.NullHandler())


_install_null_handler()


def area_logger(area: str) -> logging.Logger:
    """The stdlib logger of ``area`` (``asynccube.<area>``)."""
    try:
        return _LOGGERS[area]
    except KeyError:
        raise InvalidArgument(
            f"unknown logging area {area!r}; the areas are {', '.join(AREAS)}"
        ) from None


def record_level(level: LogLevel) -> int:
    """The stdlib level of a record emitted at ``level`` (INFO or DEBUG)."""
    if level == LogLevel.DISABLED:
        raise InvalidArgument("a message cannot be emitted at LogLevel.DISABLED")
    return _RECORD_LEVEL[level]


def _threshold(level: LogLevel) -> int:
    return DISABLED_THRESHOLD if level == LogLevel.DISABLED else _RECORD_LEVEL[level]


def apply_levels(levels: Mapping[str, LogLevel]) -> None:
    """Set each area logger's stdlib level from its :class:`LogLevel`."""
    for area, level in levels.items():
        area_logger(area).setLevel(_threshold(level))


def _emit(logger: logging.Logger, level: LogLevel, message: Message) -> None:
    py_level = record_level(level)
    if logger.isEnabledFor(py_level):
        text = message() if callable(message) else message
        logger.log(py_level, text, stacklevel=3)


class ServerLogger:
    """Per-area log levels and lazy logging methods, shared by a server's parts.

    Each area is an attribute holding its :class:`LogLevel` (an ``IntEnum``; falsy when
    disabled), so ``if log.memory:`` is the cheapest possible guard.

    Attributes:
        streaming: Level of ``asynccube.streaming``.
        memory: Level of ``asynccube.memory``.
        autotune: Level of ``asynccube.autotune``.
        compilation: Level of ``asynccube.compilation``.
        profiling: Level of ``asynccube.profiling``.
    """

    __slots__ = ("autotune", "compilation", "memory", "profiling", "streaming")

    def __init__(
        self,
        *,
        streaming: LogLevel = LogLevel.DISABLED,
        memory: LogLevel = LogLevel.DISABLED,
        autotune: LogLevel = LogLevel.DISABLED,
        compilation: LogLevel = LogLevel.DISABLED,
        profiling: LogLevel = LogLevel.DISABLED,
    ) -> None:
        self.streaming = LogLevel(streaming)
        self.memory = LogLevel(memory)
        self.autotune = LogLevel(autotune)
        self.compilation = LogLevel(compilation)
        self.profiling = LogLevel(profiling)

    @classmethod
    def from_config(cls, config: AsyncCubeConfig, *, set_levels: bool = True) -> ServerLogger:
        """A logger with each area's level from its config section.

        With ``set_levels`` (the default) the stdlib area loggers' levels are set too
        (see :func:`apply_levels`).
        """
        logger = cls(**config.log_levels())
        if set_levels:
            logger.apply_levels()
        return logger

    def __repr__(self) -> str:
        levels = ", ".join(f"{area}={self.level(area).name.lower()}" for area in AREAS)
        return f"ServerLogger({levels})"

    def levels(self) -> dict[str, LogLevel]:
        """Each area's level."""
        return {area: self.level(area) for area in AREAS}

    def apply_levels(self) -> None:
        """Set the stdlib area loggers' levels from this logger's levels."""
        apply_levels(self.levels())

    def level(self, area: str) -> LogLevel:
        """The level of ``area``."""
        area_logger(area)
        level: LogLevel = getattr(self, area)
        return level

    def streaming_level(self) -> LogLevel:
        """The streaming level (what ``stream.multi.StreamingLog`` asks for)."""
        return self.streaming

    def enabled(self, area: str, level: LogLevel) -> bool:
        """True if a message of ``level`` in ``area`` would be emitted."""
        configured = self.level(area)
        return bool(configured) and LogLevel.DISABLED < level <= configured

    def log(self, area: str, level: LogLevel, message: Message) -> None:
        """Emit ``message`` in ``area`` if ``level`` is enabled there."""
        configured = self.level(area)
        if configured and level <= configured:
            _emit(_LOGGERS[area], level, message)

    def log_streaming(self, level: LogLevel, message: Message) -> None:
        """Emit a streaming message (cursors, cross-stream waits, flushes)."""
        if self.streaming and level <= self.streaming:
            _emit(_LOGGERS["streaming"], level, message)

    def log_memory(self, level: LogLevel, message: Message) -> None:
        """Emit a memory message (pages, pools, cleanups)."""
        if self.memory and level <= self.memory:
            _emit(_LOGGERS["memory"], level, message)

    def log_autotune(self, level: LogLevel, message: Message) -> None:
        """Emit an autotune message (keys tuned, candidates, winners)."""
        if self.autotune and level <= self.autotune:
            _emit(_LOGGERS["autotune"], level, message)

    def log_compilation(self, level: LogLevel, message: Message) -> None:
        """Emit a compilation message (compiles, cache hits, compiler logs)."""
        if self.compilation and level <= self.compilation:
            _emit(_LOGGERS["compilation"], level, message)

    def log_profiling(self, level: LogLevel, message: Message) -> None:
        """Emit a profiling message (profile durations, kernel records, summaries)."""
        if self.profiling and level <= self.profiling:
            _emit(_LOGGERS["profiling"], level, message)
