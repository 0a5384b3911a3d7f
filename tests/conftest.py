"""Project-wide test settings. Devices, clients, the ``cuda`` marker and the loop-lag
probe come from asynccube's own pytest plugin (``-p asynccube.pytest_plugin`` in
pyproject's addopts; ``asynccube_max_lag_ms = "5"`` turns the probe on for every async
test, ``ASYNCCUBE_MAX_LAG_MS`` overrides it; ``asynccube_gpu_markers = ["cuda"]`` makes
the suite's ``cuda`` marker asynccube's GPU requirement, the way a user's project opts
in)."""

from __future__ import annotations

import gc
import importlib.util
import os
import shutil
import sys
import tempfile
import warnings
from collections.abc import AsyncIterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy.random  # imported lazily otherwise, inside a test step (8.6 ms)
import numpy.testing  # noqa: F401 - imported lazily otherwise, inside a test step
import pytest
import pytest_asyncio

import asynccube as ac
import asynccube._core.server.settings  # imported lazily otherwise, by a first connect
from asynccube._core.cuda.native import _twin
from asynccube.pytest_plugin import LAG_FAILURE

# Imported lazily otherwise, inside the first trio test's first step: with four host
# connects, 5.8-6.7 ms (test_collectives.py's first trio test, run alone, failed its
# 5 ms probe every time).
if importlib.util.find_spec("trio") is not None:
    import asynccube._core.channel.trio_backend
    import asynccube._core.channel.trio_loop

with warnings.catch_warnings():
    # trio's hypothesis hook warns when hypothesis is first imported (late, at session
    # end, under "warnings are errors" otherwise); it is harmless: import it here.
    warnings.simplefilter("ignore")
    import hypothesis  # noqa: F401


def pytest_configure(config: pytest.Config) -> None:
    # Worker threads holding the GIL for the default 5 ms would read as a blocked loop.
    sys.setswitchinterval(0.0002)
    # A test whose only failure is one loop-lag spike is run once more: contention for
    # the GIL on a loaded two-core machine can stretch a callback past 5 ms now and then,
    # while code that really blocks the loop fails every run. Nothing else is retried.
    if config.pluginmanager.hasplugin("rerunfailures") and not config.option.reruns:
        config.option.reruns = 1
        config.option.only_rerun = [LAG_FAILURE]


def pytest_unconfigure(config: pytest.Config) -> None:
    # ray's session folders of this process (tests/test_ray_pipeline.py: ray names them
    # after the driver's pid) are removed: a run leaves nothing in the temp dir.
    root = Path(os.environ.get("RAY_TMPDIR") or tempfile.gettempdir()) / "ray"
    ours = list(root.glob(f"session_*_{os.getpid()}"))
    for session in ours:
        shutil.rmtree(session, ignore_errors=True)
    latest = root / "session_latest"
    if ours and latest.is_symlink() and not latest.exists():
        latest.unlink()
    if ours and root.is_dir() and not any(root.iterdir()):
        root.rmdir()


def pytest_collection_finish(session: pytest.Session) -> None:
    # The heap after collection (modules, hypothesis, numpy, the CUDA bindings) lives as
    # long as the run: frozen once, a full collection (the client fixture's leak check
    # runs one per test) takes ~1 ms instead of ~40 ms, which halves the suite's time.
    # Not for the lag probe's sake: the probe leaves collector pauses out, and no longer
    # touches the collector itself.
    gc.collect()
    gc.freeze()


@pytest.fixture
def device(asynccube_device: str) -> str:
    """Each device (the plugin's ``asynccube_device``): the host, and cuda:0 (marked
    ``cuda``: skipped where no GPU is usable, selected by ``pytest -m cuda``)."""
    return asynccube_device


@pytest.fixture
def client(asynccube_client: ac.ComputeClient) -> ac.ComputeClient:
    """An open client on each device (the plugin's ``asynccube_client``): closed after,
    and the test fails on errors nobody awaited or bytes still in use."""
    return asynccube_client


@pytest_asyncio.fixture
async def host_client() -> AsyncIterator[ac.ComputeClient]:
    """An open client on the host server."""
    c = await ac.connect("host")
    yield c
    if not c.closed:
        await c.close()


def native_module() -> ModuleType | None:
    """The compiled hot path, or None where it is not built."""
    try:
        return importlib.import_module("asynccube._core.cuda.native._native")
    except ImportError:
        return None


@pytest.fixture(params=["native", "python"])
def hot(request: pytest.FixtureRequest) -> Any:
    """Each variant of the hot path: the compiled module (skipped if not built), the twin."""
    if request.param == "python":
        return _twin
    native = native_module()
    if native is None:
        pytest.skip("the compiled extension is not built here (pip install . builds it)")
    return native
