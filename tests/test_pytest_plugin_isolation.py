"""asynccube's pytest plugin changes no one else's tests (issue 29), run on small suites
with pytester: only tests asking for asynccube's GPU requirement are skipped; the lag
probe leaves the interpreter as found, probes only coroutine tests it can run, and stays
strict; the client follows the test's loop; loading the plugin imports nothing heavy;
bad settings stop only runs that use asynccube, with one line saying what to set."""

from __future__ import annotations

import importlib.metadata
import os

import pytest

from asynccube._core.runtime.devices import probe_gpus

pytest_plugins = ["pytester"]

PLUGIN = ("-p", "asynccube.pytest_plugin", "-p", "no:cacheprovider", "-p", "no:randomly")
# pytest-asyncio's own warning for a sync test under a module's asyncio marker.
SYNC_WARNING = ("-W", "ignore:The test <Function:pytest.PytestWarning")
INI = """
[pytest]
asyncio_mode = strict
asyncio_default_fixture_loop_scope = function
filterwarnings = error
"""
NO_GPU = not probe_gpus().usable


@pytest.fixture(autouse=True)
def _absolute_pythonpath(monkeypatch: pytest.MonkeyPatch) -> None:
    """The inner runs start elsewhere: a relative PYTHONPATH (src) must not break them."""
    entries = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    absolute = os.pathsep.join(os.path.abspath(e) for e in entries if e)
    monkeypatch.setenv("PYTHONPATH", absolute)
    monkeypatch.delenv("ASYNCCUBE_MAX_LAG_MS", raising=False)


def _run(pytester: pytest.Pytester, source: str, *args: str, ini: str = "") -> pytest.RunResult:
    pytester.makeini(INI + ini)
    pytester.makepyfile(test_user=source)
    return pytester.runpytest_subprocess(*PLUGIN, *args)


def test_parametrize_ids_and_folders_named_cuda_are_not_skipped(
    pytester: pytest.Pytester,
) -> None:
    pytester.mkdir("cuda").joinpath("test_in_folder.py").write_text("def test_f():\n    pass\n")
    source = """
import pytest

@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_p(device):
    pass
"""
    _run(pytester, source).assert_outcomes(passed=3)


@pytest.mark.skipif(not NO_GPU, reason="asynccube's GPU check would not skip here anyway")
def test_a_projects_own_cuda_marker_is_left_alone(pytester: pytest.Pytester) -> None:
    source = """
import pytest

@pytest.mark.cuda
def test_mine():
    pass
"""
    result = _run(pytester, source, ini="markers =\n    cuda: our own GPU tests\n")
    result.assert_outcomes(passed=1)


def test_opted_in_markers_mean_asynccubes_gpu_requirement(pytester: pytest.Pytester) -> None:
    source = """
import pytest

@pytest.mark.cuda
def test_mine():
    pass

@pytest.mark.asynccube_cuda
def test_owned():
    pass

def test_dev(asynccube_device):
    pass
"""
    result = _run(pytester, source, "-rs", "-m", "cuda", ini="asynccube_gpu_markers = cuda\n")
    if NO_GPU:  # test_mine and test_dev[cuda:0] are selected, and skipped
        result.assert_outcomes(skipped=2, deselected=2)
        result.stdout.fnmatch_lines(["*needs a CUDA GPU*"])
    else:
        result.assert_outcomes(passed=2 + len(probe_gpus().devices) - 1, deselected=2)


def test_the_probe_leaves_the_interpreter_as_found(pytester: pytest.Pytester) -> None:
    source = """
import asyncio, gc, sys, warnings
import pytest

STATE = {}

def _now():
    return (gc.isenabled(), gc.get_freeze_count(), gc.get_threshold(), list(gc.callbacks),
            list(warnings.filters), type(asyncio.get_event_loop_policy()), sys.getswitchinterval())

def test_before():
    STATE["before"] = _now()

@pytest.mark.asyncio
async def test_probed():
    await asyncio.sleep(0)

@pytest.mark.anyio
async def test_probed_anyio():
    pass

def test_after():
    assert _now() == STATE["before"]

def test_a_dropped_cycle_is_collected():
    import weakref
    class Node: pass
    a = Node(); a.self = a
    ref = weakref.ref(a)
    del a
    gc.collect()
    assert ref() is None
"""
    result = _run(pytester, source, "-p", "no:randomly", "--asynccube-max-lag-ms", "1000")
    result.assert_outcomes(passed=4 + (2 if importlib.util.find_spec("trio") else 1))


def test_sync_and_hypothesis_tests_under_async_markers_are_left_alone(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_anyio_mod="""
import pytest
from hypothesis import given, settings, strategies as st

pytestmark = pytest.mark.anyio

def test_sync():
    pass

@settings(max_examples=3)
@given(st.integers())
async def test_given(x):
    pass
"""
    )
    source = """
import pytest
from hypothesis import given, settings, strategies as st

pytestmark = pytest.mark.asyncio

def test_sync():
    pass

@settings(max_examples=3)
@given(st.integers())
async def test_given(x):
    pass
"""
    result = _run(pytester, source, "-p", "anyio", "--asynccube-max-lag-ms", "1000", *SYNC_WARNING)
    anyio_runs = 2 if importlib.util.find_spec("trio") else 1
    result.assert_outcomes(passed=2 + 1 + anyio_runs)


