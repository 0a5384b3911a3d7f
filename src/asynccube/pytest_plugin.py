"""asynccube's pytest plugin, registered through the ``pytest11`` entry point (so it is
active once asynccube is installed; ``-p asynccube.pytest_plugin`` loads it otherwise).

Fixtures: ``asynccube_device`` (the host and each usable GPU, or
``--asynccube-devices``) and ``asynccube_client`` (a client on it, on the test's loop,
closed after; the test fails on errors left unawaited or bytes leaked). The marker
``cuda`` is skipped, with the reason, where no GPU is usable. ``--asynccube-max-lag-ms``
(or ``ASYNCCUBE_MAX_LAG_MS``; off by default) fails asyncio tests that block their event
loop. Works with pytest-asyncio and with anyio's pytest plugin.
"""

from __future__ import annotations

from ._core.testing.plugin import (
    LAG_FAILURE,
    _asynccube_client_anyio,
    _asynccube_client_asyncio,
    asynccube_client,
    asynccube_device,
    pytest_addoption,
    pytest_collection_modifyitems,
    pytest_configure,
    pytest_generate_tests,
)

__all__ = [
    "LAG_FAILURE",
    "asynccube_client",
    "asynccube_device",
    "pytest_addoption",
    "pytest_collection_modifyitems",
    "pytest_configure",
    "pytest_generate_tests",
]

# Registered fixtures the public ones delegate to (one per async test runner).
_FIXTURES = (_asynccube_client_anyio, _asynccube_client_asyncio)
