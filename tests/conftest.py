"""Shared fixtures: the loop-lag probe on every async test, clients, GPU detection."""

from __future__ import annotations

import asyncio
import functools
import gc
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import numpy.testing  # noqa: F401 - imported lazily otherwise, inside a test step
import pytest
import pytest_asyncio

import asynccube as ac
from asynccube._core.devices import probe_gpus

from .lagprobe import MAX_LAG_SECONDS, LoopLagProbe

_GPU = probe_gpus()
LAG_FAILURE = "the event loop was blocked"


def pytest_configure(config: pytest.Config) -> None:
    # Worker threads holding the GIL for the default 5 ms would read as a blocked loop.
    sys.setswitchinterval(0.0002)
    # A test whose only failure is one loop-lag spike is run once more: contention for
    # the GIL on a loaded two-core machine can stretch a callback past 5 ms now and then,
    # while code that really blocks the loop fails every run. Nothing else is retried.
    if config.pluginmanager.hasplugin("rerunfailures") and not config.option.reruns:
        config.option.reruns = 1
        config.option.only_rerun = [LAG_FAILURE]


def pytest_collection_finish(session: pytest.Session) -> None:
    # A full collection of everything imported so far can pause the loop for > 5 ms.
    gc.collect()
    gc.freeze()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_cuda = pytest.mark.skip(reason=f"needs a CUDA GPU: {_GPU.reason}")
    for item in items:
        if "cuda" in item.keywords and not _GPU.usable:
            item.add_marker(skip_cuda)
        if item.get_closest_marker("asyncio") and not item.get_closest_marker("allow_loop_lag"):
            assert isinstance(item, pytest.Function)
            item.obj = _with_lag_probe(item.obj)


def _with_lag_probe(test: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
    """Wrap an async test so that it fails if its loop is blocked for more than 5 ms
    (``ASYNCCUBE_MAX_LAG_MS``) while the test body runs (fixtures run with the loop
    stopped in between)."""

    @functools.wraps(test)
    async def probed(*args: Any, **kwargs: Any) -> None:
        probe = LoopLagProbe()
        probe.start()
        await asyncio.sleep(0)  # the body starts in a new loop step, which the probe times
        try:
            await test(*args, **kwargs)
        finally:
            worst = await probe.stop()
        if worst > MAX_LAG_SECONDS:
            limit = f"limit {MAX_LAG_SECONDS * 1e3:g} ms"
            pytest.fail(f"{LAG_FAILURE} for {worst * 1e3:.1f} ms ({limit}) by {probe.culprit}")

    return probed


_DEVICES = ["host", pytest.param("cuda:0", marks=pytest.mark.cuda)]


@pytest.fixture(params=_DEVICES)
def device(request: pytest.FixtureRequest) -> str:
    """Each device: the host, and cuda:0 (marked ``cuda``: skipped where no GPU is usable,
    selected by ``pytest -m cuda``)."""
    param: str = request.param
    return param


@pytest_asyncio.fixture
async def client(device: str) -> AsyncIterator[ac.ComputeClient]:
    """An open client on each device; closed (and checked to close cleanly) after."""
    c = await ac.connect(device)
    yield c
    if not c.closed:
        await c.close()


@pytest_asyncio.fixture
async def host_client() -> AsyncIterator[ac.ComputeClient]:
    """An open client on the host server."""
    c = await ac.connect("host")
    yield c
    if not c.closed:
        await c.close()