def test_a_test_that_blocks_its_loop_still_fails(pytester: pytest.Pytester) -> None:
    source = """
import time
import pytest

pytestmark = pytest.mark.asyncio

async def test_blocks():
    time.sleep(0.03)

async def test_busy():
    end = time.perf_counter() + 0.03
    while time.perf_counter() < end:
        pass

def test_sync_sleeps():
    time.sleep(0.03)
"""
    result = _run(pytester, source, "--asynccube-max-lag-ms", "10", *SYNC_WARNING)
    result.assert_outcomes(failed=2, passed=1)
    result.stdout.fnmatch_lines(["*the event loop was blocked for*ms (limit 10 ms)*test_busy*"])


def test_anyio_auto_mode_is_probed(pytester: pytest.Pytester) -> None:
    source = """
import time
import pytest

@pytest.fixture
def anyio_backend():
    return "asyncio"

async def test_blocks():
    time.sleep(0.03)
"""
    ini = "anyio_mode = auto\n"
    result = _run(pytester, source, "-p", "anyio", "--asynccube-max-lag-ms", "10", ini=ini)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*the event loop was blocked for*"])


def test_the_client_follows_the_tests_loop_scope(pytester: pytest.Pytester) -> None:
    source = """
import asyncio
import pytest

@pytest.mark.asyncio(loop_scope="module")
async def test_module_loop(asynccube_client):
    assert await asynccube_client.read([asynccube_client.create(b"m")]) == [b"m"]

@pytest.mark.asyncio(loop_scope="module")
async def test_same_module_loop(asynccube_client):
    assert await asynccube_client.read([asynccube_client.create(b"n")]) == [b"n"]

@pytest.mark.asyncio(loop_scope="class")
class TestInClass:
    async def test_class_loop(self, asynccube_client):
        assert await asynccube_client.read([asynccube_client.create(b"c")]) == [b"c"]

@pytest.mark.asyncio(loop_scope="session")
async def test_session_loop(asynccube_client):
    await asynccube_client.sync()
"""
    _run(pytester, source, "--asynccube-devices", "host").assert_outcomes(passed=4)


def test_fixture_failures_say_what_to_do(pytester: pytest.Pytester) -> None:
    source = """
import pytest

def test_sync(asynccube_client):
    pass

async def test_unmarked(asynccube_client):
    pass
"""
    result = _run(pytester, source, "--asynccube-devices", "host", "-W", "ignore")
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(
        [
            "*asynccube_client: the test is not async: make it `async def`*",
            "*asynccube_client: no async test runner runs the test: mark it*",
        ]
    )


def test_pytest_asyncio_disabled_is_a_fixture_failure_naming_the_fix(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(
        test_user="""
import pytest

@pytest.mark.asyncio
async def test_marked(asynccube_client):
    pass
"""
    )
    result = pytester.runpytest_subprocess(
        *PLUGIN, "-p", "no:asyncio", "-W", "ignore", "--asynccube-devices", "host"
    )
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*pytest-asyncio is not active*-p no:asyncio*"])


def test_explicit_loading_with_warnings_as_errors(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    source = """
import pytest

@pytest.mark.asyncio
async def test_marked(asynccube_client):
    await asynccube_client.sync()
"""
    result = _run(pytester, source, "-p", "asyncio", "--asynccube-devices", "host")
    result.assert_outcomes(passed=1)


def test_a_bad_limit_stops_only_runs_that_use_asynccube(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ASYNCCUBE_MAX_LAG_MS", "fast")
    result = _run(pytester, "def test_plain():\n    pass\n")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["asynccube: probe off: ASYNCCUBE_MAX_LAG_MS='fast'*"])
    pytester.makepyfile(test_user="def test_d(asynccube_device):\n    pass\n")
    result = pytester.runpytest_subprocess(*PLUGIN)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["ERROR: ASYNCCUBE_MAX_LAG_MS='fast' is not a number of milliseconds > 0: set it*"]
    )


@pytest.mark.parametrize(
    ("args", "ini", "says"),
    [
        (("--asynccube-max-lag-ms", "0"), "", "ERROR: --asynccube-max-lag-ms 0: set it to*"),
        ((), "asynccube_max_lag_ms = x\n", "ERROR: asynccube_max_lag_ms = 'x' in the ini*"),
        ((), "asynccube_gpu_markers = a-b\n", "ERROR: asynccube_gpu_markers: 'a-b'*"),
    ],
)
def test_a_bad_setting_of_the_project_is_a_usage_error(
    pytester: pytest.Pytester, args: tuple[str, ...], ini: str, says: str
) -> None:
    result = _run(pytester, "def test_plain():\n    pass\n", *args, ini=ini)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([says])


def _entry_point_installed() -> bool:
    eps = importlib.metadata.entry_points(group="pytest11")
    return any(ep.name == "asynccube.pytest_plugin" for ep in eps)


@pytest.mark.skipif(not _entry_point_installed(), reason="asynccube is not installed here")
def test_loading_the_plugin_imports_nothing_heavy(pytester: pytest.Pytester) -> None:
    pytester.makeini(INI)
    pytester.makepyfile(
        test_user="""
import sys

def test_nothing_heavy(request):
    assert request.config.pluginmanager.has_plugin("asynccube.pytest_plugin")
    heavy = [m for m in sys.modules if m.split(".")[0] in ("asynccube", "numpy", "cuda")]
    assert heavy == []
"""
    )
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)
