"""asynccube's pytest plugin: hooks and fixtures (public face:
:mod:`asynccube.pytest_plugin`; what it does to a run: the README's "Testing your code").

* ``asynccube_device``: parametrized over the host and each usable GPU, or over the
  devices ``--asynccube-devices host,cuda:1`` names; its GPU cases carry the marker
  ``asynccube_cuda`` (and each marker ``asynccube_gpu_markers`` names).
* ``asynccube_client``: a client on that device, opened on the test's own event loop
  (pytest-asyncio's, in the test's loop scope, or anyio's, on the test's backend),
  checked and closed after the test.
* GPU tests: a test marked ``asynccube_cuda``, or with a marker the ini value
  ``asynccube_gpu_markers`` names (a project's own ``cuda``, opted in), is skipped with
  the reason where asynccube finds no usable GPU. Other markers, parametrize ids and
  folder names are not looked at.
* the loop-lag probe (off unless ``--asynccube-max-lag-ms``, ``ASYNCCUBE_MAX_LAG_MS`` or
  the ini value ``asynccube_max_lag_ms`` sets a limit): see :mod:`.probing`.

Importing this module imports only the standard library and pytest (not even asyncio:
the probe is imported where it is on).
"""

from __future__ import annotations

import importlib
import inspect
import types
from collections.abc import AsyncIterator
from typing import Any

import pytest

from .settings import GPU_MARKER, LAG_FAILURE, Settings, loop_scope_of, read_settings

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

_SETTINGS = pytest.StashKey[Settings]()
_FIXTURES = ("asynccube_client", "asynccube_device")
_LOOP_SCOPES = ("function", "class", "module", "package", "session")
_HEAVY = "asynccube._core.testing.plugin"


def _heavy() -> Any:
    """The half of the plugin that needs asynccube (imported on first use)."""
    return importlib.import_module(_HEAVY)


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--asynccube-devices``, ``--asynccube-max-lag-ms`` and the ini values."""
    group = parser.getgroup("asynccube")
    group.addoption(
        "--asynccube-devices",
        default=None,
        help="comma-separated devices for asynccube_device (default: host and each usable GPU)",
    )
    group.addoption(
        "--asynccube-max-lag-ms",
        default=None,
        help="fail an async test whose event loop is blocked longer than this (ms)",
    )
    parser.addini(
        "asynccube_max_lag_ms",
        "default of --asynccube-max-lag-ms (ASYNCCUBE_MAX_LAG_MS overrides it)",
        default="",
    )
    parser.addini(
        "asynccube_gpu_markers",
        "markers that mean 'needs a GPU asynccube can use' (skipped where none is)",
        type="linelist",
        default=[],
    )


def pytest_configure(config: pytest.Config) -> None:
    """Register asynccube's markers; read the settings; give pytest-asyncio the client
    fixture, one per loop scope (pytest-asyncio is imported only where pytest has
    loaded it already)."""
    settings = read_settings(config)
    config.stash[_SETTINGS] = settings
    if config.getoption("asynccube_devices"):  # a typo stops the run, naming the device
        _heavy().device_list(config.getoption("asynccube_devices"))
    config.addinivalue_line(
        "markers", f"{GPU_MARKER}: needs a GPU asynccube can use (skipped with a reason elsewhere)"
    )
    for name in settings.gpu_markers[1:]:
        config.addinivalue_line(
            "markers", f"{name}: needs a GPU asynccube can use (asynccube_gpu_markers)"
        )
    config.addinivalue_line(
        "markers", "allow_loop_lag: the test blocks the event loop on purpose (no lag probe)"
    )
    if config.pluginmanager.hasplugin("asyncio"):
        config.pluginmanager.register(_asyncio_fixtures(), "asynccube-asyncio-fixtures")


def pytest_report_header(config: pytest.Config) -> str | None:
    """Say when ``ASYNCCUBE_MAX_LAG_MS`` was ignored (a run that does not use asynccube)."""
    error = config.stash[_SETTINGS].limit_error
    return f"asynccube: probe off: {error}" if error else None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize ``asynccube_device`` over the devices (see the module docstring)."""
    if "asynccube_device" not in metafunc.fixturenames:
        return
    config = metafunc.config
    gpu_marks = [getattr(pytest.mark, n) for n in config.stash[_SETTINGS].gpu_markers]
    devices = _heavy().device_list(config.getoption("asynccube_devices"))
    params = [pytest.param(d, marks=gpu_marks) if d.startswith("cuda") else d for d in devices]
    metafunc.parametrize("asynccube_device", params, indirect=True)


