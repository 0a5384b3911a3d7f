"""ScalarBinding packs Python numbers as numpy would, byte for byte, and shares one dtype
object per scalar dtype."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import asynccube as ac
from asynccube._core.values.bindings import SCALAR_DTYPES, ScalarBinding, scalar_dtype


def _numpy_bytes(dt: np.dtype[np.generic], values: list[object]) -> bytes:
    raw = np.array(values, dtype=dt).tobytes()
    return raw + b"\0" * (-len(raw) % 8)


def _values(dt: np.dtype[np.generic]) -> st.SearchStrategy[list[object]]:
    if dt.kind in "iu":
        info = np.iinfo(dt.str)
        edge = st.sampled_from([int(info.min), int(info.max), 0])
        one: st.SearchStrategy[object] = st.integers(int(info.min), int(info.max)) | edge
    else:
        top = float(np.finfo(dt.str).max)
        edge = st.sampled_from([top, -top, 0.0, -0.0, math.inf, -math.inf, 5e-324])
        one = st.floats(-top, top, allow_subnormal=True) | edge
        one = one | st.integers(-int(top), int(top))
    return st.lists(one, min_size=0, max_size=9)


@pytest.mark.parametrize("dt", SCALAR_DTYPES, ids=[d.name for d in SCALAR_DTYPES])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_python_numbers_pack_as_numpy_packs_them(
    dt: np.dtype[np.generic], data: st.DataObject
) -> None:
    values = data.draw(_values(dt))
    sb = ScalarBinding(dt, values)
    assert sb.data == _numpy_bytes(dt, values)
    assert sb.length == len(values)
    np.testing.assert_array_equal(sb.values(), np.array(values, dtype=dt))


def test_nan_and_numpy_scalars_pack_as_numpy_does() -> None:
    f32 = np.dtype(np.float32)
    mixed = [math.nan, np.float32(1.5), np.float64(2.25), np.int64(7)]
    assert ScalarBinding(f32, mixed).data == _numpy_bytes(f32, [math.nan, 1.5, 2.25, 7])
    u8 = np.dtype(np.uint8)
    assert ScalarBinding(u8, [np.int64(255), np.uint8(3), 4.0]).data == _numpy_bytes(
        u8, [255, 3, 4]
    )
    assert ScalarBinding(u8, 9).data == _numpy_bytes(u8, [9])  # one value, not a list
    arr = np.arange(3, dtype=np.int16)
    assert ScalarBinding(np.int16, arr).data == _numpy_bytes(np.dtype(np.int16), [0, 1, 2])


def test_every_spelling_of_a_dtype_gives_the_one_dtype_object() -> None:
    u32 = scalar_dtype(np.uint32)
    for spelling in ("uint32", np.dtype("uint32"), np.dtype(">u4"), "=u4", np.dtype("<u4")):
        assert scalar_dtype(spelling) is u32
    assert ac.Bindings().with_scalar("uint32", [1]).scalars[u32].ty is u32


@pytest.mark.parametrize(
    ("ty", "values", "match"),
    [
        (np.uint32, [-1], "does not fit in uint32"),
        (np.int8, [128], "does not fit in int8"),
        (np.uint16, [1.5], "not an integer"),
        (np.int32, [True], "not a number"),
        (np.float16, [70000.0], "does not fit in float16"),
        (np.int32, ["3"], "not a number"),
        (np.complex64, [1], "not supported"),
        ([("a", "u4")], [1], "not supported"),  # unhashable, still refused
        ("no such dtype", [1], "not a numpy dtype"),
    ],
)
def test_bad_scalars_are_refused_with_the_reason(ty: object, values: object, match: str) -> None:
    with pytest.raises(ac.ScalarTypeError, match=match):
        ScalarBinding(ty, values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("ty", "values", "match"),
    [
        (np.uint32, np.array([-1]), r"^scalar -1 \(in the array given\) does not fit in uint32"),
        (np.int8, np.array([5, 300]), r"^scalar 300 \(in the array given\) does not fit in int8"),
        (np.uint64, np.array([2.0**64]), r"does not fit in uint64"),
        (np.int32, np.array([2.0, 1.5]), r"^scalar 1\.5 \(in the array given\) is not an integer"),
        (np.int16, np.array([np.nan], np.float32), r"^scalar nan .* is not an integer"),
        (np.float16, np.array([1e6], np.float32), r"^scalar 1000000\.0 .* does not fit in float16"),
        (np.float32, np.array([-1e300]), r"^scalar -1e\+300 .* does not fit in float32"),
        (np.int8, np.int64(300), r"^scalar 300 does not fit in int8"),
        (np.uint8, np.uint16(256), r"^scalar 256 does not fit in uint8"),
        (np.uint32, np.int32(-1), r"^scalar -1 does not fit in uint32"),
        (np.uint8, np.float64(2.5), r"^scalar np\.float64\(2\.5\) is a float64, not a uint8"),
    ],
)
def test_arrays_and_numpy_scalars_that_do_not_fit_are_refused_with_the_value(
    ty: type[np.generic], values: object, match: str
) -> None:
    with pytest.raises(ac.ScalarTypeError, match=match) as info:
        ac.Bindings().with_scalar(ty, values)  # type: ignore[arg-type]
    assert "astype" not in str(info.value)  # a cast that would wrap is never advised
    assert "an array" not in str(info.value) or isinstance(values, np.ndarray)


def test_a_numpy_scalar_that_fits_is_packed_as_numpy_packs_it() -> None:
    for ty, value in ((np.int8, np.int64(-128)), (np.uint32, np.uint8(7)), (np.float32, 2.5)):
        sb = ac.Bindings().with_scalar(ty, np.float64(value) if ty is np.float32 else value)
        assert sb.scalars[np.dtype(ty)].data == _numpy_bytes(np.dtype(ty), [value])


def test_an_array_of_another_dtype_whose_values_fit_is_told_the_cast() -> None:
    values = np.array([0, 7, 2**31], np.int64)
    with pytest.raises(ac.ScalarTypeError, match=r"every value fits.*\.astype\(np\.uint32\)"):
        ac.Bindings().with_scalar(np.uint32, values)
    packed = ac.Bindings().with_scalar(np.uint32, values.astype(np.uint32))
    assert packed.scalars[np.dtype(np.uint32)].values().tolist() == values.tolist()
    with pytest.raises(ac.ScalarTypeError, match=r"given an array of bool; convert"):
        ac.Bindings().with_scalar(np.uint8, np.array([True]))


@pytest.mark.parametrize("dt", SCALAR_DTYPES, ids=[d.name for d in SCALAR_DTYPES])
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_with_scalar_of_a_few_ints_is_packed_once_and_as_numpy_packs_it(
    dt: np.dtype[np.generic], data: st.DataObject
) -> None:
    """``with_scalar`` of up to 4 Python ints (a request's sizes) shares one packed
    ScalarBinding per dtype and values; the bytes are numpy's, whatever came first."""
    ints = [v for v in data.draw(_values(dt)) if type(v) is int][:4]
    if not ints:
        return
    first = ac.Bindings().with_scalar(dt.type, ints).scalars[dt]
    again = ac.Bindings().with_scalar(dt.type, list(ints)).scalars[dt]
    assert again is first and first.data == _numpy_bytes(dt, ints)
    assert ac.Bindings().with_scalar(dt.type, [*ints, 0][:5]).scalars[dt].length == len(ints) + 1


def test_with_scalar_refuses_bad_values_every_time_and_caches_no_other_kind() -> None:
    for _ in range(2):
        with pytest.raises(ac.ScalarTypeError, match="does not fit in uint32"):
            ac.Bindings().with_scalar(np.uint32, [-1])
        with pytest.raises(ac.ScalarTypeError, match="not a number"):
            ac.Bindings().with_scalar(np.uint32, [True])
    floats = [
        ac.Bindings().with_scalar(np.float32, [x]).scalars[np.dtype(np.float32)]
        for x in (0.0, -0.0)
    ]
    assert floats[0].data != floats[1].data  # floats are not shared: -0.0 == 0.0
    big = ac.Bindings().with_scalar(np.uint64, [2**64 - 1]).scalars[np.dtype(np.uint64)]
    assert big.data == np.array([2**64 - 1], np.uint64).tobytes()


def test_an_empty_metadata_binding_shares_one_read_only_array() -> None:
    """A Bindings' default metadata builds no array (a request builds one Bindings per
    launch): the empty data is shared and cannot be written; given data is its own."""
    a, b = ac.Bindings().metadata, ac.MetadataBinding()
    assert a is not b and a.data is b.data and a.data.size == 0
    assert a.data.dtype == np.uint32 and not a.data.flags.writeable
    with pytest.raises(ValueError):  # shared: never grown in place
        a.data.resize(4)
    given_data = ac.MetadataBinding([1, 2], static_len=1)
    assert given_data.data.tolist() == [1, 2] and given_data.data.flags.writeable
    assert ac.MetadataBinding([]).data.size == 0 and ac.MetadataBinding(()).static_len == 0
