"""The ctypes DLPack capsules (used for CUDA exports), checked on CPU memory with numpy
as the consumer: legacy and versioned, strided, owner kept alive exactly as long as
needed, and dtypes DLPack cannot express refused."""

from __future__ import annotations

import gc
import weakref
from typing import Any, ClassVar

import numpy as np
import pytest

import asynccube as ac
from asynccube._core.client.dlpack import live_exports, make_capsule, take_capsule


class Owner:
    """Stands for the exported handle: must live while the consumer holds the data."""

    def __init__(self, array: np.ndarray[Any, Any]) -> None:
        self.array = array


class Exporter:
    def __init__(self, owner: Owner, shape: tuple[int, ...], strides: tuple[int, ...]) -> None:
        self.owner, self.shape, self.strides = owner, shape, strides

    def __dlpack__(self, *, max_version: Any = None, **_: Any) -> Any:
        a = self.owner.array
        versioned = max_version is not None and max_version[0] >= 1
        return make_capsule(
            a.ctypes.data, (1, 0), self.shape, self.strides, a.dtype, self.owner,
            versioned=versioned,
        )  # fmt: skip

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)


@pytest.mark.parametrize("versioned", [False, True])
def test_numpy_consumes_and_releases(versioned: bool) -> None:
    before = live_exports()
    owner = Owner(np.arange(12, dtype=np.float64))
    alive = weakref.ref(owner)
    exporter = Exporter(owner, (3, 2), (4, 2))  # every other element of 3 rows of 4
    del owner
    capsule = exporter.__dlpack__(max_version=(1, 0) if versioned else None)
    name = "dltensor_versioned" if versioned else "dltensor"
    assert f'"{name}"' in repr(capsule)
    del capsule  # never consumed: its destructor releases the export
    gc.collect()
    assert live_exports() == before
    view = np.from_dlpack(exporter)
    np.testing.assert_array_equal(view, [[0, 2], [4, 6], [8, 10]])
    assert live_exports() == before + 1
    del exporter
    gc.collect()
    assert alive() is not None  # the consumer's array keeps the owner
    view[0, 0] = 99.0
    assert alive().array[0] == 99.0  # type: ignore[union-attr]  # shared, not copied
    del view
    gc.collect()
    assert live_exports() == before
    assert alive() is None


@pytest.mark.parametrize("dtype", ["f2", "f4", "i1", "u8", "c8", "?"])
def test_dtypes_round_trip(dtype: str) -> None:
    a = np.ones(3, dtype=dtype)
    out = np.from_dlpack(Exporter(Owner(a), (3,), (1,)))
    assert out.dtype == a.dtype and (out == a).all()


def test_inexpressible_dtype_is_refused() -> None:
    a = np.array(["x"], dtype=object)
    with pytest.raises(ac.DLPackError, match="cannot be expressed"):
        make_capsule(0, (1, 0), (1,), (1,), a.dtype, None, versioned=False)


@pytest.mark.parametrize("max_version", [True, False], ids=["versioned", "legacy"])
def test_take_capsule_reads_what_a_producer_describes(max_version: bool) -> None:
    a = np.arange(12, dtype=np.int32).reshape(3, 4)
    producer: Any = a if max_version else _Legacy(a)
    imported = take_capsule(producer, None)
    assert imported.address == a.ctypes.data
    assert imported.device == (1, 0)
    assert (imported.shape, imported.strides) == ((3, 4), (4, 1))
    assert imported.dtype == np.int32 and not imported.read_only
    assert imported.source is producer


def test_take_capsule_sees_read_only_and_calls_the_deleter() -> None:
    a = np.zeros(4, np.float32)
    a.flags.writeable = False
    assert take_capsule(a, None).read_only
    before = live_exports()
    owner = Owner(np.arange(6, dtype=np.float64))
    imported = take_capsule(Exporter(owner, (6,), (1,)), None)
    assert live_exports() == before + 1
    del imported  # the consumer is done: the producer's deleter runs
    gc.collect()
    assert live_exports() == before


class _Legacy:
    """A producer that predates DLPack 1.0 (no ``max_version``)."""

    def __init__(self, array: np.ndarray[Any, Any]) -> None:
        self.array = array

    def __dlpack__(self, *, stream: Any = None) -> Any:
        return self.array.__dlpack__(stream=stream)


