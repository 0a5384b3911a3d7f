"""The pytest plugin's hooks and fixtures (public face: :mod:`asynccube.pytest_plugin`).

* ``asynccube_device``: parametrized over the host and each usable GPU (``cuda:0`` marked
  ``cuda`` and skipped, with the reason, where none is usable), or over the devices
  ``--asynccube-devices host,cuda:1`` names.
* ``asynccube_client``: a client opened on that device on the test's event loop
  (pytest-asyncio, or anyio's plugin for tests that use ``anyio_backend``), closed after
  the test; the test fails if errors were left unawaited (``close()`` raises them) or
  bytes are still in use once the test's handles are gone.
* the marker ``cuda``: skipped with the reason where no GPU is usable.
* a blocked-loop detector: ``--asynccube-max-lag-ms=N`` (or ``ASYNCCUBE_MAX_LAG_MS``, or
  the ini value ``asynccube_max_lag_ms``; off by default) fails an async test (marked
  ``asyncio``, or ``anyio`` on either backend) whose loop was blocked longer than N ms
  by one callback (one task step under trio); tests marked ``allow_loop_lag`` are not
  probed.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import importlib.util
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from ..backend import current_library
from ..client import ComputeClient
from ..devices import GpuProbe, parse_device, probe_gpus
from ..open import connect
from .lagprobe import LoopLagProbe, TrioLagProbe, max_lag_seconds

__all__ = [
    "LAG_FAILURE",
    "asynccube_client",
    "asynccube_device",
    "pytest_addoption",
    "pytest_collection_modifyitems",
    "pytest_configure",
    "pytest_generate_tests",
]

LAG_FAILURE = "the event loop was blocked"
_PROBE_KEY = pytest.StashKey[GpuProbe]()
_LIMIT_KEY = pytest.StashKey["float | None"]()


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--asynccube-devices``, ``--asynccube-max-lag-ms`` and their ini twin."""
    group = parser.getgroup("asynccube")
    group.addoption(
        "--asynccube-devices",
        default=None,
        help="comma-separated devices for asynccube_device (default: host and each usable GPU)",
    )
    group.addoption(
        "--asynccube-max-lag-ms",
        type=float,
        default=None,
        help="fail an async test whose event loop is blocked longer than this (ms)",
    )
    parser.addini(
        "asynccube_max_lag_ms",
        "default of --asynccube-max-lag-ms (ASYNCCUBE_MAX_LAG_MS overrides it)",
        default="",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Register the markers; find the GPUs and the lag limit once."""
    config.addinivalue_line(
        "markers", "cuda: needs an NVIDIA GPU (skipped with a reason elsewhere)"
    )
    config.addinivalue_line(
        "markers", "allow_loop_lag: the test blocks the event loop on purpose (no lag probe)"
    )
    config.stash[_PROBE_KEY] = probe_gpus()
    config.stash[_LIMIT_KEY] = _lag_limit(config)


def _lag_limit(config: pytest.Config) -> float | None:
    """Seconds: the option, else ASYNCCUBE_MAX_LAG_MS, else the ini value, else None."""
    option = config.getoption("asynccube_max_lag_ms")
    if option is not None:
        if not option > 0:
            raise pytest.UsageError("--asynccube-max-lag-ms must be > 0 milliseconds")
        return float(option) / 1e3
    if os.environ.get("ASYNCCUBE_MAX_LAG_MS", "").strip():
        return max_lag_seconds()
    raw = str(config.getini("asynccube_max_lag_ms")).strip()
    if not raw:
        return None
    try:
        ms = float(raw)
    except ValueError:
        ms = -1.0
    if not ms > 0:
        raise pytest.UsageError(f"asynccube_max_lag_ms must be milliseconds > 0, got {raw!r}")
    return ms / 1e3


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize ``asynccube_device`` over the devices (see the module docstring)."""
    if "asynccube_device" not in metafunc.fixturenames:
        return
    config = metafunc.config
    metafunc.parametrize("asynccube_device", _device_params(config), indirect=True)


def _device_params(config: pytest.Config) -> list[Any]:
    named = config.getoption("asynccube_devices")
    if named:
        devices = [d.strip() for d in str(named).split(",") if d.strip()]
        for device in devices:
            parse_device(device)  # a typo fails the run, naming the device
    else:
        probe = config.stash[_PROBE_KEY]
        gpus = [entry.split()[0] for entry in probe.devices] or ["cuda:0"]
        devices = ["host", *gpus]
    return [pytest.param(d, marks=pytest.mark.cuda) if d.startswith("cuda") else d for d in devices]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip ``cuda`` tests where no GPU is usable; probe async tests for loop lag."""
    probe = config.stash[_PROBE_KEY]
    skip_cuda = pytest.mark.skip(reason=f"needs a CUDA GPU: {probe.reason}")
    limit = config.stash[_LIMIT_KEY]
    for item in items:
        if "cuda" in item.keywords and not probe.usable:
            item.add_marker(skip_cuda)
        if limit is None or not isinstance(item, pytest.Function):
            continue
        if item.get_closest_marker("allow_loop_lag"):
            continue
        if item.get_closest_marker("asyncio") or item.get_closest_marker("anyio"):
            item.obj = _with_lag_probe(item.obj, limit)


def _with_lag_probe(
    test: Callable[..., Awaitable[None]], limit: float
) -> Callable[..., Awaitable[None]]:
    """Wrap an async test so that it fails if one callback of its loop runs longer than
    ``limit`` seconds while the test body runs (fixtures run outside the probe)."""

    @functools.wraps(test)
    async def probed(*args: Any, **kwargs: Any) -> None:
        probe: LoopLagProbe | TrioLagProbe
        if current_library() == "trio":
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

    return probed


@pytest.fixture
def asynccube_device(request: pytest.FixtureRequest) -> str:
    """A device string: ``"host"``, ``"cuda:N"`` (see the module docstring)."""
    device: str = getattr(request, "param", "host")
    return device


async def _open_checked(device: str) -> AsyncIterator[ComputeClient]:
    client = await connect(device)
    try:
        yield client
    finally:
        if not client.closed:
            await _check_and_close(client)


async def _check_and_close(client: ComputeClient) -> None:
    """Close (raising errors nobody awaited), failing on bytes still in use."""
    gc.collect()
    await client.sync()
    usage = await client.memory_usage()
    await client.close()
    if usage.bytes_in_use:
        pytest.fail(
            f"asynccube_client: {usage.bytes_in_use} bytes still in use after the test "
            f"({usage.number_allocs} allocations): a handle outlived the test"
        )


@pytest.fixture
def asynccube_client(request: pytest.FixtureRequest, asynccube_device: str) -> ComputeClient:
    """A client on ``asynccube_device``, opened on the test's event loop (anyio's when
    the test uses ``anyio_backend``, else pytest-asyncio's), checked and closed after."""
    if "anyio_backend" in request.fixturenames:
        client: ComputeClient = request.getfixturevalue("_asynccube_client_anyio")
    elif _asynccube_client_asyncio is None:
        pytest.fail(
            "asynccube_client needs an async test runner: install pytest-asyncio (and mark "
            "the test asyncio), or use anyio's plugin (mark it anyio, with anyio_backend)",
            pytrace=False,
        )
    else:
        client = request.getfixturevalue("_asynccube_client_asyncio")
    return client


async def _anyio_client(asynccube_device: str) -> AsyncIterator[ComputeClient]:
    async for client in _open_checked(asynccube_device):
        yield client


_asynccube_client_anyio = pytest.fixture(name="_asynccube_client_anyio")(_anyio_client)


def _asyncio_fixture() -> Any:
    """The pytest-asyncio twin (only where pytest-asyncio is installed)."""
    if importlib.util.find_spec("pytest_asyncio") is None:
        return None
    import pytest_asyncio

    async def _asyncio_client(asynccube_device: str) -> AsyncIterator[ComputeClient]:
        async for client in _open_checked(asynccube_device):
            yield client

    return pytest_asyncio.fixture(name="_asynccube_client_asyncio")(_asyncio_client)


_asynccube_client_asyncio = _asyncio_fixture()
