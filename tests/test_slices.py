"""The slice token's two variants (compiled ``_native_slices.c`` and the pure-Python twin
``PySliceHandle``) behave alike: construction, attributes, weak references, reference
counts, and the release of the slice id when the last reference is gone."""

from __future__ import annotations

import gc
import importlib
import os
import subprocess
import sys
import weakref
from typing import Any

import pytest

from asynccube._core.values import slices
from asynccube._core.values.slices import PySliceHandle, ReleaseQueue


@pytest.fixture(params=["native", "python"])
def token(request: pytest.FixtureRequest) -> Any:
    """Each variant of the slice token: compiled (skipped if not built), the twin."""
    if request.param == "python":
        return PySliceHandle
    try:
        return importlib.import_module("asynccube._core.values._native_slices").SliceHandle
    except ImportError:
        pytest.skip("the compiled extension is not built here (pip install . builds it)")


def test_the_choice_follows_the_environment() -> None:
    code = "from asynccube._core.values import slices as s; print(s.TOKEN, s.SliceHandle.__name__)"
    env = {**os.environ, "ASYNCCUBE_NO_EXTENSIONS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["python", "PySliceHandle"]
    info = subprocess.run(
        [sys.executable, "-m", "asynccube", "info"], env=env, capture_output=True, text=True
    )
    assert "slice token: pure Python" in info.stdout
    assert slices.TOKEN in ("native", "python")
    assert (slices.SliceHandle is PySliceHandle) == (slices.TOKEN == "python")


def test_release_on_last_reference(token: Any) -> None:
    q = ReleaseQueue(7)
    t = token(3, q)
    other = t
    assert (t.id, t.queue) == (3, q)
    del t
    assert q.drain() == []
    del other
    assert q.drain() == [3]


def test_keywords_and_bad_calls(token: Any) -> None:
    q = ReleaseQueue(1)
    t = token(slice_id=5, queue=q)
    assert t.id == 5
    del t
    assert q.drain() == [5]
    with pytest.raises(TypeError):
        token(1)
    with pytest.raises(TypeError):
        token(1, q, 2)
    with pytest.raises(TypeError):
        token(1, queue=q, owner=2)
    assert q.drain() == []  # nothing was made, so nothing released


def test_weak_reference_dies_with_the_token(token: Any) -> None:
    q = ReleaseQueue(1)
    t = token(9, q)
    ref = weakref.ref(t)
    assert ref() is t
    del t
    assert ref() is None
    assert q.drain() == [9]


def test_refcount_counts_every_holder(token: Any) -> None:
    q = ReleaseQueue(1)
    t = token(1, q)
    alone = t.refcount()
    held = [t, t]
    more = t.refcount()
    del held
    back = t.refcount()
    assert (more, back) == (alone + 2, alone)


def test_repr_names_the_slice_and_owner(token: Any) -> None:
    assert repr(token(4, ReleaseQueue(2))) == "SliceHandle(id=4, owner=2)"


def test_a_failed_release_is_reported_and_the_exception_in_flight_kept(
    token: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    t = token(1, object())  # a queue without _queue: the release cannot append
    try:
        raise KeyError("in flight")
    except KeyError:
        del t
        gc.collect()
        assert sys.exc_info()[0] is KeyError
    assert len(seen) == 1
    assert isinstance(seen[0].exc_value, AttributeError)


def test_release_from_another_thread(token: Any) -> None:
    import threading

    q = ReleaseQueue(1)
    tokens = [token(i, q) for i in range(1000)]
    th = threading.Thread(target=tokens.clear)
    th.start()
    th.join()
    assert sorted(q.drain()) == list(range(1000))
