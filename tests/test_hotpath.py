"""The CUDA hot path's two variants (compiled and pure-Python twin): the choice, and bad
input raising typed errors before anything reaches the driver (no GPU needed)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from typing import Any

import numpy as np
import pytest

from asynccube._core.cuda import abi
from asynccube._core.cuda.native import _twin, hotpath
from asynccube._core.errors import AsyncCubeError, InvalidArgument


def _block(n_ptrs: int = 2, size: int = 64) -> tuple[Any, Any]:
    storage = np.zeros(size, np.uint8)
    params = np.array([storage.ctypes.data + 8 * i for i in range(max(n_ptrs, 1))], np.uint64)
    return storage, params


def _state(hot: Any, **kw: Any) -> Any:
    storage, params = _block()
    args: dict[str, Any] = {
        "storage": storage, "params": params, "ptr_offset": 0, "n_ptrs": 2,
        "scalars": [(16, 8)], "metadata": (24, 8), "tensor_maps": [],
    }  # fmt: skip
    args.update(kw)
    return hot.PackState(*args.values())


def _launch(hot: Any, st: Any, **kw: Any) -> Any:
    args: dict[str, Any] = {
        "state": st, "function": 1, "gx": 1, "gy": 1, "gz": 1, "bx": 1, "by": 1, "bz": 1,
        "shared": 0, "stream": 0, "pointers": [1, 2], "scalars": None, "metadata": None,
        "tensor_maps": None,
    }  # fmt: skip
    args.update(kw)
    return hot.launch(*args.values())


def test_choice_is_reported() -> None:
    assert hotpath.ACTIVE in ("native", "python")
    assert hotpath.REASON
    module, active, reason = hotpath.load(no_extensions=True)
    assert module is _twin
    assert active == "python"
    assert "ASYNCCUBE_NO_EXTENSIONS" in reason


def test_environment_switch_forces_the_twin() -> None:
    code = "from asynccube._core.cuda.native import hotpath as h; print(h.ACTIVE, h.REASON)"
    env = {**os.environ, "ASYNCCUBE_NO_EXTENSIONS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.startswith("python ASYNCCUBE_NO_EXTENSIONS is set")


def test_the_compiled_path_does_not_import_the_twin() -> None:
    """The twin's modules (about 10 ms of import, which a process's first open_client
    runs in a worker thread holding the GIL) load only where the twin is used."""
    code = (
        "import sys; from asynccube._core.cuda.native import hotpath as h; "
        "print(h.ACTIVE, any(m.startswith('asynccube._core.cuda.native._twin') "
        "for m in sys.modules))"
    )
    env = {k: v for k, v in os.environ.items() if k != "ASYNCCUBE_NO_EXTENSIONS"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    active, twin_loaded = out.stdout.split()
    assert twin_loaded == ("True" if active == "python" else "False")
    env["ASYNCCUBE_NO_EXTENSIONS"] = "1"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["python", "True"]


def test_info_names_the_active_path() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "asynccube", "info"], capture_output=True, text=True, check=True
    )
    assert f"hot path: {'compiled' if hotpath.ACTIVE == 'native' else 'pure Python'}" in out.stdout
    assert hotpath.REASON in out.stdout


def test_arg_pack_builds_a_state() -> None:
    sig = abi.Signature(3, 1, [(np.float32, 2)], 5)
    pack = abi.ArgPack(sig)
    assert isinstance(pack.state, hotpath.hot.PackState)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"ptr_offset": 60}, "outside"),
        ({"n_ptrs": -1}, "n_ptrs"),
        ({"n_ptrs": 100}, "outside"),
        ({"storage": b"\0" * 64}, "writable"),
        ({"storage": 3}, "writable"),
        ({"params": np.zeros(3, np.uint8)}, "8-byte"),
        ({"params": np.array([12345], np.uint64)}, "outside"),
        ({"scalars": [(60, 8)]}, "outside"),
        ({"scalars": [7]}, "pairs"),
        ({"metadata": (62, 4)}, "outside"),
        ({"metadata": "x"}, "offset, size"),
        ({"tensor_maps": [0]}, "outside"),
    ],
)
def test_bad_pack_state(hot: Any, change: dict[str, Any], words: str) -> None:
    with pytest.raises(InvalidArgument, match=words):
        _state(hot, **change)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"state": "nope"}, "PackState"),
        ({"function": 0}, "loaded kernel"),
        ({"function": "f"}, "function"),
        ({"gx": -1}, "grid x"),
        ({"by": 1 << 40}, "32 bits"),
        ({"shared": 1.5}, "shared"),
        ({"stream": "s"}, "stream"),
        ({"pointers": [1]}, "1 buffer pointers given; the signature has 2"),
        ({"pointers": [1, 2, 3]}, "3 buffer pointers"),
        ({"pointers": [1, -2]}, "pointer"),
        ({"pointers": [1, "x"]}, "pointer"),
        ({"scalars": []}, "0 scalar groups given"),
        ({"scalars": [b"\0" * 9]}, "9 bytes"),
        ({"scalars": [3]}, "bytes-like"),
        ({"metadata": b"\0" * 4}, "4 bytes; its parameter slot holds 8"),
        ({"tensor_maps": [b"\0" * 128]}, "1 tensor maps given; the signature has 0"),
    ],
)
def test_bad_launch_raises_before_the_driver(hot: Any, change: dict[str, Any], words: str) -> None:
    with pytest.raises(InvalidArgument, match=words):
        _launch(hot, _state(hot), **change)


def test_metadata_without_a_slot(hot: Any) -> None:
    with pytest.raises(InvalidArgument, match="has none"):
        _launch(hot, _state(hot, metadata=None), metadata=b"\0" * 8)


@pytest.mark.skipif(hotpath.hot.driver_open(), reason="the driver is open in this process")
def test_valid_launch_without_driver_is_refused(hot: Any) -> None:
    if hot.driver_open():
        pytest.skip("the driver is open in this process")
    with pytest.raises(RuntimeError, match="not open"):
        _launch(hot, _state(hot), scalars=[b"\0" * 8], metadata=b"\0" * 8)


@pytest.mark.parametrize(
    ("name", "args", "words"),
    [
        ("event_query", ("x",), "event"),
        ("stream_check", ("s",), "stream"),
        ("stream_check", (-1,), "stream"),
        ("event_record", (1, "s"), "stream"),
        ("stream_wait_event", (-1, 1), "stream"),
        ("ctx_set", ("c",), "context"),
        ("ctx_set", (-1,), "context"),
        ("memcpy_async", (True, 1, 0, 8, 0), "host address"),
        ("memcpy_async", (True, 1, 8, -8, 0), "nbytes"),
        ("memcpy_peer", (-1, 1, 8, 1, 8, 0), "destination address"),
        ("memcpy_peer", (8, 1, 8, "c", 8, 0), "source context"),
        ("memcpy_peer", (8, 1, 8, 1, -8, 0), "nbytes"),
        ("memcpy_peer", (8, 1, 8, 1, 8, 1.5), "stream"),
        ("notify_close", (0, -1), "fd"),
        ("notify_close", (0, 1 << 31), "fd"),
        ("notify_spin", (0, -1, 10), "fd"),
        ("notify_spin", (0, 3, -1), "spin_ns"),
        ("notify_drain", ("x",), "timeout"),
        ("notify_drain", (-1.0,), "timeout"),
        ("param_sizes", (0,), "loaded kernel"),
        ("is_pinned", (-5,), "address"),
        ("address", (3,), "bytes-like"),
        ("copy_into", (bytearray(4), b"12345", 1), "5 bytes"),
        ("copy_into", (b"1234", b"1", 1), "writable"),
        ("copy_into", (bytearray(4), b"1", -1), "threads"),
        ("bytes_at", (0, 8, 1), "address must not be 0"),
        ("bytes_at", (-1, 8, 1), "address"),
        ("bytes_at", (8, -8, 1), "nbytes"),
        ("bytes_at", (8, 8, -1), "threads"),
    ],
)
def test_bad_arguments(hot: Any, name: str, args: tuple[Any, ...], words: str) -> None:
    with pytest.raises(AsyncCubeError, match=words):
        getattr(hot, name)(*args)


@pytest.mark.parametrize(
    "size", [0, 100, (256 << 10) - 1, 256 << 10, (1 << 20) + 5, 3 << 20, (17 << 20) + 5]
)
@pytest.mark.parametrize("threads", [1, 4])
def test_copy_into(hot: Any, size: int, threads: int) -> None:
    src = np.random.default_rng(size).integers(0, 255, size, dtype=np.uint8)
    dst = np.zeros(size + 16, np.uint8)
    hot.copy_into(dst, src, threads)
    assert np.array_equal(dst[:size], src)
    assert not dst[size:].any()


@pytest.mark.parametrize("size", [0, 100, (256 << 10) - 1, 256 << 10, (1 << 20) - 3])
@pytest.mark.parametrize("threads", [1, 4])
def test_bytes_at(hot: Any, size: int, threads: int) -> None:
    src = np.random.default_rng(size).integers(0, 255, size + 8, dtype=np.uint8)
    out = hot.bytes_at(src.ctypes.data + 8, size, threads)
    assert type(out) is bytes and out == src[8:].tobytes()


def test_copy_helpers_take_pieces_of_a_large_copy() -> None:
    """The compiled module's copy helpers (started once, no GIL) copy pieces of a copy of
    256 KiB to 16 MiB beside the calling thread: the loop thread staging a 1 MiB request
    body pays part of its copy. (Before them, a copy under 16 MiB ran on the caller
    alone.) The twin has none and says so."""
    assert _twin.copy_stats() == (0, 0)
    native = hotpath.hot if hotpath.ACTIVE == "native" else None
    if native is None:
        pytest.skip("the compiled extension is not active here")
    src = np.random.default_rng(7).integers(0, 255, 8 << 20, dtype=np.uint8)
    dst = np.zeros_like(src)
    pooled, helped = native.copy_stats()
    for i in range(20):  # 128 pieces each: a helper woken by the first joins well before the end
        src[0] = i
        native.copy_into(dst, src, 4)
        assert np.array_equal(dst, src)
    pooled_after, helped_after = native.copy_stats()
    assert pooled_after == pooled + 20
    assert helped_after > helped


def test_concurrent_copies_share_the_helpers(hot: Any) -> None:
    """Copies from several threads at once: one has the helpers, the others copy alone;
    every copy lands whole."""
    size = (3 << 20) + 4097
    sources = [np.full(size, i + 1, np.uint8) for i in range(6)]
    targets = [np.zeros(size, np.uint8) for _ in sources]

    def copy(i: int) -> None:
        for _ in range(10):
            targets[i][:] = 0
            hot.copy_into(targets[i], sources[i], 4)
            assert np.array_equal(targets[i], sources[i])

    threads = [threading.Thread(target=copy, args=(i,)) for i in range(len(sources))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(np.array_equal(t, s) for t, s in zip(targets, sources, strict=True))


def test_notify_drain_with_nothing_in_flight(hot: Any) -> None:
    assert hot.notify_drain(0.0) is True


def test_address(hot: Any) -> None:
    data = bytearray(b"abcdef")
    view = memoryview(data)[2:]
    assert hot.address(view) == np.frombuffer(data, np.uint8).ctypes.data + 2