def test_the_packed_structs_match_dlpack_h() -> None:
    """The ``struct`` formats that make and read capsules lay the fields out where the
    ctypes definitions of ``dlpack.h`` put them."""
    import ctypes

    from asynccube._core.client import dlpack

    assert dlpack._TENSOR_FMT.size == ctypes.sizeof(dlpack._Tensor)
    assert dlpack._VERSIONED_HEAD_FMT.size == dlpack._ManagedVersioned.dl_tensor.offset
    assert dlpack._PLAIN_TAIL_FMT.size + dlpack._Managed.manager_ctx.offset == ctypes.sizeof(
        dlpack._Managed
    )
    for ndim in (0, 1, 3):
        extra = 16 * ndim
        assert dlpack._format(True, ndim).size == ctypes.sizeof(dlpack._ManagedVersioned) + extra
        assert dlpack._format(False, ndim).size == ctypes.sizeof(dlpack._Managed) + extra
    assert dlpack._VERSIONED_FMT.size == ctypes.sizeof(dlpack._ManagedVersioned)
    assert dlpack._PLAIN_FMT.size == ctypes.sizeof(dlpack._Managed)


class _HandMade:
    """A legacy producer laying out its ``DLTensor`` by hand, its strides where it
    likes them: ``"apart"`` (an array of their own), ``"before"`` (just before the
    shape, in one array), ``"after"`` (just after it) or ``"null"`` (contiguous)."""

    calls: ClassVar[list[int]] = []

    def __init__(self, array: np.ndarray[Any, Any], strides_at: str) -> None:
        import ctypes

        from asynccube._core.client import dlpack

        self.array = array
        shape, steps = array.shape, tuple(s // array.itemsize for s in array.strides)
        ndim = len(shape)
        managed = dlpack._Managed()
        tensor = managed.dl_tensor
        tensor.data = array.ctypes.data
        tensor.device = dlpack._Device(1, 0)
        tensor.ndim = ndim
        tensor.dtype = dlpack._DataType(*dlpack.dtype_code(array.dtype), 1)
        both = (ctypes.c_int64 * (2 * ndim))()
        dims_at, steps_at = ctypes.addressof(both), ctypes.addressof(both) + 8 * ndim
        if strides_at == "before":
            dims_at, steps_at = steps_at, dims_at
        apart = (ctypes.c_int64 * ndim)(*steps)
        ctypes.memmove(dims_at, (ctypes.c_int64 * ndim)(*shape), 8 * ndim)
        if strides_at == "apart":
            steps_at = ctypes.addressof(apart)
        elif strides_at != "null":
            ctypes.memmove(steps_at, (ctypes.c_int64 * ndim)(*steps), 8 * ndim)
        tensor.shape = ctypes.cast(dims_at, ctypes.POINTER(ctypes.c_int64))
        tensor.strides = ctypes.cast(
            None if strides_at == "null" else steps_at, ctypes.POINTER(ctypes.c_int64)
        )
        managed.deleter = _HAND_MADE_DELETER
        self.keep = (managed, both, apart)

    def __dlpack__(self, *, stream: Any = None) -> Any:
        import ctypes

        from asynccube._core.client import dlpack

        address = ctypes.addressof(self.keep[0])
        return dlpack._capsule_new(address, b"dltensor", _HAND_MADE_DESTRUCTOR)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)


def _hand_made_deleter(managed: int) -> None:
    _HandMade.calls.append(managed)


def _deleter_type() -> Any:
    from asynccube._core.client import dlpack

    return dlpack._DELETER(_hand_made_deleter)


_HAND_MADE_DELETER = _deleter_type()


def _hand_made_destructor(capsule: int) -> None:
    """A capsule nobody consumed calls its deleter (what producers do)."""
    from asynccube._core.client import dlpack

    if dlpack._capsule_is_valid(capsule, b"dltensor"):
        _hand_made_deleter(dlpack._capsule_pointer(capsule, b"dltensor"))


def _destructor_type() -> Any:
    from asynccube._core.client import dlpack

    return dlpack._DESTRUCTOR(_hand_made_destructor)


_HAND_MADE_DESTRUCTOR = _destructor_type()


