"""Autotune keys: what an autotune result is remembered by (cubecl's ``AutotuneKey``).

A key describes the *shape* of a problem, not its data: two calls with equal keys share
one tuning result. Declare one by subclassing :class:`AutotuneKey` with annotated
fields; the subclass becomes a frozen, hashable dataclass on its own::

    class ReduceKey(ac.AutotuneKey):
        n: int
        dtype: str = "float32"

    key = ReduceKey(n=ac.anchor(len(x)), dtype=str(x.dtype))

Use :func:`anchor` on sizes so that near shapes fall in the same bucket.
"""

from __future__ import annotations

import builtins
import dataclasses
import enum
import functools
import json
import math
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeAlias, TypeVar, dataclass_transform

import numpy as np

from ..errors import InvalidArgument

__all__ = ["AutotuneKey", "KeyValue", "anchor"]

KeyValue: TypeAlias = "int | float | str | bool | tuple[KeyValue, ...] | None"
"""What a key field may hold (after normalization)."""

K = TypeVar("K", bound="AutotuneKey")

_PLAIN: frozenset[type] = frozenset({int, float, str, bool, type(None)})
"""Types a key field may hold as they are."""


def anchor(
    x: int,
    exp: float | None = None,
    min: int | None = None,
    max: int | None = None,
) -> int:
    """Round ``x`` up to a power of ``exp`` (the base, default 2), then clamp to
    ``[min, max]``.

    As cubecl's ``anchor``: near sizes share a bucket, so they share one tuning
    result. ``anchor(1000) == 1024``, ``anchor(1025) == 2048``, ``anchor(5, exp=4) ==
    16``, ``anchor(3, min=32) == 32``, ``anchor(10**6, max=4096) == 4096``. Sizes below
    1 anchor to 1 (before clamping). A fractional base (``exp=1.5``) gives finer
    buckets; its powers are rounded down, as cubecl does, which never goes below ``x``.
    """
    value = _power_at_least(_as_int(x, "x"), _base(exp))
    if max is not None:
        value = builtins.min(value, _as_int(max, "max"))
    if min is not None:
        value = builtins.max(value, _as_int(min, "min"))
    return value


def _base(exp: object) -> float:
    if exp is None:
        return 2
    if isinstance(exp, bool) or not isinstance(exp, int | float | np.integer | np.floating):
        raise InvalidArgument(f"anchor: exp (the base) must be a number, got {exp!r}")
    if not float(exp) > 1.0 or not math.isfinite(float(exp)):
        raise InvalidArgument(f"anchor: exp (the base) must be > 1, got {exp!r}")
    return int(exp) if float(exp).is_integer() else float(exp)


def _power_at_least(x: int, base: float) -> int:
    if base == 2:
        return 1 << (x - 1).bit_length() if x > 1 else 1
    power: float = 1
    while power < x:
        power *= base
    return int(power)


def _as_int(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise InvalidArgument(f"anchor: {name} must be an int, got {value!r}")
    return int(value)


# -- normalization of field values ----------------------------------------------------


def normalize_value(value: object, where: str) -> KeyValue:
    """``value`` as a JSON-able, hashable key value (see :class:`AutotuneKey`)."""
    if isinstance(value, enum.Enum):  # before str/int: StrEnum and IntEnum are both
        return normalize_value(value.value, where)
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, np.generic):
        return normalize_value(value.item(), where)
    if isinstance(value, np.dtype):
        return str(value)
    if isinstance(value, tuple | list):
        return tuple(normalize_value(v, where) for v in value)
    raise InvalidArgument(
        f"{where}: an autotune key field must be an int, float, str, bool, None, enum, "
        f"numpy scalar or dtype, or a tuple of those; got {type(value).__name__} {value!r}"
    )


def _from_json(value: object) -> KeyValue:
    if isinstance(value, list):
        return tuple(_from_json(v) for v in value)
    return value  # type: ignore[return-value]


# -- the base class -----------------------------------------------------------------


def _normalizing(cls: type[AutotuneKey], init: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(init)
    def init_then_normalize(self: AutotuneKey, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        if type(self) is cls:
            self._normalize()

    init_then_normalize._ac_normalizing = True  # type: ignore[attr-defined]
    return init_then_normalize


@dataclass_transform(frozen_default=True, eq_default=True)
class AutotuneKey:
    """Base class of autotune keys: subclass it with annotated fields.

    Each subclass is made a dataclass (decorating it with
    ``@dataclasses.dataclass(frozen=True)`` as well is allowed): instances are
    immutable, compare by value, hash, print as ``ReduceKey(n=1024, dtype='float32')``
    and serialize to a stable JSON object.

    Field values are normalized when a key is made: numpy scalars become Python
    ones, numpy dtypes their names, enums their values, lists tuples. Anything else
    (dicts, arrays, objects) raises :class:`~asynccube.InvalidArgument`: a key must
    survive a round trip through JSON unchanged, as the on-disk cache relies on it.
    """

    __ac_key_fields__: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        dataclasses.dataclass(cls, eq=True, frozen=True)
        # The base class keeps instances immutable; dropping the per-class methods lets
        # a user's own @dataclass(frozen=True) on the subclass run without a clash.
        for name in ("__setattr__", "__delattr__"):
            if name in cls.__dict__:
                delattr(cls, name)
        cls.__ac_key_fields__ = tuple(f.name for f in dataclasses.fields(cls))  # type: ignore[arg-type]
        if not getattr(cls.__init__, "_ac_normalizing", False):
            cls.__init__ = _normalizing(cls, cls.__init__)  # type: ignore[method-assign]

    def __setattr__(self, name: str, value: object) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")

    def _normalize(self) -> None:
        values = self.__dict__
        for name in type(self).__ac_key_fields__:
            value = values[name]
            if type(value) not in _PLAIN:  # the common case costs one set lookup
                where = f"{type(self).__name__}.{name}"
                object.__setattr__(self, name, normalize_value(value, where))

    # -- serialization --------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON-able dict (tuples become lists)."""
        return {name: _to_json(getattr(self, name)) for name in _field_names(type(self))}

    def to_json(self) -> str:
        """A stable JSON text of the fields (sorted keys, no spaces): the cache id."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_dict(cls: type[K], data: Mapping[str, Any]) -> K:
        """The key whose :meth:`to_dict` is ``data``."""
        if not isinstance(data, Mapping):
            raise InvalidArgument(f"{cls.__name__}.from_dict needs a mapping, got {data!r}")
        names = set(_field_names(cls))
        unknown = set(data) - names
        if unknown:
            raise InvalidArgument(f"{cls.__name__} has no fields {sorted(unknown)}")
        return cls(**{k: _from_json(v) for k, v in data.items()})

    @classmethod
    def from_json(cls: type[K], text: str) -> K:
        """The key whose :meth:`to_json` is ``text``."""
        try:
            data = json.loads(text)
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(f"not a serialized {cls.__name__}: {text!r}") from exc
        return cls.from_dict(data)

    @classmethod
    def schema(cls) -> str:
        """The key type and its field names, e.g. ``mod.ReduceKey(n,dtype)`` (part of a
        tunable set's checksum: changing the fields changes what a key means)."""
        return f"{cls.__module__}.{cls.__qualname__}({','.join(_field_names(cls))})"


def _field_names(cls: type[AutotuneKey]) -> tuple[str, ...]:
    return cls.__ac_key_fields__


def _to_json(value: object) -> Any:
    if isinstance(value, tuple):
        return [_to_json(v) for v in value]
    return value
