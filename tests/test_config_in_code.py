"""Configuration set in code: ``open_client(device, config=...)`` / ``connect(...,
config=...)``, validated like the file (issue 10, finding 10)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import asynccube as ac
from asynccube._core.config.config import CODE_SOURCE, load_config, load_effective_config

from .tune_helpers import SizeKey, three_speeds

pytestmark = pytest.mark.asyncio


async def test_config_in_code_sets_the_servers_values() -> None:
    config = {"streaming": {"max_streams": 2}, "profiling": {"level": "medium"}}
    async with ac.open_client("host", config=config) as client:
        assert client.properties.extra["max_streams"] == 2
        assert client.config is not None and client.config.streaming.max_streams == 2
        assert client.config_from_code == {"streaming.max_streams", "profiling.level"}
        h = client.create(np.ones(4, np.float32))
        await client.read([h])
        timeline = await client.timeline()  # recorded: the level came from code
        assert len(timeline) > 0 and not timeline.hint


async def test_code_overrides_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASYNCCUBE_STREAMING_MAX_STREAMS", "5")
    effective = load_effective_config(overrides={"streaming": {"max_streams": 3}})
    assert effective.config.streaming.max_streams == 3
    assert effective.source("streaming", "max_streams") == CODE_SOURCE


@pytest.mark.parametrize(
    ("config", "match"),
    [
        (
            {"streaming": {"max_streamz": 2}},
            r"config= argument: unknown key streaming\.max_streamz",
        ),
        ({"streaming": {"max_streams": 0}}, r"config= argument: streaming\.max_streams = 0"),
        ({"profiling": {"level": "loud"}}, r"profiling\.level = \"loud\""),
        ({"nosuch": {}}, r"config= argument: \[nosuch\]: unknown section"),
        ({"memory": 3}, r"\[memory\] must be a table"),
        (["streaming"], "expected a mapping of sections"),
    ],
)
async def test_bad_config_in_code_is_a_config_error(config: object, match: str) -> None:
    with pytest.raises(ac.ConfigError, match=match):
        await ac.connect("host", config=config)  # type: ignore[arg-type]


async def test_paths_in_code_are_relative_to_the_working_directory(tmp_path: Path) -> None:
    config = load_config(tmp_path, overrides={"compilation": {"cache_dir": Path("k")}})
    assert config.compilation.cache_dir == tmp_path / "k"


async def test_a_ready_config_is_used_as_is() -> None:
    ready = load_config(overrides={"streaming": {"max_streams": 2}})
    async with ac.open_client("host", config=ready) as client:
        assert client.config is ready
        assert client.properties.extra["max_streams"] == 2


async def test_autotune_values_in_code_reach_the_tuner(tmp_path: Path) -> None:
    config = {"autotune": {"level": "minimal", "cache_dir": str(tmp_path / "tune")}}
    async with ac.open_client("host", config=config) as client:
        tuner = ac.Tuner("test_config_in_code")  # no samples=, no cache_dir=
        await tuner.execute(client, three_speeds(Counter()), 1000)
        result = tuner.result(client, SizeKey(1024))
        assert result is not None
        assert all(len(o.samples_ns) == 3 for o in result.outcomes)  # minimal: 3
        path = tuner.cache(client).path
        assert path is not None and path.is_relative_to(tmp_path / "tune")