@pytest.fixture(params=["native", "python"], autouse=True)
def reader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test here on each capsule maker and reader: the compiled one
    (``_native_dlpack.c``) and its ctypes twin."""
    from asynccube._core.client import dlpack

    if request.param == "python":
        monkeypatch.setattr(dlpack, "_NATIVE", None)
    elif dlpack._NATIVE is None:
        pytest.skip(f"the compiled capsule reader is not in use: {dlpack.NATIVE_REASON}")
    return str(request.param)


@pytest.mark.parametrize("strides_at", ["apart", "before", "after", "null"])
def test_take_capsule_reads_shape_and_strides_wherever_they_lie(
    strides_at: str, reader: str
) -> None:
    """Shape and strides are read at once where they lie one after the other, apart
    otherwise; the producer's deleter runs once per consumed capsule."""
    base = np.arange(24, dtype=np.int16).reshape(2, 3, 4)
    array = base if strides_at == "null" else base[:, ::2, 1:]
    producer = _HandMade(array, strides_at)
    _HandMade.calls.clear()
    for _ in range(3):
        imported = take_capsule(producer, None)
        assert imported.shape == array.shape and imported.dtype == np.int16
        assert imported.strides == tuple(s // 2 for s in array.strides)
        np.testing.assert_array_equal(imported.array(), array)
        del imported
        gc.collect()
    assert _HandMade.calls == [ctypes_address(producer.keep[0])] * 3


def ctypes_address(obj: Any) -> int:
    import ctypes

    return ctypes.addressof(obj)


@pytest.mark.asyncio
async def test_a_negative_ndim_is_a_dlpack_error(
    host_client: ac.ComputeClient, reader: str
) -> None:
    """A producer's DLTensor with ndim < 0 is refused as a DLPackError at the call
    (it was a bare struct.error), its deleter run once (by the reader, or by the
    capsule left unconsumed), the client still serving."""
    producer = _HandMade(np.arange(4, dtype=np.int16), "after")
    producer.keep[0].dl_tensor.ndim = -1
    _HandMade.calls.clear()
    with pytest.raises(ac.DLPackError, match="ndim -1"):
        host_client.from_dlpack(producer)
    gc.collect()
    assert _HandMade.calls == [ctypes_address(producer.keep[0])]
    t = host_client.from_dlpack(np.arange(3, dtype=np.int16))
    assert (await host_client.read_array(t)).tolist() == [0, 1, 2]


@pytest.mark.asyncio
async def test_a_shape_missing_or_an_unknown_major_version_is_a_dlpack_error(
    host_client: ac.ComputeClient, reader: str
) -> None:
    """Producer structs the reader must not follow: ndim > 0 and a NULL shape (it read
    address 0 and crashed the interpreter), a versioned capsule of major version 2 (the
    spec: refused, nothing after the version read). Each is a DLPackError at the call,
    the capsule left unconsumed (its destructor runs the deleter once), the client still
    serving."""
    import ctypes

    from asynccube._core.client import dlpack

    producer = _HandMade(np.arange(4, dtype=np.int16), "null")
    producer.keep[0].dl_tensor.shape = ctypes.cast(None, ctypes.POINTER(ctypes.c_int64))
    _HandMade.calls.clear()
    with pytest.raises(ac.DLPackError, match="no shape"):
        host_client.from_dlpack(producer)
    gc.collect()
    assert _HandMade.calls == [ctypes_address(producer.keep[0])]

    array = np.arange(4, dtype=np.int16)
    versioned = dlpack._ManagedVersioned()
    versioned.version = dlpack._Version(2, 0)
    versioned.dl_tensor.data = array.ctypes.data
    versioned.dl_tensor.device = dlpack._Device(1, 0)
    versioned.dl_tensor.ndim = 1

    class Future:
        def __dlpack__(self, *, stream: Any = None, max_version: Any = None) -> Any:
            address = ctypes.addressof(versioned)
            return dlpack._capsule_new(address, b"dltensor_versioned", _HAND_MADE_DESTRUCTOR)

        def __dlpack_device__(self) -> tuple[int, int]:
            return (1, 0)

    with pytest.raises(ac.DLPackError, match=r"version 2\.0 is not supported"):
        host_client.from_dlpack(Future())
    t = host_client.from_dlpack(np.arange(3, dtype=np.int16))
    assert (await host_client.read_array(t)).tolist() == [0, 1, 2]


def test_a_consumer_may_release_on_another_thread() -> None:
    """The deleter runs on whatever thread the consumer frees from: the owner is
    dropped there, and the export counted released."""
    import threading

    before = live_exports()
    owner = Owner(np.arange(8, dtype=np.float32))
    alive = weakref.ref(owner)
    views = [np.from_dlpack(Exporter(owner, (8,), (1,))) for _ in range(4)]
    del owner
    assert live_exports() == before + 4
    thread = threading.Thread(target=views.clear)
    thread.start()
    thread.join()
    gc.collect()
    assert live_exports() == before
    assert alive() is None
