"""asynccube's pytest plugin (public face of :mod:`_asynccube_pytest.plugin`, where its
hooks and fixtures live: that module imports only the standard library and pytest, so
the entry point ``pytest11`` ``asynccube.pytest_plugin`` loads it, not this one, into
every pytest run of an environment where asynccube is installed).

Fixtures ``asynccube_device`` and ``asynccube_client``; the marker ``asynccube_cuda``
(and those the ini value ``asynccube_gpu_markers`` names) skipped where no GPU is usable;
a loop-lag probe, off unless ``--asynccube-max-lag-ms``, ``ASYNCCUBE_MAX_LAG_MS`` or the
ini value ``asynccube_max_lag_ms`` sets a limit. ``-p no:asynccube.pytest_plugin`` turns
the plugin off; ``-p asynccube.pytest_plugin`` loads it where autoloading is off. See the
README's "Testing your code".
"""

from __future__ import annotations

from _asynccube_pytest.plugin import (
    LAG_FAILURE,
    _asynccube_client_anyio,
    asynccube_client,
    asynccube_device,
    pytest_addoption,
    pytest_collection_modifyitems,
    pytest_configure,
    pytest_generate_tests,
    pytest_report_header,
)

__all__ = [
    "LAG_FAILURE",
    "asynccube_client",
    "asynccube_device",
    "pytest_addoption",
    "pytest_collection_modifyitems",
    "pytest_configure",
    "pytest_generate_tests",
    "pytest_report_header",
]

# A registered fixture the public one delegates to (anyio's; pytest-asyncio's are
# registered at configure time, where pytest-asyncio is loaded).
_FIXTURES = (_asynccube_client_anyio,)
