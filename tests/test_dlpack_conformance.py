"""The DLPack contract, tried from outside as another library would: asynccube's tensors
exported to numpy (the consumer) and numpy's arrays imported (the producer) on the host
server, under asyncio and trio; the same with torch and CuPy on cuda:0 (marked
``cuda``; skipped where they are missing).

Export: every supported dtype, 0-d, zero-size, strided views, versioned and legacy
capsules, ``max_version``/``dl_device``/``copy``/``stream``, a capsule consumed twice or
dropped unconsumed, the memory valid after the tensor is dropped and after the client
is closed (in a subprocess: a crash fails the test instead of killing pytest), bad
input refused with :class:`~asynccube.DLPackError`. Import: the same, plus the array
API's ``device``/``copy`` keywords, a producer mutated after the import, and a
producer whose memory belongs to its capsule (kept until the tensor is gone).
"""

from __future__ import annotations

import ctypes
import gc
import os
import subprocess
import sys
import textwrap
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import asynccube as ac
from asynccube._core.client.dlpack import _capsule_pointer, live_exports, make_capsule

pytestmark = pytest.mark.anyio

DTYPES = ["?", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8", "c8", "c16"]


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Each test on both event loops."""
    return str(request.param)


@pytest.fixture(scope="module", autouse=True)
def _warm() -> None:
    """One host client opened and closed under trio and asyncio before the probed tests,
    off their loops: first-use imports (trio's side of asynccube) are not what is
    tested here."""
    import asyncio

    import trio

    async def once() -> None:
        async with ac.open_client("host") as client:
            t = client.create_array(np.arange(4, dtype=np.float32))
            await client.sync()
            np.from_dlpack(t)

    trio.run(once)
    asyncio.run(once())


def _values(dtype: str, n: int = 6) -> np.ndarray[Any, Any]:
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return np.arange(n) % 3 == 0
    if dt.kind == "c":
        return (np.arange(n) + 1j * np.arange(n)[::-1]).astype(dt)
    return np.arange(n).astype(dt)


class Producer:
    """A numpy-backed producer recording what it was asked (weakly referenceable)."""

    def __init__(self, array: np.ndarray[Any, Any]) -> None:
        self.array = array
        self.asked: list[dict[str, Any]] = []

    def __dlpack__(self, **kwargs: Any) -> Any:
        self.asked.append(kwargs)
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)


class LegacyProducer(Producer):
    """A pre-1.0 producer: no ``max_version``/``copy``; an unversioned capsule."""

    def __dlpack__(self, stream: Any = None) -> Any:  # type: ignore[override]
        self.asked.append({"stream": stream})
        return self.array.__dlpack__()


class CopyingProducer(Producer):
    """A producer whose capsule owns its memory (as a C library's, or a ``copy=True``
    export): the memory lives exactly as long as the capsule's consumer keeps it."""

    def __dlpack__(self, **kwargs: Any) -> Any:
        self.asked.append(kwargs)
        return np.array(self.array).__dlpack__(**kwargs)


class Capsules:
    """A producer handing out one given capsule (to consume a capsule twice)."""

    def __init__(self, capsule: Any) -> None:
        self.capsule = capsule

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self.capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)


async def _serves(client: ac.ComputeClient) -> None:
    assert (await client.read([client.create(b"ok")]))[0] == b"ok"


# -- export: asynccube produces, numpy consumes --------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
async def test_export_every_dtype_shares_memory(anyio_backend: str, dtype: str) -> None:
    async with ac.open_client("host") as client:
        data = _values(dtype)
        t = client.create_array(data)
        await client.sync()  # a CPU consumer has no stream: the data is ready first
        array = np.from_dlpack(t)
        assert array.dtype == np.dtype(dtype) and array.shape == data.shape
        np.testing.assert_array_equal(array, data)
        array[0] = data[1]  # the consumer writes asynccube's buffer
        assert (await client.read_array(t))[0] == data[1]


async def test_export_0d_zero_size_and_strided_views(anyio_backend: str) -> None:
    async with ac.open_client("host") as client:
        h = client.create(np.arange(12, dtype=np.int32))
        scalar = client.tensor(h, (), np.int32)
        empty = client.empty_array((3, 0), np.float32)
        every_other = client.tensor(h, (3, 2), np.int32, strides=(4, 2))
        transposed = client.tensor(h, (4, 3), np.int32, strides=(1, 4))
        await client.sync()
        a = np.from_dlpack(scalar)
        assert a.shape == () and a == 0
        assert np.from_dlpack(empty).shape == (3, 0)
        np.testing.assert_array_equal(np.from_dlpack(every_other), [[0, 2], [4, 6], [8, 10]])
        np.testing.assert_array_equal(
            np.from_dlpack(transposed), np.arange(12, dtype=np.int32).reshape(3, 4).T
        )


async def test_export_capsule_versions_and_keywords(anyio_backend: str) -> None:
    async with ac.open_client("host") as client:
        t = client.create_array(np.arange(4, dtype=np.float64))
        await client.sync()
        assert '"dltensor"' in repr(t.__dlpack__())
        assert '"dltensor"' in repr(t.__dlpack__(max_version=(0, 8)))
        assert '"dltensor_versioned"' in repr(t.__dlpack__(max_version=(1, 0)))
        assert '"dltensor_versioned"' in repr(t.__dlpack__(max_version=(2, 3)))
        for capsule in (t.__dlpack__(), t.__dlpack__(max_version=(1, 0))):
            np.testing.assert_array_equal(np.from_dlpack(Capsules(capsule)), np.arange(4))
        shared = np.from_dlpack(t, device="cpu", copy=False)
        copied = np.from_dlpack(t, copy=True)
        shared[0] = 100.0
        assert copied[0] == 0.0 and (await client.read_array(t))[0] == 100.0
        assert np.from_dlpack(Capsules(t.__dlpack__(dl_device=(1, 0))))[0] == 100.0
        for kwargs, words in [
            ({"stream": 1}, "no streams"),
            ({"stream": -1}, "no streams"),
            ({"dl_device": (2, 0)}, "another device"),
            ({"max_version": (1,)}, "max_version"),
            ({"copy": 1}, "copy must be"),
        ]:
            with pytest.raises(ac.DLPackError, match=words):
                t.__dlpack__(**kwargs)
        await _serves(client)


async def test_export_capsule_consumed_twice_or_dropped(anyio_backend: str) -> None:
    async with ac.open_client("host") as client:
        await client.sync()
        before = await client.memory_usage()
        t = client.create_array(np.full(1024, 3, np.int64))
        await client.sync()
        capsule = t.__dlpack__(max_version=(1, 0))
        producer = Capsules(capsule)
        first = np.from_dlpack(producer)
        with pytest.raises((BufferError, ValueError)):  # already consumed: numpy refuses
            np.from_dlpack(producer)
        with pytest.raises(ac.DLPackError, match="no unconsumed"):
            client.from_dlpack(producer)
        assert (first == 3).all()
        dropped = [t.__dlpack__(), t.__dlpack__(max_version=(1, 0))]  # never consumed
        del dropped, capsule, producer, first, t
        gc.collect()
        await client.sync()
        client.memory_cleanup()
        assert (await client.memory_usage()).bytes_in_use == before.bytes_in_use


async def test_export_outlives_the_handle(anyio_backend: str) -> None:
    async with ac.open_client("host") as client:
        t = client.create_array(np.full(4096, 7, np.int32))
        await client.sync()
        array = np.from_dlpack(t)
        del t
        gc.collect()
        others = [client.create_array(np.full(4096, -1, np.int32)) for _ in range(8)]
        await client.sync()
        assert (array == 7).all() and len(others) == 8


async def test_export_memory_outlives_close(anyio_backend: str) -> None:
    client = await ac.connect("host")
    small, large = (
        client.create_array(np.full(16, 5, np.int16)),
        client.empty_array((1 << 18,), np.float32),
    )  # 1 MiB: a page freed by a background thread
    imported = client.from_dlpack(np.full(64, 4, np.int64))
    await client.sync()
    small, large, reexported = (np.from_dlpack(x) for x in (small, large, imported))
    large[:] = 9.0
    del imported
    await client.close()  # waits for none of the exports
    gc.collect()
    junk = [np.full(1 << 16, -1, np.float32) for _ in range(16)]
    assert (small == 5).all() and (large == 9).all() and (reexported == 4).all()
    large[:] = 1.0  # still writable memory of the consumer's
    assert len(junk) == 16 and large.sum() == 1 << 18


async def test_export_right_after_a_kernels_first_launch(anyio_backend: str) -> None:
    async with ac.open_client("host") as client:
        await client.sync()  # the stream's worker thread is started (not part of this)
        t = client.create_array(np.arange(8, dtype=np.float32))
        fresh = ac.Kernel(f"conformance_fresh_{anyio_backend}", host=_triple)
        client.execute(fresh, ac.CubeCount(1), ac.Bindings().with_buffers([t.binding()]))
        np.testing.assert_array_equal(np.from_dlpack(t), np.arange(8) * 3.0)  # no await


def _triple(launch: ac.HostLaunch) -> None:
    launch.buffers[0].view(np.float32)[:] *= 3


@pytest.mark.parametrize(
    "dtype", [">f4", "<U2", "M8[s]", "V8", "O", np.longdouble, [("a", "i4"), ("b", "f4")]]
)
async def test_export_of_a_dtype_dlpack_lacks_is_a_dlpack_error(
    anyio_backend: str, dtype: Any
) -> None:
    async with ac.open_client("host") as client:
        h = client.create(bytes(64))
        await client.sync()
        tensor = ac.Tensor(h, (2,), (1,), dtype, client)  # made without client checks
        with pytest.raises(ac.DLPackError, match="DLPack"):
            tensor.__dlpack__()
        with pytest.raises(ac.DLPackError):  # never numpy's bare BufferError
            np.from_dlpack(tensor)
        await _serves(client)


async def test_export_refuses_bad_input(anyio_backend: str) -> None:
    async with ac.open_client("host") as client:
        h = client.create(bytes(16))
        await client.sync()
        swapped = ac.Tensor(h, (4,), (1,), ">f4", client)  # made without client checks
        with pytest.raises(ac.DLPackError, match="native byte order"):
            swapped.__dlpack__()
        with pytest.raises(ac.DLPackError):
            np.from_dlpack(swapped)
        with pytest.raises(ac.InvalidArgument, match=r"client\.tensor"):
            ac.Tensor(h, (4,), (1,), np.float32).__dlpack__()
        await _serves(client)
    with pytest.raises(ac.ClientClosedError):
        client.tensor(h, (4,), np.float32).__dlpack__()


# -- import: numpy produces, asynccube consumes --------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
async def test_import_every_dtype_shares_memory(anyio_backend: str, dtype: str) -> None:
    async with ac.open_client("host") as client:
        x = _values(dtype)
        t = client.from_dlpack(x)
        assert (t.shape, t.dtype) == (x.shape, np.dtype(dtype))
        np.testing.assert_array_equal(await client.read_array(t), x)
        x[0] = x[1]  # the producer writes: asynccube sees it
        assert (await client.read_array(t))[0] == x[1]
        client.write([(t.copy_descriptor(), _values(dtype)[::-1].copy())])
        await client.sync()
        np.testing.assert_array_equal(x, _values(dtype)[::-1])  # asynccube writes it


async def test_import_0d_zero_size_and_strided(anyio_backend: str) -> None:
    async with ac.open_client("host") as client:
        scalar = client.from_dlpack(np.array(2.5))
        assert scalar.shape == () and await client.read_array(scalar) == 2.5
        empty = client.from_dlpack(np.zeros((2, 0), np.uint16))
        assert (await client.read_array(empty)).shape == (2, 0)
        base = np.arange(12, dtype=np.float32).reshape(3, 4)
        with pytest.raises(ac.DLPackError, match="not C-contiguous"):
            client.from_dlpack(base.T, copy=False)
        copied = client.from_dlpack(base.T)  # copy=None: copied, as it cannot be shared
        np.testing.assert_array_equal(await client.read_array(copied), base.T)
        client.write([(copied.copy_descriptor(), np.zeros((4, 3), np.float32))])
        await client.sync()
        assert base.sum() == 66.0  # the producer is untouched


async def test_import_asks_for_a_versioned_capsule_without_stream(anyio_backend: str) -> None:
    async with ac.open_client("host") as client:
        producer = Producer(np.arange(4, dtype=np.int8))
        client.from_dlpack(producer)
        assert producer.asked == [{"stream": None, "max_version": (1, 1)}]


async def test_import_of_a_legacy_capsule_is_writable(anyio_backend: str) -> None:
    async with ac.open_client("host") as client:
        producer = LegacyProducer(np.zeros(4, np.float32))
        t = client.from_dlpack(producer, copy=False)  # shared: no read-only flag
        client.write([(t.copy_descriptor(), np.full(4, 2.0, np.float32))])
        await client.sync()
        assert (producer.array == 2.0).all()
        assert producer.asked == [{"stream": None}]  # after a TypeError for max_version
        legacy = LegacyProducer(np.zeros(4, np.float32))
        copied = client.from_dlpack(legacy, copy=True)  # copied by asynccube, not asked
        legacy.array[:] = 5.0
        assert (await client.read_array(copied) == 0.0).all()
        await _serves(client)


async def test_import_copy_and_device_keywords(anyio_backend: str) -> None:
    async with ac.open_client("host") as client:
        x = np.arange(8, dtype=np.float64)
        shared = client.from_dlpack(x, device="host", copy=False)
        copied = client.from_dlpack(x, device=(1, 0), copy=True)
        x[:] = -1.0  # the producer is mutated after the import
        assert (await client.read_array(shared) == -1.0).all()
        np.testing.assert_array_equal(await client.read_array(copied), np.arange(8))
        frozen = np.arange(4, dtype=np.int32)
        frozen.flags.writeable = False
        with pytest.raises(ac.DLPackError, match="read-only"):
            client.from_dlpack(frozen, copy=False)
        writable = client.from_dlpack(frozen)  # copy=None: a copy of read-only memory
        np.testing.assert_array_equal(await client.read_array(writable), frozen)
        for kwargs, words in [
            ({"device": "cuda:0"}, "device='cuda:0'"),
            ({"device": (2, 0)}, r"device=\(2, 0\)"),
            ({"copy": "no"}, "copy must be"),
        ]:
            with pytest.raises(ac.DLPackError, match=words):
                client.from_dlpack(x, **kwargs)
        with pytest.raises(TypeError):
            client.from_dlpack(obj=x)  # type: ignore[call-arg]  # positional only
        await _serves(client)


async def test_import_keeps_the_capsules_memory(anyio_backend: str) -> None:
    async with ac.open_client("host") as client:
        producer = CopyingProducer(np.full(256, 3, np.int32))
        t = client.from_dlpack(producer, copy=False)
        view = client.tensor(t.handle, (16, 16), np.int32)
        alive = weakref.ref(producer)
        del producer, t
        gc.collect()
        junk = [np.full(256, -1, np.int32) for _ in range(200)]
        assert (await client.read_array(view) == 3).all() and len(junk) == 200
        assert alive() is not None  # the producer object too, while the view lives
        del view
        await client.sync()
        await client.memory_usage()  # the actor drains dropped handles
        gc.collect()
        assert alive() is None


async def test_import_refuses_bad_input(anyio_backend: str) -> None:
    async with ac.open_client("host") as client:
        before = live_exports()
        for obj, words in [
            (b"abc", "does not implement the DLPack protocol"),
            (_Raising(), "cannot import _Raising"),
            (_OnDevice(), r"device \(2, 0\)"),
            (_bfloat16(), r"\(4, 16, 1\) cannot be expressed"),
        ]:
            with pytest.raises(ac.DLPackError, match=words):
                client.from_dlpack(obj)
        gc.collect()
        assert live_exports() == before  # the refused capsule's deleter ran
        await _serves(client)


def _bfloat16() -> Capsules:
    """A versioned capsule of 4 bfloat16 (DLPack code 4), which no Tensor can hold."""
    memory = np.zeros(4, np.uint16)
    capsule = make_capsule(
        memory.ctypes.data, (1, 0), (4,), (1,), memory.dtype, memory, versioned=True
    )
    managed = _capsule_pointer(id(capsule), b"dltensor_versioned")
    ctypes.c_uint8.from_address(managed + 32 + 20).value = 4  # dl_tensor.dtype.code
    return Capsules(capsule)


class _Raising(Producer):
    def __init__(self) -> None:
        super().__init__(np.zeros(1))

    def __dlpack__(self, **kwargs: Any) -> Any:
        raise BufferError("the producer cannot export this")


class _OnDevice(Producer):
    def __init__(self) -> None:
        super().__init__(np.zeros(1))

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, 0)


