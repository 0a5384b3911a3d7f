"""Which tests the loop-lag probe runs in, and the wrapper that runs it.

A test is probed when its function is a coroutine function run by an async test
runner: marked ``asyncio`` (pytest-asyncio; its auto mode marks every coroutine test),
or run by anyio's plugin (marked ``anyio``, or asking for ``anyio_backend``, as every
coroutine test does in anyio's auto mode). Left as they are: sync tests under those
markers (a module's ``pytestmark``), tests marked ``allow_loop_lag``, and hypothesis
tests (``@given``: their coroutine runs once per example, inside hypothesis' own
wrapper, which the runners replace; the probe does not reach it).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from .lagprobe import LoopLagProbe, TrioLagProbe
from .settings import LAG_FAILURE

__all__ = ["is_probed", "with_lag_probe"]


def is_probed(item: pytest.Item) -> bool:
    """Whether the probe runs in ``item`` (see the module docstring)."""
    if not isinstance(item, pytest.Function) or item.get_closest_marker("allow_loop_lag"):
        return False
    test = item.obj
    if not inspect.iscoroutinefunction(test) or hasattr(test, "hypothesis"):
        return False
    if getattr(test, "_asynccube_probed", False):
        return False  # wrapped already
    return bool(
        item.get_closest_marker("asyncio")
        or item.get_closest_marker("anyio")
        or "anyio_backend" in item.fixturenames
    )


def _running_library() -> str:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return "trio"
    return "asyncio"


def with_lag_probe(
    test: Callable[..., Awaitable[None]], limit: float
) -> Callable[..., Awaitable[None]]:
    """Wrap an async test so that it fails if one callback of its loop runs longer than
    ``limit`` seconds while the test body runs (fixtures run outside the probe)."""

    @functools.wraps(test)
    async def probed(*args: Any, **kwargs: Any) -> None:
        probe: LoopLagProbe | TrioLagProbe
        if _running_library() == "trio":
            import trio

            probe = TrioLagProbe()
            probe.start()
            await trio.lowlevel.checkpoint()  # the body starts in a new, timed step
        else:
            probe = LoopLagProbe()
            probe.start()
            await asyncio.sleep(0)  # the body starts in a new loop step, which is timed
        try:
            await test(*args, **kwargs)
        finally:
            worst = await probe.stop()
        if worst > limit:
            where = f"limit {limit * 1e3:g} ms"
            pytest.fail(f"{LAG_FAILURE} for {worst * 1e3:.1f} ms ({where}) by {probe.culprit}")

    probed._asynccube_probed = True  # type: ignore[attr-defined]
    return probed