def _uses_asynccube(item: pytest.Item, markers: tuple[str, ...]) -> bool:
    names = getattr(item, "fixturenames", ())
    return any(f in names for f in _FIXTURES) or any(item.get_closest_marker(m) for m in markers)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip GPU-marked tests where no GPU is usable; probe async tests for loop lag."""
    settings = config.stash[_SETTINGS]
    if settings.limit_error and any(_uses_asynccube(i, settings.gpu_markers) for i in items):
        raise pytest.UsageError(settings.limit_error)
    skip: pytest.MarkDecorator | None = None
    for item in items:
        if any(item.get_closest_marker(m) for m in settings.gpu_markers):
            if skip is None:
                probe = _heavy().gpu_probe()
                skip = pytest.mark.skip(reason=f"needs a CUDA GPU: {probe.reason}")
                if probe.usable:
                    break
            item.add_marker(skip)
    if settings.limit is None:
        return
    from .probing import is_probed, with_lag_probe  # (asyncio: only where the probe is on)

    for item in items:
        if is_probed(item):
            assert isinstance(item, pytest.Function)
            item.obj = with_lag_probe(item.obj, settings.limit)


@pytest.fixture
def asynccube_device(request: pytest.FixtureRequest) -> str:
    """A device string: ``"host"``, ``"cuda:N"`` (see the module docstring)."""
    device: str = getattr(request, "param", "host")
    return device


@pytest.fixture
def asynccube_client(request: pytest.FixtureRequest, asynccube_device: str) -> Any:
    """A client on ``asynccube_device``, opened on the test's event loop (anyio's when
    the test runs under anyio's plugin, else pytest-asyncio's, in the test's loop
    scope), checked and closed after."""
    return request.getfixturevalue(_client_fixture(request))


def _client_fixture(request: pytest.FixtureRequest) -> str:
    """The fixture that opens the client on the test's loop, or a failure saying what
    to do."""
    function = request.function
    inner = getattr(getattr(function, "hypothesis", None), "inner_test", function)
    if not inspect.iscoroutinefunction(inner):
        _fail("the test is not async: make it `async def` and mark it asyncio or anyio")
    if "anyio_backend" in request.fixturenames:
        return "_asynccube_client_anyio"
    marker = request.node.get_closest_marker("asyncio")
    if marker is None:
        _fail(
            "no async test runner runs the test: mark it @pytest.mark.asyncio "
            "(pytest-asyncio) or @pytest.mark.anyio (anyio's plugin)"
        )
    if not request.config.pluginmanager.hasplugin("asyncio"):
        _fail(
            "the test is marked asyncio but pytest-asyncio is not active (not installed, "
            "or -p no:asyncio): install/enable it, or mark the test anyio instead"
        )
    return f"_asynccube_client_asyncio_{loop_scope_of(request.config, marker)}"


def _fail(what: str) -> None:
    pytest.fail(f"asynccube_client: {what}", pytrace=False)


def _client_opener() -> Any:
    """A new fixture function (pytest-asyncio marks the function object it decorates)."""

    async def client(asynccube_device: str) -> AsyncIterator[Any]:
        async for opened in _heavy().open_checked(asynccube_device):
            yield opened

    return client


_asynccube_client_anyio = pytest.fixture(name="_asynccube_client_anyio")(_client_opener())


def _asyncio_fixtures() -> types.ModuleType:
    """The client fixture for pytest-asyncio, once per loop scope (a function-scoped
    fixture on a wider loop: each test gets its own client, on the loop it runs on)."""
    import pytest_asyncio

    holder = types.ModuleType("asynccube-asyncio-fixtures")
    for scope in _LOOP_SCOPES:
        name = f"_asynccube_client_asyncio_{scope}"
        fixture = pytest_asyncio.fixture(name=name, loop_scope=scope)  # type: ignore[call-overload]
        setattr(holder, name, fixture(_client_opener()))
    return holder
