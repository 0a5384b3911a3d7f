"""Opening a client under each async library: asyncio (directly or through anyio) runs;
trio, or no event loop at all, fails at once with UnsupportedBackend saying what to do."""

from __future__ import annotations

import anyio
import pytest

import asynccube as ac
from asynccube._core import backend


async def _round_trip() -> bytes:
    async with ac.open_client("host") as client:
        h = client.create(b"abcd")
        (data,) = await client.read([h])
        return data


def test_anyio_asyncio_backend_runs_a_client() -> None:
    assert anyio.run(_round_trip, backend="asyncio") == b"abcd"


def test_trio_is_refused_with_a_typed_error() -> None:
    pytest.importorskip("trio")
    with pytest.raises(ac.UnsupportedBackend, match="under trio") as info:
        anyio.run(_round_trip, backend="trio")
    assert "backend='asyncio'" in str(info.value)
    assert isinstance(info.value, ac.AsyncCubeError)


def test_outside_any_event_loop_is_refused() -> None:
    coro = ac.connect("host")
    with pytest.raises(ac.UnsupportedBackend, match="no"):
        coro.send(None)
    coro.close()


@pytest.mark.asyncio
async def test_asyncio_still_opens_after_a_refusal() -> None:
    assert await _round_trip() == b"abcd"


@pytest.mark.parametrize("sniffio", [True, False], ids=["sniffio", "without-sniffio"])
def test_detection_with_and_without_sniffio(monkeypatch: pytest.MonkeyPatch, sniffio: bool) -> None:
    pytest.importorskip("trio")
    if not sniffio:
        monkeypatch.setattr(backend, "_sniffio", None)
    assert backend.current_library() is None
    assert anyio.run(_library, backend="asyncio") == "asyncio"
    assert anyio.run(_library, backend="trio") == "trio"
    with pytest.raises(ac.UnsupportedBackend, match="under trio"):
        anyio.run(_round_trip, backend="trio")


async def _library() -> str | None:
    return backend.current_library()
