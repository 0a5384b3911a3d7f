"""Autotune keys, anchor() and tunable sets: no client needed."""

from __future__ import annotations

import dataclasses
import enum
import json
from collections import Counter

import numpy as np
import pytest

import asynccube as ac

from .tune_helpers import SizeKey, size_key, sleeper


class MatmulKey(ac.AutotuneKey):
    m: int
    n: int
    k: int
    dtype: str = "float32"
    layout: tuple[int, ...] = (0, 1)


class Layout(enum.StrEnum):
    ROW = "row"
    COL = "col"


class LayoutKey(ac.AutotuneKey):
    layout: str
    n: int


@dataclasses.dataclass(frozen=True)
class DecoratedKey(ac.AutotuneKey):
    n: int


class ChildKey(MatmulKey):
    batch: int = 1


# -- anchor -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "kwargs", "expected"),
    [
        ((1000,), {}, 1024),
        ((1024,), {}, 1024),
        ((1025,), {}, 2048),
        ((1,), {}, 1),
        ((0,), {}, 1),
        ((3,), {}, 4),
        ((5,), {"exp": 4}, 16),
        ((17,), {"exp": 4}, 64),
        ((100,), {"exp": 10}, 100),
        ((101,), {"exp": 10}, 1000),
        ((3,), {"min": 32}, 32),
        ((10**6,), {"max": 4096}, 4096),
        ((100,), {"min": 16, "max": 64}, 64),
        ((np.int64(1000),), {}, 1024),
        ((2,), {"exp": 1.5}, 2),
        ((3,), {"exp": 1.5}, 3),
        ((4,), {"exp": 1.5}, 5),
        ((2**40 + 1,), {}, 2**41),
    ],
)
def test_anchor_buckets_to_powers(args: tuple[int], kwargs: dict[str, int], expected: int) -> None:
    assert ac.anchor(*args, **kwargs) == expected


def test_anchor_near_sizes_share_a_bucket() -> None:
    assert len({ac.anchor(n) for n in range(1025, 2049)}) == 1
    assert ac.anchor(1024) != ac.anchor(1025)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"x": 1.5},
        {"x": True},
        {"x": 4, "exp": 1},
        {"x": 4, "exp": 0.5},
        {"x": 4, "exp": "2"},
        {"x": 4, "exp": float("inf")},
        {"x": "8"},
    ],
)
def test_anchor_rejects_bad_arguments(kwargs: dict[str, object]) -> None:
    with pytest.raises(ac.InvalidArgument):
        ac.anchor(**kwargs)  # type: ignore[arg-type]


# -- keys -------------------------------------------------------------------------------


def test_key_is_a_hashable_value() -> None:
    a, b = MatmulKey(64, 64, 32), MatmulKey(m=64, n=64, k=32)
    assert a == b
    assert hash(a) == hash(b)
    assert len({a, b, MatmulKey(64, 64, 64)}) == 2
    assert a != ChildKey(64, 64, 32)


def test_key_prints_its_fields() -> None:
    text = str(MatmulKey(64, 32, 16))
    assert text.startswith("MatmulKey(")
    assert "m=64" in text
    assert "dtype='float32'" in text


