"""asynccube's pytest plugin, run on small suites with pytester: devices, the client
fixture's checks, the cuda marker, the blocked-loop detector, and the README example."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from asynccube._core.runtime.devices import probe_gpus

pytest_plugins = ["pytester"]

README = Path(__file__).parent.parent / "README.md"
PLUGIN = ("-p", "asynccube.pytest_plugin", "-p", "no:cacheprovider", "-p", "no:randomly")
ASYNCIO_INI = """
[pytest]
asyncio_mode = strict
asyncio_default_fixture_loop_scope = function
"""


@pytest.fixture(autouse=True)
def _absolute_pythonpath(monkeypatch: pytest.MonkeyPatch) -> None:
    """The inner runs start elsewhere: a relative PYTHONPATH (src) must not break them."""
    entries = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    absolute = os.pathsep.join(os.path.abspath(e) for e in entries if e)
    monkeypatch.setenv("PYTHONPATH", absolute)


def _run(pytester: pytest.Pytester, source: str, *args: str) -> pytest.RunResult:
    pytester.makeini(ASYNCIO_INI)
    pytester.makepyfile(test_user=source)
    return pytester.runpytest_subprocess(*PLUGIN, *args)


def test_readme_example_passes(pytester: pytest.Pytester) -> None:
    text = README.read_text()
    code = text.split("## Testing your code", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    result = _run(pytester, code, "-rs", "--asynccube-devices", "host")
    anyio_runs = 2 if importlib.util.find_spec("trio") else 1  # asyncio, and trio
    if probe_gpus().usable:
        result.assert_outcomes(passed=2 + anyio_runs)
    else:
        result.assert_outcomes(passed=1 + anyio_runs, skipped=1)
        result.stdout.fnmatch_lines(["*needs a CUDA GPU*"])


def test_devices_default_to_host_and_gpus(pytester: pytest.Pytester) -> None:
    source = "def test_d(asynccube_device):\n    assert asynccube_device\n"
    result = _run(pytester, source, "-v")
    result.stdout.fnmatch_lines(["*test_d?host?*PASSED*", "*test_d?cuda:0?*"])


def test_leaked_bytes_fail_the_test(pytester: pytest.Pytester) -> None:
    source = """
import pytest
KEEP = []

@pytest.mark.asyncio
async def test_leaks(asynccube_client):
    KEEP.append(asynccube_client.create(b"x" * 64))
"""
    result = _run(pytester, source, "--asynccube-devices", "host")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*bytes still in use after the test*"])


def test_unawaited_errors_fail_the_test(pytester: pytest.Pytester) -> None:
    source = """
import asynccube as ac
import pytest

@pytest.mark.asyncio
async def test_forgets(asynccube_client):
    h = asynccube_client.create(b"abcd")
    asynccube_client.write([(h.copy_descriptor((8,), (1,), 1), bytes(8))])
"""
    result = _run(pytester, source, "--asynccube-devices", "host")
    result.assert_outcomes(passed=1, errors=1)


def test_blocked_loop_detector_is_off_by_default(pytester: pytest.Pytester) -> None:
    source = """
import time
import pytest

@pytest.mark.asyncio
async def test_blocks():
    time.sleep(0.05)
"""
    _run(pytester, source).assert_outcomes(passed=1)
    result = pytester.runpytest_subprocess(*PLUGIN, "--asynccube-max-lag-ms", "5")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*the event loop was blocked for*ms (limit 5 ms)*"])


def test_anyio_plugin_runs_the_client_fixture_on_both_backends(
    pytester: pytest.Pytester,
) -> None:
    source = """
import pytest

@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request):
    return request.param

@pytest.mark.anyio
async def test_anyio(asynccube_client, anyio_backend):
    (data,) = await asynccube_client.read([asynccube_client.create(b"ok")])
    assert data == b"ok"
    assert asynccube_client._channel.backend.name == anyio_backend
"""
    result = _run(pytester, source, "-v", "--asynccube-devices", "host")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        ["*test_anyio?asyncio-host?*PASSED*", "*test_anyio?trio-host?*PASSED*"]
    )


def test_blocked_loop_detector_probes_anyio_tests_on_trio(pytester: pytest.Pytester) -> None:
    source = """
import time
import pytest

@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request):
    return request.param

@pytest.mark.anyio
async def test_blocks():
    time.sleep(0.05)

@pytest.mark.anyio
async def test_yields():
    import anyio
    for _ in range(20):
        await anyio.sleep(0.001)
"""
    result = _run(pytester, source, "-v", "--asynccube-max-lag-ms", "20")
    result.assert_outcomes(failed=2, passed=2)
    result.stdout.fnmatch_lines(
        ["*the event loop was blocked for*ms (limit 20 ms) by a step of trio task*"]
    )


def test_a_bad_device_name_stops_the_run(pytester: pytest.Pytester) -> None:
    source = "def test_d(asynccube_device):\n    pass\n"
    result = _run(pytester, source, "--asynccube-devices", "tpu:0")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --asynccube-devices: unknown device 'tpu:0'*"])


_PRELOAD = """
import sys
from asynccube._core.runtime.devices import GpuProbe
from asynccube._core.testing import plugin

usable = sys.argv[1] == "usable"
plugin.probe_gpus = lambda: GpuProbe(usable, "" if usable else "no GPU", ["cuda:0  fake"])
assert "asynccube._core.cuda.server" not in sys.modules
plugin.gpu_probe()
print("asynccube._core.cuda.server" in sys.modules)
"""


@pytest.mark.parametrize(("found", "imported"), [("usable", "True"), ("none", "False")])
def test_a_usable_gpu_has_the_cuda_modules_imported_at_collection(
    found: str, imported: str
) -> None:
    """Where a GPU is usable, the GPU probe (at collection, before any test's loop runs)
    imports the CUDA server's modules: the first GPU test's open does not import them in
    a worker thread holding the GIL under the loop-lag probe. Where none is, nothing."""
    out = subprocess.run(
        [sys.executable, "-c", _PRELOAD, found], capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == [imported]