# -- lifetime across close, in a subprocess: a crash fails the test -------------------

_HOST_SCRIPT = """
import asyncio, gc, sys
import numpy as np
import asynccube as ac

async def main():
    client = await ac.connect("host")
    t = client.create_array(np.full(1 << 20, 7, np.float32))
    x = np.full(4096, 5, np.int64)
    imported = client.from_dlpack(x)
    await client.sync()
    exported, again = np.from_dlpack(t), np.from_dlpack(imported)
    del x, t, imported
    await client.close()
    gc.collect()
    junk = [np.full(1 << 18, -1, np.float32) for _ in range(32)]
    print(float(exported.sum()), int(again.sum()), len(junk))

asyncio.run(main())
"""


def _run(script: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    here = str(Path(ac.__file__).resolve().parents[1])  # the asynccube under test
    env["PYTHONPATH"] = os.pathsep.join([here, env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=100,
        env=env,
        check=False,
    )


def test_exports_outlive_close_without_a_crash() -> None:
    done = _run(_HOST_SCRIPT)
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"
    assert done.stdout.split() == [str(7.0 * (1 << 20)), str(5 * 4096), "32"]


# -- cuda:0, with torch and CuPy -------------------------------------------------------


LIBS = ["torch", "cupy"]
"""The GPU libraries tried; a test of one not installed is skipped."""


def _lib(name: str) -> Any:
    return pytest.importorskip(name)


def _to_numpy(name: str, array: Any) -> np.ndarray[Any, Any]:
    return array.cpu().numpy() if name == "torch" else _lib("cupy").asnumpy(array)


def _device_array(name: str, data: np.ndarray[Any, Any]) -> Any:
    if name == "torch":
        return _lib("torch").from_numpy(data.copy()).cuda()
    return _lib("cupy").asarray(data)


def _current_stream(name: str) -> Any:
    if name == "torch":
        return _lib("torch").cuda.current_stream()
    return _lib("cupy").cuda.get_current_stream()


CUDA_DTYPES = ["?", "i1", "i2", "i4", "i8", "u1", "f2", "f4", "f8", "c8", "c16"]
"""What torch and CuPy both take (torch has no uint16/32/64 tensors on every version)."""


@pytest.mark.cuda
@pytest.mark.allow_loop_lag
@pytest.mark.parametrize("lib", LIBS)
@pytest.mark.parametrize("dtype", CUDA_DTYPES)
async def test_cuda_export_every_dtype(anyio_backend: str, lib: str, dtype: str) -> None:
    _lib(lib)  # skipped where the library is missing
    async with ac.open_client("cuda:0") as client:
        data = _values(dtype)
        t = client.create_array(data)
        await client.sync()
        array = _lib(lib).from_dlpack(t)
        np.testing.assert_array_equal(_to_numpy(lib, array), data)


@pytest.mark.cuda
@pytest.mark.allow_loop_lag
@pytest.mark.parametrize("lib", LIBS)
async def test_cuda_export_views_versions_and_keywords(anyio_backend: str, lib: str) -> None:
    _lib(lib)  # skipped where the library is missing
    async with ac.open_client("cuda:0") as client:
        h = client.create(np.arange(12, dtype=np.int32))
        scalar = client.tensor(h, (), np.int32)
        every_other = client.tensor(h, (3, 2), np.int32, strides=(4, 2))
        empty = client.empty_array((0, 3), np.float32)
        await client.sync()
        from_dlpack = _lib(lib).from_dlpack
        assert _to_numpy(lib, from_dlpack(scalar)).shape == ()
        np.testing.assert_array_equal(
            _to_numpy(lib, from_dlpack(every_other)), [[0, 2], [4, 6], [8, 10]]
        )
        assert _to_numpy(lib, from_dlpack(empty)).shape == (0, 3)
        assert '"dltensor_versioned"' in repr(every_other.__dlpack__(stream=-1, max_version=(1, 0)))
        assert '"dltensor"' in repr(every_other.__dlpack__(stream=-1))
        for kwargs, words in [
            ({"stream": 0}, "stream=0"),
            ({"copy": True}, "copy=True"),
            ({"dl_device": (1, 0)}, "another device"),
        ]:
            with pytest.raises(ac.DLPackError, match=words):
                every_other.__dlpack__(**kwargs)
        dropped = [every_other.__dlpack__(stream=-1) for _ in range(3)]
        del dropped
        gc.collect()
        assert (await client.read_array(every_other) == [[0, 2], [4, 6], [8, 10]]).all()


@pytest.mark.cuda
@pytest.mark.allow_loop_lag
@pytest.mark.parametrize("lib", LIBS)
async def test_cuda_export_after_a_first_launch(anyio_backend: str, lib: str) -> None:
    _lib(lib)  # skipped where the library is missing
    from .kernels import SCALE, blocks

    async with ac.open_client("cuda:0") as client:
        n = 1 << 12
        t = client.create_array(np.ones(n, np.float32))
        kernel = ac.Kernel(f"conformance_first_scale_{lib}_{anyio_backend}", cuda=SCALE.cuda)
        bindings = (
            ac.Bindings()
            .with_buffers([t.binding()])
            .with_scalar(np.float32, [4.0])
            .with_scalar(np.uint32, [n])
        )
        client.execute(kernel, blocks(n), bindings)  # its compile runs in a worker thread
        with pytest.raises(ac.DLPackError, match="compiled and loaded"):  # (the load
            _lib(lib).from_dlpack(t)  # synchronizes the device: a waiting consumer would hold it)
        await client.sync()
        array = _lib(lib).from_dlpack(t)
        np.testing.assert_array_equal(_to_numpy(lib, array), 4.0)
        client.execute(kernel, blocks(n), bindings)  # loaded now: ordered, not refused
        array = _lib(lib).from_dlpack(t)
        np.testing.assert_array_equal(_to_numpy(lib, array), 16.0)


@pytest.mark.cuda
@pytest.mark.allow_loop_lag
@pytest.mark.parametrize("lib", LIBS)
async def test_cuda_import_copy_and_mutation(anyio_backend: str, lib: str) -> None:
    _lib(lib)  # skipped where the library is missing
    async with ac.open_client("cuda:0") as client:
        x = _device_array(lib, np.arange(64, dtype=np.float32))
        shared = client.from_dlpack(x, device="cuda:0", copy=False)
        copied = client.from_dlpack(x, device=(2, 0), copy=True)
        x[:] = -1.0  # mutated after the import, on the producer's stream: ordered by
        client.after(_current_stream(lib))  # ... this, like any of its later work
        assert (await client.read_array(shared) == -1.0).all()
        np.testing.assert_array_equal(await client.read_array(copied), np.arange(64))
        strided = x[::2]
        with pytest.raises(ac.DLPackError, match="not C-contiguous"):
            client.from_dlpack(strided, copy=False)
        if lib == "cupy":  # CuPy copies to the host only: asynccube copies what is dense
            with pytest.raises(ac.DLPackError, match="copies only to the host"):
                client.from_dlpack(strided)
        else:
            assert (await client.read_array(client.from_dlpack(strided)) == -1.0).all()
        with pytest.raises(ac.DLPackError, match="device="):
            client.from_dlpack(x, device="host")


_CUDA_SCRIPT = """
import asyncio, gc
import numpy as np
import asynccube as ac
import {lib} as lib

ON_GPU = dict(device="cuda") if "{lib}" == "torch" else {{}}

def to_numpy(a):
    return a.cpu().numpy() if "{lib}" == "torch" else lib.asnumpy(a)

async def main():
    client = await ac.connect("cuda:0")
    t = client.create_array(np.full(1 << 20, 7, np.float32))
    await client.sync()
    exported = lib.from_dlpack(t)
    x = lib.full((4096,), 5, dtype=lib.int64, **ON_GPU)
    again = lib.from_dlpack(client.from_dlpack(x))  # imported, then exported again
    del x, t
    await client.close()  # waits for no export; frees none of their memory
    gc.collect()
    junk = [lib.zeros(1 << 18, **ON_GPU) for _ in range(16)]  # would reuse freed memory
    assert len(junk) == 16
    print(float(to_numpy(exported).sum()), int(to_numpy(again).sum()))
    del exported, again  # the last exports: memory and context released (a thread)
    gc.collect()
    await asyncio.sleep(0.5)

asyncio.run(main())
"""


@pytest.mark.cuda
@pytest.mark.parametrize("lib", LIBS)
def test_cuda_exports_outlive_close(lib: str) -> None:
    _lib(lib)
    done = _run(_CUDA_SCRIPT.format(lib=lib))
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"
    assert done.stdout.split() == [str(7.0 * (1 << 20)), str(5 * 4096)]


_AFTER_CLOSE = """
import asyncio, gc, time
import numpy as np
import asynccube as ac
from asynccube._core.client.dlpack import take_capsule
from asynccube._core.cuda.driver import check, cu

async def main():
    client = await ac.connect("cuda:0")
    t = client.create_array(np.full(1 << 20, 7, np.float32))
    await client.sync()
    imported = take_capsule(t, -1)  # a raw-driver consumer: address and deleter
    del t
    await client.close()  # waits for no export, frees none of its memory
    gc.collect()
    return imported

imported = asyncio.run(main())
d = cu()
device = check(d.cuDeviceGet(0))
context = check(d.cuDevicePrimaryCtxRetain(device))
check(d.cuCtxSetCurrent(context))
out = np.empty(1 << 20, np.float32)
check(d.cuMemcpyDtoH(out.ctypes.data, imported.address, out.nbytes))
del imported  # the last export: memory and context released on a thread of their own
time.sleep(0.5)
check(d.cuDevicePrimaryCtxRelease(device))
print(float(out.sum()))
"""


@pytest.mark.cuda
def test_cuda_export_outlives_close_for_a_raw_driver_consumer() -> None:
    done = _run(_AFTER_CLOSE)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == [str(7.0 * (1 << 20))]