def test_key_is_immutable() -> None:
    key = MatmulKey(1, 2, 3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        key.m = 5  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        del key.m


def test_key_round_trips_through_json() -> None:
    key = MatmulKey(64, 32, 16, layout=(1, 0))
    text = key.to_json()
    assert json.loads(text) == {"m": 64, "n": 32, "k": 16, "dtype": "float32", "layout": [1, 0]}
    assert MatmulKey.from_json(text) == key
    assert MatmulKey.from_dict(key.to_dict()) == key
    assert text == MatmulKey(m=64, n=32, k=16, layout=[1, 0]).to_json()  # type: ignore[arg-type]


def test_key_values_are_normalized() -> None:
    key = MatmulKey(
        np.int64(8),  # type: ignore[arg-type]
        np.uint32(4),  # type: ignore[arg-type]
        2,
        dtype=np.dtype(np.float16),  # type: ignore[arg-type]
        layout=[1, 0],  # type: ignore[arg-type]
    )
    assert key == MatmulKey(8, 4, 2, dtype="float16", layout=(1, 0))
    assert type(key.m) is int
    assert key.layout == (1, 0)
    layout = LayoutKey(Layout.COL, 3)
    assert layout.layout == "col"
    assert type(layout.layout) is str
    assert LayoutKey.from_json(layout.to_json()) == layout


@pytest.mark.parametrize("bad", [{"a": 1}, np.zeros(3), object(), [1, {2}]])
def test_key_rejects_values_json_cannot_hold(bad: object) -> None:
    with pytest.raises(ac.InvalidArgument, match=r"MatmulKey\.m"):
        MatmulKey(bad, 1, 1)  # type: ignore[arg-type]


def test_from_dict_rejects_unknown_fields() -> None:
    with pytest.raises(ac.InvalidArgument, match="nope"):
        MatmulKey.from_dict({"m": 1, "n": 1, "k": 1, "nope": 2})
    with pytest.raises(ac.InvalidArgument):
        MatmulKey.from_json("{not json")


def test_decorating_and_subclassing_keys_work() -> None:
    assert DecoratedKey(3) == DecoratedKey.from_json(DecoratedKey(3).to_json())
    assert hash(DecoratedKey(3)) == hash(DecoratedKey(3))
    child = ChildKey(1, 2, 3, batch=4)
    assert ChildKey.from_json(child.to_json()) == child


# -- tunable sets -----------------------------------------------------------------------


def test_set_generates_keys_and_defaults_to_index_zero() -> None:
    calls: Counter[str] = Counter()
    ts = ac.TunableSet(size_key, tunables=[sleeper(1, calls, "a"), sleeper(2, calls, "b")])
    assert ts.generate_key(1000) == SizeKey(1024)
    assert ts.names == ("a", "b")
    assert ts.default_index == 0
    assert ts["b"].name == "b"
    assert ts[1].name == "b"
    assert ts.index_of("b") == 1


def test_set_default_by_name_and_bad_references() -> None:
    calls: Counter[str] = Counter()
    with pytest.raises(ac.InvalidArgument, match="default='b' is not one of its tunables"):
        ac.TunableSet(size_key, default="b", tunables=[sleeper(1, calls, "a")])
    ts = ac.TunableSet(size_key, default="b")  # an empty set is filled later (decorator)
    ts.add(sleeper(1, calls, "a"))
    with pytest.raises(ac.InvalidArgument, match="no tunable named 'b'"):
        _ = ts.default_index
    ts.add(sleeper(2, calls, "b"))
    assert ts.default_index == 1
    with pytest.raises(ac.InvalidArgument, match="out of range"):
        ts.index_of(5)
    with pytest.raises(ac.InvalidArgument, match="already has"):
        ts.add(sleeper(3, calls, "a"))


def test_set_adds_plain_functions_and_decorated_ones() -> None:
    ts: ac.TunableSet[SizeKey, int, int] = ac.TunableSet(size_key)

    async def one(client: ac.ComputeClient, n: int) -> int:
        return 1

    ts.add(one)

    @ts.tunable("two")
    async def second(client: ac.ComputeClient, n: int) -> int:
        return 2

    assert ts.names == ("one", "two")


def test_key_generator_must_return_a_key() -> None:
    ts: ac.TunableSet[SizeKey, int, int] = ac.TunableSet(lambda n: n)  # type: ignore[arg-type,return-value]
    with pytest.raises(ac.InvalidArgument, match="AutotuneKey"):
        ts.generate_key(3)


def test_checksum_follows_names_order_and_version() -> None:
    calls: Counter[str] = Counter()

    def make(names: list[str], version: str = "") -> str:
        ts: ac.TunableSet[SizeKey, int, str] = ac.TunableSet(size_key, version=version)
        for name in names:
            ts.add(sleeper(0, calls, name))
        return ts.checksum()

    base = make(["a", "b"])
    assert base == make(["a", "b"])  # stable
    assert base != make(["b", "a"])
    assert base != make(["a", "b", "c"])
    assert base != make(["a", "b"], version="2")
    ts = ac.TunableSet(size_key, tunables=[sleeper(0, calls, "a")])
    before = ts.checksum()
    ts.add(sleeper(0, calls, "b"))
    assert ts.checksum() != before
