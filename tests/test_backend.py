"""Opening a client under each async library: asyncio (directly or through anyio) and
trio run; no event loop at all, or another library, fails at once with
UnsupportedBackend saying what to do."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import anyio
import pytest

import asynccube as ac
from asynccube._core.channel import backend


async def _round_trip() -> bytes:
    async with ac.open_client("host") as client:
        h = client.create(b"abcd")
        (data,) = await client.read([h])
        return data


def test_anyio_asyncio_backend_runs_a_client() -> None:
    assert anyio.run(_round_trip, backend="asyncio") == b"abcd"


def test_anyio_trio_backend_runs_a_client() -> None:
    # The repro: this died with "RuntimeError: no running event loop".
    pytest.importorskip("trio")
    assert anyio.run(_round_trip, backend="trio") == b"abcd"


def test_trio_run_runs_a_client() -> None:
    trio = pytest.importorskip("trio")
    assert trio.run(_round_trip) == b"abcd"


def test_outside_any_event_loop_is_refused() -> None:
    coro = ac.connect("host")
    with pytest.raises(ac.UnsupportedBackend, match="no") as info:
        coro.send(None)
    coro.close()
    assert "asyncio" in str(info.value) and "trio" in str(info.value)
    assert isinstance(info.value, ac.AsyncCubeError)


def test_another_library_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backend, "current_library", lambda: "curio")
    with pytest.raises(ac.UnsupportedBackend, match="under curio") as info:
        backend.current_backend("open_client()")
    assert "backend='trio'" in str(info.value)


def test_backends_alternate_in_one_thread() -> None:
    pytest.importorskip("trio")
    for name in ("trio", "asyncio", "trio", "asyncio"):
        assert anyio.run(_round_trip, backend=name) == b"abcd"


@pytest.mark.parametrize("sniffio", [True, False], ids=["sniffio", "without-sniffio"])
def test_detection_with_and_without_sniffio(monkeypatch: pytest.MonkeyPatch, sniffio: bool) -> None:
    pytest.importorskip("trio")
    if not sniffio:
        monkeypatch.setattr(backend, "_sniffio", None)
    assert backend.current_library() is None
    assert anyio.run(_library, backend="asyncio") == ("asyncio", "asyncio")
    assert anyio.run(_library, backend="trio") == ("trio", "trio")
    assert anyio.run(_round_trip, backend="trio") == b"abcd"


async def _library() -> tuple[str | None, str]:
    return backend.current_library(), backend.current_backend("test").name


def test_trio_stays_optional(monkeypatch: pytest.MonkeyPatch) -> None:
    # Importing asynccube and running it under asyncio never imports trio.
    monkeypatch.setitem(sys.modules, "trio", None)  # any import of trio would fail
    for name in [m for m in sys.modules if m.startswith("asynccube._core.channel.trio")]:
        monkeypatch.delitem(sys.modules, name)
    assert anyio.run(_round_trip, backend="asyncio") == b"abcd"
    assert "asynccube._core.channel.trio_loop" not in sys.modules


def test_backend_of_an_asyncio_loop_is_asyncio() -> None:
    loop = SimpleNamespace()
    chosen = backend.backend_of(loop)  # type: ignore[arg-type]
    assert chosen.name == "asyncio" and chosen.loop is loop
