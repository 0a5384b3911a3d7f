"""Benchmarking one implementation for the tuner: warm-up runs, then profiled samples
(device timing with CUDA events on a GPU, synchronized wall clock on the host), and the
sample count from ``[autotune] level``."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from typing import TYPE_CHECKING, Any, Final

from ..channel.backend import to_thread
from ..config.logging import area_logger
from ..config.schema import AutotuneConfig
from ..errors import AsyncCubeError
from .cache import AutotuneOutcome
from .tunable import Tunable

if TYPE_CHECKING:
    from ..client.client import ComputeClient

__all__ = [
    "SAMPLES_BY_LEVEL",
    "autotune_config",
    "benchmark",
    "configured_samples",
    "from_code",
    "profiled",
]

log = area_logger("autotune")

SAMPLES_BY_LEVEL: Final = {"minimal": 3, "balanced": 10, "extensive": 25, "full": 50}
"""Profiled samples per tunable for each ``[autotune] level``."""


async def benchmark(
    client: ComputeClient,
    name: str,
    index: int,
    tunable: Tunable[Any, Any],
    inputs: Any,
    warmup: int,
    samples: int | None,
) -> tuple[AutotuneOutcome, int | None]:
    """Run ``tunable`` ``warmup`` times, then ``samples`` times profiled (from the
    configured level when None); return its outcome and the sample count it resolved
    (None if it failed before resolving one). A failure becomes a failed outcome."""
    count = samples
    try:
        for _ in range(warmup):
            await tunable(client, inputs)
        await client.sync()  # warm-up done, and its errors raised here
        if count is None and (level := from_code(client, "level")) is not None:
            count = SAMPLES_BY_LEVEL[str(level.value)]  # open_client(config=...)
        if count is None:
            count = samples = await to_thread(configured_samples)
        timings = [await profiled(client, tunable, inputs) for _ in range(count)]
    except Exception as exc:
        log.info("autotune %s: %s failed: %s: %s", name, tunable.name, type(exc).__name__, exc)
        return AutotuneOutcome.failed(tunable.name, index, exc), samples
    return AutotuneOutcome.from_samples(tunable.name, index, timings), samples


async def profiled(client: ComputeClient, tunable: Tunable[Any, Any], inputs: Any) -> int:
    """Nanoseconds one run of ``tunable`` takes, profiled by the client."""
    token = client.start_profile()
    try:
        await tunable(client, inputs)
    except BaseException:
        with contextlib.suppress(AsyncCubeError):
            client.end_profile(token).add_done_callback(_consume)
        raise
    return (await client.end_profile(token)).duration_ns


def _consume(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()


def from_code(client: ComputeClient, key: str) -> Any:
    """``[autotune] key`` if the client was opened with it set in code, else None."""
    config = getattr(client, "config", None)
    if config is None or f"autotune.{key}" not in getattr(client, "config_from_code", ()):
        return None
    return getattr(config.autotune, key)


def configured_samples() -> int:
    """Samples per tunable from ``[autotune] level`` (blocking: reads the configuration)."""
    from ..config.config import load_config

    try:
        level = load_config().autotune.level
    except AsyncCubeError as exc:
        log.warning("autotune: cannot read the configuration (%s); using 10 samples", exc)
        return 10
    return SAMPLES_BY_LEVEL[str(level.value)]


async def autotune_config(client: ComputeClient) -> AutotuneConfig:
    """``[autotune]`` as the tuner sees it: the keys set in code on the client, else
    the file and the environment (read in a worker thread; their defaults, with a
    warning, where the configuration cannot be read)."""
    base = await to_thread(_file_autotune)
    config = getattr(client, "config", None)
    if config is None:
        return base
    code = getattr(client, "config_from_code", ())
    fields = [f.name for f in dataclasses.fields(AutotuneConfig)]
    overrides = {k: getattr(config.autotune, k) for k in fields if f"autotune.{k}" in code}
    return dataclasses.replace(base, **overrides)


def _file_autotune() -> AutotuneConfig:
    from ..config.config import load_config

    try:
        return load_config().autotune
    except AsyncCubeError as exc:
        log.warning("autotune: cannot read the configuration (%s); using its defaults", exc)
        return AutotuneConfig()
