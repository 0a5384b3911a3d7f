"""Per-area loggers: each emits at its configured levels and is silent when disabled."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator

import pytest

from asynccube._core.config.config import AsyncCubeConfig, LogLevel
from asynccube._core.config.logging import (
    AREAS,
    DISABLED_THRESHOLD,
    PACKAGE_LOGGER,
    ServerLogger,
    area_logger,
    record_level,
)
from asynccube._core.errors import InvalidArgument

# The levels each area accepts (as in cubecl), most verbose last.
AREA_LEVELS = {
    "streaming": (LogLevel.BASIC, LogLevel.FULL),
    "memory": (LogLevel.BASIC, LogLevel.FULL),
    "autotune": (LogLevel.MINIMAL, LogLevel.FULL),
    "compilation": (LogLevel.BASIC, LogLevel.FULL),
    "profiling": (LogLevel.BASIC, LogLevel.MEDIUM, LogLevel.FULL),
}


@pytest.fixture(autouse=True)
def restore_logger_levels() -> Iterator[None]:
    saved = {area: area_logger(area).level for area in AREAS}
    yield
    for area, level in saved.items():
        area_logger(area).setLevel(level)


def config_with(area: str, level: LogLevel) -> AsyncCubeConfig:
    cfg = AsyncCubeConfig()
    section = dataclasses.replace(getattr(cfg, area), logging=level)
    return dataclasses.replace(cfg, **{area: section})


def emit_all(log: ServerLogger, area: str) -> list[str]:
    """Log one message per level in ``area``; return the messages whose builder ran."""
    built: list[str] = []

    def message(level: LogLevel) -> str:
        built.append(level.name)
        return f"{area} at {level.name}"

    method = getattr(log, f"log_{area}")
    for level in AREA_LEVELS[area]:
        method(level, lambda level=level: message(level))
    return built


def area_records(caplog: pytest.LogCaptureFixture, area: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == f"asynccube.{area}"]


@pytest.mark.parametrize("area", AREAS)
def test_each_area_emits_at_its_levels(area: str, caplog: pytest.LogCaptureFixture) -> None:
    for configured in AREA_LEVELS[area]:
        caplog.clear()
        log = ServerLogger.from_config(config_with(area, configured))
        emit_all(log, area)
        expected = [lv for lv in AREA_LEVELS[area] if lv <= configured]
        got = area_records(caplog, area)
        assert [r.getMessage() for r in got] == [f"{area} at {lv.name}" for lv in expected]
        assert [r.levelno for r in got] == [record_level(lv) for lv in expected]


@pytest.mark.parametrize("area", AREAS)
def test_each_area_is_silent_and_lazy_when_disabled(
    area: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    log = ServerLogger.from_config(AsyncCubeConfig())
    assert not getattr(log, area)
    assert emit_all(log, area) == []
    assert caplog.records == []
    assert area_logger(area).level == DISABLED_THRESHOLD


@pytest.mark.parametrize("area", AREAS)
def test_other_areas_stay_silent(area: str, caplog: pytest.LogCaptureFixture) -> None:
    log = ServerLogger.from_config(config_with(area, LogLevel.FULL))
    for other in AREAS:
        emit_all(log, other)
    assert {r.name for r in caplog.records} == {f"asynccube.{area}"}


def test_basic_maps_to_info_and_full_to_debug() -> None:
    assert record_level(LogLevel.BASIC) == logging.INFO
    assert record_level(LogLevel.MINIMAL) == logging.INFO
    assert record_level(LogLevel.MEDIUM) == logging.DEBUG
    assert record_level(LogLevel.FULL) == logging.DEBUG
    with pytest.raises(InvalidArgument):
        record_level(LogLevel.DISABLED)


def test_from_config_sets_stdlib_levels() -> None:
    ServerLogger.from_config(config_with("memory", LogLevel.BASIC))
    assert area_logger("memory").level == logging.INFO
    ServerLogger.from_config(config_with("memory", LogLevel.FULL))
    assert area_logger("memory").level == logging.DEBUG
    assert area_logger("streaming").level == logging.WARNING  # disabled: warnings still pass


def test_without_set_levels_the_stdlib_levels_are_untouched() -> None:
    area_logger("compilation").setLevel(logging.WARNING)
    log = ServerLogger.from_config(config_with("compilation", LogLevel.FULL), set_levels=False)
    assert log.compilation is LogLevel.FULL
    assert area_logger("compilation").level == logging.WARNING


def test_stdlib_level_still_filters_enabled_messages(caplog: pytest.LogCaptureFixture) -> None:
    log = ServerLogger(streaming=LogLevel.FULL)
    area_logger("streaming").setLevel(logging.INFO)
    built = emit_all(log, "streaming")
    assert built == ["BASIC"]  # the FULL message is not even built
    assert [r.levelno for r in area_records(caplog, "streaming")] == [logging.INFO]


def test_enabled_checks() -> None:
    log = ServerLogger(memory=LogLevel.BASIC, profiling=LogLevel.MEDIUM)
    assert log.enabled("memory", LogLevel.BASIC)
    assert not log.enabled("memory", LogLevel.FULL)
    assert log.enabled("profiling", LogLevel.MEDIUM)
    assert not log.enabled("profiling", LogLevel.FULL)
    assert not log.enabled("streaming", LogLevel.BASIC)
    assert not log.enabled("memory", LogLevel.DISABLED)
    with pytest.raises(InvalidArgument, match="unknown logging area 'gpu'"):
        log.enabled("gpu", LogLevel.BASIC)


def test_generic_log_and_plain_string_messages(caplog: pytest.LogCaptureFixture) -> None:
    log = ServerLogger(autotune=LogLevel.FULL)
    area_logger("autotune").setLevel(logging.DEBUG)
    log.log("autotune", LogLevel.MINIMAL, "tuning matmul")
    log.log("autotune", LogLevel.FULL, lambda: "candidate 3: 1.2 ms")
    log.log("memory", LogLevel.BASIC, "never")
    assert [r.getMessage() for r in caplog.records] == ["tuning matmul", "candidate 3: 1.2 ms"]


def test_percent_in_message_is_not_formatted(caplog: pytest.LogCaptureFixture) -> None:
    log = ServerLogger(memory=LogLevel.BASIC)
    area_logger("memory").setLevel(logging.INFO)
    log.log_memory(LogLevel.BASIC, lambda: "100% of %s used")
    assert caplog.records[0].getMessage() == "100% of %s used"


def test_record_points_at_the_caller(caplog: pytest.LogCaptureFixture) -> None:
    log = ServerLogger(streaming=LogLevel.BASIC)
    area_logger("streaming").setLevel(logging.INFO)
    log.log_streaming(LogLevel.BASIC, "here")
    (record,) = caplog.records
    assert record.funcName == "test_record_points_at_the_caller"
    assert record.pathname == __file__


def test_streaming_level_and_repr() -> None:
    log = ServerLogger(streaming=LogLevel.FULL)
    assert log.streaming_level() is LogLevel.FULL
    assert "streaming=full" in repr(log)
    assert log.levels()["memory"] is LogLevel.DISABLED


def test_only_a_null_handler_on_the_package_logger() -> None:
    package = logging.getLogger(PACKAGE_LOGGER)
    assert [type(h) for h in package.handlers] == [logging.NullHandler]
    for area in AREAS:
        assert area_logger(area).handlers == []
        assert area_logger(area).propagate
