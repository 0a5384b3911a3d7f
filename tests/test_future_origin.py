"""Where a client future was asked for (``awaitable.new_future``): the compiled walk
(``_native_future.c``) and its pure-Python twin name the same call and the same line,
the last asynccube frame and the first frame outside it, whatever lies between."""

from __future__ import annotations

import _thread
import asyncio
import importlib
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

import pytest

import asynccube as ac
from asynccube._core.channel import awaitable
from asynccube._core.channel.awaitable import ClientFuture
from asynccube._core.extensions import no_extensions

Maker = Callable[[type[Any], Any, Any], Any]


def _native() -> Maker:
    if no_extensions():
        pytest.skip("ASYNCCUBE_NO_EXTENSIONS is set: the twin alone")
    try:
        module = importlib.import_module("asynccube._core.channel._native_future")
    except ImportError as exc:  # pragma: no cover - CI builds it
        pytest.skip(f"the compiled new_future is not built: {exc}")
    return module.new_future  # type: ignore[no-any-return]


@pytest.fixture(params=["native", "python"])
def make(request: pytest.FixtureRequest) -> Maker:
    return _native() if request.param == "native" else awaitable.python_new_future


def _ours(name: str, body: str) -> Callable[..., Any]:
    """A function whose module is asynccube's (``asynccube.<something>``), as every
    frame of the library is to the walk."""
    scope: dict[str, Any] = {"__name__": "asynccube.fake_layer"}
    code = compile(body, f"<asynccube fake {name}>", "exec")
    exec(code, scope)
    return scope[name]  # type: ignore[no-any-return]


HELD = object()


def test_called_from_user_code_names_that_line(make: Maker) -> None:
    loop = asyncio.new_event_loop()
    try:
        fut = make(ClientFuture, loop, HELD)
        line = sys._getframe().f_lineno - 1
        assert isinstance(fut, ClientFuture) and fut.get_loop() is loop
        assert fut._ac_from == (HELD, "a call", __file__, line)
        fut._ac_seen = True  # not a forgotten await
    finally:
        loop.close()


def test_asynccube_frames_are_skipped_and_the_outermost_names_the_call(make: Maker) -> None:
    inner = _ours("inner", "def inner(make, cls, loop, held):\n    return make(cls, loop, held)")
    outer = _ours(
        "read", "def read(inner, make, cls, loop, held):\n    return inner(make, cls, loop, held)"
    )
    loop = asyncio.new_event_loop()
    try:
        fut = outer(inner, make, ClientFuture, loop, HELD)
        line = sys._getframe().f_lineno - 1
        assert fut._ac_from == (HELD, "read", __file__, line)
        fut._ac_seen = True
    finally:
        loop.close()


def test_a_thread_with_only_asynccube_frames_names_no_line(make: Maker) -> None:
    run = _ours(
        "job",
        "def job(make, cls, loop, held, out, done):\n"
        "    out.append(make(cls, loop, held))\n"
        "    done.set()",
    )
    loop = asyncio.new_event_loop()
    out: list[Any] = []
    done = threading.Event()
    try:
        _thread.start_new_thread(run, (make, ClientFuture, loop, HELD, out, done))
        assert done.wait(10)
        assert out[0]._ac_from == (HELD, "job", "?", 0)
        out[0]._ac_seen = True
    finally:
        loop.close()


def test_a_bad_call_is_a_type_error() -> None:
    make = _native()
    with pytest.raises(TypeError, match="takes 3 arguments"):
        make(ClientFuture)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        make(int, None, HELD)  # int(loop=None): the class refuses it, nothing leaks


@pytest.mark.asyncio
async def test_a_client_read_and_sync_name_the_users_line(
    host_client: ac.ComputeClient,
) -> None:
    h = host_client.create(b"origin")
    read = host_client.read([h])
    line = sys._getframe().f_lineno - 1
    assert read._ac_from[1:] == ("read", __file__, line)  # type: ignore[attr-defined]
    assert await read == [b"origin"]
    sync = host_client.sync()
    line = sys._getframe().f_lineno - 1
    assert sync._ac_from[1:] == ("sync", __file__, line)  # type: ignore[attr-defined]
    await sync


def test_the_compiled_one_is_in_use_where_built() -> None:
    if no_extensions():
        assert awaitable.new_future is awaitable.python_new_future
    elif awaitable._NATIVE is not None:
        assert awaitable.new_future is awaitable._NATIVE.new_future
    env = {**os.environ, "ASYNCCUBE_NO_EXTENSIONS": "1"}
    info = subprocess.run(
        [sys.executable, "-m", "asynccube", "info"], env=env, capture_output=True, text=True
    )
    assert "future maker: pure Python" in info.stdout


def test_importing_the_compiled_module_again_keeps_its_state() -> None:
    _native()  # skips where it is not built
    name = "asynccube._core.channel._native_future"
    first = sys.modules.pop(name)
    try:
        again = importlib.import_module(name)
        assert again.ours is first.ours  # one cache, not a second one leaked
        loop = asyncio.new_event_loop()
        try:
            fut = again.new_future(ClientFuture, loop, HELD)
            assert fut._ac_from[1:3] == ("a call", __file__)
            fut._ac_seen = True
        finally:
            loop.close()
    finally:
        sys.modules[name] = first
