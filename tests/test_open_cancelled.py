"""An ``open_client`` cancelled while its CUDA server is built in a worker thread (a
timeout around it, a service shutting down during start-up) leaves nothing behind: the
server built for it is closed, on the job's thread or at the cancel, exactly once,
under asyncio and trio. Without a GPU: the build is a stand-in."""

from __future__ import annotations

import sys
import threading
import time
from types import SimpleNamespace
from typing import Any

import anyio
import pytest

import asynccube as ac
from asynccube._core.channel import backend
from asynccube._core.cuda import server as cuda_server

pytestmark = pytest.mark.anyio


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


class FakeServer:
    """What ``_build`` returns: counts its closes."""

    def __init__(self) -> None:
        self.closed = 0
        self.closed_once = threading.Event()
        self.context = SimpleNamespace(make_current=lambda: None)

    def close(self) -> Any:
        self.closed += 1
        self.closed_once.set()
        return SimpleNamespace(wait=lambda timeout: True, result=lambda: None)


async def test_an_open_cancelled_while_its_server_is_built_closes_that_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started, release, built = threading.Event(), threading.Event(), threading.Event()
    made: list[FakeServer] = []
    opened: list[Any] = []

    def build(index: int, options: dict[str, Any]) -> FakeServer:
        started.set()
        release.wait(10)
        made.append(FakeServer())
        built.set()
        return made[-1]

    monkeypatch.setattr(cuda_server, "_build", build)

    async def opener(scope: anyio.CancelScope) -> None:
        with scope:
            opened.append(await ac.connect("cuda:0"))  # pragma: no cover - cancelled

    scope = anyio.CancelScope()
    async with anyio.create_task_group() as tg:
        tg.start_soon(opener, scope)
        assert await anyio.to_thread.run_sync(started.wait, 10)
        scope.cancel()  # the opener gives up while the thread still builds
    assert opened == [] and made == []
    release.set()
    assert await anyio.to_thread.run_sync(built.wait, 10)
    assert await anyio.to_thread.run_sync(made[0].closed_once.wait, 10)
    await anyio.sleep(0.02)  # a second close would come from the same thread, at once
    assert made[0].closed == 1


@pytest.mark.cuda
async def test_a_cancelled_open_closes_the_real_server_and_the_gpu_serves_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a GPU: the real server built for a cancelled open (its context, pools and
    streams) is closed by the thread that builds it, and the next open is served."""
    started, release, built = threading.Event(), threading.Event(), threading.Event()
    real = cuda_server._build
    made: list[Any] = []

    def build(index: int, options: dict[str, Any]) -> Any:
        started.set()
        release.wait(30)
        made.append(real(index, options))
        built.set()
        return made[-1]

    monkeypatch.setattr(cuda_server, "_build", build)
    scope = anyio.CancelScope()

    async def opener() -> None:
        with scope:
            await ac.connect("cuda:0")  # pragma: no cover - cancelled

    async with anyio.create_task_group() as tg:
        tg.start_soon(opener)
        assert await anyio.to_thread.run_sync(started.wait, 30)
        scope.cancel()
    release.set()
    assert await anyio.to_thread.run_sync(built.wait, 30)
    assert await anyio.to_thread.run_sync(_closed_within, made[0], 30)
    monkeypatch.setattr(cuda_server, "_build", real)
    async with ac.open_client("cuda:0") as client:
        assert await client.read([client.create(b"served")]) == [b"served"]


def _closed_within(server: Any, seconds: float) -> bool:
    """Whether ``server`` was closed within ``seconds`` (its close thread sets it)."""
    end = time.monotonic() + seconds
    while not server.closed:
        if time.monotonic() > end:
            return False
        time.sleep(0.005)
    return True


async def test_an_open_that_is_not_cancelled_keeps_its_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[FakeServer] = []

    def build(index: int, options: dict[str, Any]) -> FakeServer:
        made.append(FakeServer())
        return made[-1]

    monkeypatch.setattr(cuda_server, "_build", build)
    server = await cuda_server.open_cuda_server(0)
    assert server is made[0] and server.closed == 0  # type: ignore[comparison-overlap]


async def test_a_job_that_raises_disposes_of_nothing() -> None:
    disposed: list[Any] = []

    def fail() -> None:
        raise ac.DeviceError("no GPU here")

    with pytest.raises(ac.DeviceError, match="no GPU here"):
        await backend.run_blocking_owned(fail, disposed.append)
    assert disposed == []


def test_a_result_made_before_the_cancel_is_disposed_of_at_the_cancel() -> None:
    """The job ended, its result not yet handed to the caller, when the caller gave up
    (the two threads' order that a test through the loop cannot pin down)."""
    disposed: list[str] = []
    owned = backend._Owned(disposed.append)
    assert owned.run(lambda: "server") == "server"
    owned.abandon()
    assert disposed == ["server"]
    owned.abandon()
    assert disposed == ["server"]  # once


def test_a_result_made_after_the_cancel_is_disposed_of_by_the_job() -> None:
    disposed: list[str] = []
    owned = backend._Owned(disposed.append)
    owned.abandon()
    assert disposed == []
    assert owned.run(lambda: "server") is None
    assert disposed == ["server"]


def test_a_result_the_caller_took_is_never_disposed_of() -> None:
    disposed: list[str] = []
    owned = backend._Owned(disposed.append)
    owned.run(lambda: "server")
    owned.taken()
    owned.abandon()  # a later cancel of the caller: the server is the caller's now
    assert disposed == []


def test_a_dispose_that_fails_at_the_cancel_is_reported_not_raised(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The caller's cancel must go on (a failing dispose raised there would replace
    it): the failure goes to ``sys.unraisablehook``."""
    reported: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", reported.append)

    def dispose(made: str) -> None:
        raise RuntimeError(f"cannot close {made}")

    owned = backend._Owned(dispose)
    owned.run(lambda: "server")
    owned.abandon()
    (report,) = reported
    assert isinstance(report.exc_value, RuntimeError) and "server" in str(report.exc_value)
    assert "cancelled job" in report.err_msg and report.object is dispose


def test_a_dispose_that_fails_on_the_job_thread_is_reported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reported: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", reported.append)

    def dispose(made: str) -> None:
        raise RuntimeError(f"cannot close {made}")

    owned = backend._Owned(dispose)
    owned.abandon()
    assert owned.run(lambda: "server") is None
    (report,) = reported
    assert "cannot close server" in str(report.exc_value)
