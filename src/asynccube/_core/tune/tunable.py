"""Tunables and tunable sets: the implementations an autotuner chooses between.

A :class:`Tunable` is one named implementation of an operation: an async callable
``fn(client, inputs) -> output`` that queues its work on ``client`` (and may return
before the device is done). A :class:`TunableSet` groups the implementations of one
operation with a key generator (``inputs -> key``), an optional input generator for
benchmark inputs, and a checksum that changes whenever the meaning of a stored result
would (cubecl's ``TunableSet`` and ``compute_checksum``).
"""

from __future__ import annotations

import hashlib
import inspect
import json
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

from ..errors import InvalidArgument
from .key import AutotuneKey
from .policy import AdaptiveSampling, TuneBound

if TYPE_CHECKING:
    from ..client.client import ComputeClient

__all__ = ["Tunable", "TunableSet"]

K = TypeVar("K", bound=AutotuneKey)
In = TypeVar("In")
Out = TypeVar("Out")

TuneFn = Callable[["ComputeClient", In], Awaitable[Out]]
"""An implementation: ``async def fn(client, inputs) -> output``."""

_CHECKSUM_FORMAT = 1

BoundSpec = TuneBound | float | Callable[[Any], "TuneBound | float | None"] | None
"""A set's bound: a :class:`TuneBound`, seconds, or ``bound(key) -> either | None``."""


@dataclass(frozen=True, slots=True)
class Tunable(Generic[In, Out]):
    """One named implementation of an operation.

    Attributes:
        name: Unique within its set; stored in the cache and shown in logs.
        fn: ``async def fn(client, inputs) -> output``; it queues work on ``client``.
    """

    name: str
    fn: TuneFn[In, Out]

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise InvalidArgument(f"a tunable's name must be a non-empty str, got {self.name!r}")
        if not callable(self.fn):
            raise InvalidArgument(f"tunable {self.name!r}: fn must be an async callable")

    async def __call__(self, client: ComputeClient, inputs: In) -> Out:
        """Run the implementation."""
        out = self.fn(client, inputs)
        if not inspect.isawaitable(out):
            raise InvalidArgument(
                f"tunable {self.name!r}: fn returned {type(out).__name__}, not an awaitable; "
                f"define it as `async def {self.name}(client, inputs)` (tunables queue work "
                "on the client and are awaited)"
            )
        return await out


def _name_of(fn: Callable[..., Any]) -> str:
    return str(getattr(fn, "__name__", None) or type(fn).__name__)


class TunableSet(Generic[K, In, Out]):
    """The implementations of one operation, and how to key and benchmark them.

    Args:
        key: ``key(inputs) -> AutotuneKey``: what a result is remembered by. Use
            :func:`anchor` on sizes so that near shapes share a result.
        inputs: ``inputs(key, inputs) -> benchmark_inputs`` (sync or async): the
            inputs the benchmarks run on. Default: the caller's inputs unchanged. Give
            one when implementations write into their inputs, or to benchmark a
            canonical problem of the key's (anchored) size.
        version: Bump it when an implementation changes in a way that invalidates
            stored results (it is part of the checksum).
        default: Index or name of the implementation used before a result is known
            (background mode) and as the reference for output checks. Default: 0.
        tunables: Implementations to start with (``Tunable`` or plain functions,
            named by their ``__name__``).
        bound: A time each run should stay within: a :class:`TuneBound`, seconds, or
            ``bound(key) -> TuneBound | seconds | None`` (e.g. from a throughput
            target: ``lambda key: TuneBound.throughput(4 * key.n, 500e9)``). With
            short-circuit (the default) the first implementation, in the set's order,
            whose median is within it is taken and the rest are not benchmarked.
        sampling: :class:`AdaptiveSampling` (or True for its defaults) to stop
            sampling implementations far behind the leader; False for a fixed count;
            None (default): ``[autotune] adaptive``, ``min_samples`` and
            ``prune_ratio`` from the configuration.

    The order of implementations matters (results are stored by index and name), so
    it is part of the checksum together with the names and ``version``; so is a
    short-circuiting bound (a stored pick was the first within it, not the fastest).
    A bound given as a function enters the checksum by its name only: bump
    ``version`` when it changes.
    """

    def __init__(
        self,
        key: Callable[[In], K],
        inputs: Callable[[K, In], In | Awaitable[In]] | None = None,
        *,
        version: str = "",
        default: int | str = 0,
        tunables: Iterable[Tunable[In, Out] | TuneFn[In, Out]] = (),
        bound: BoundSpec = None,
        sampling: AdaptiveSampling | bool | None = None,
    ) -> None:
        if not callable(key):
            raise InvalidArgument("TunableSet: key= must be a callable inputs -> AutotuneKey")
        if inputs is not None and not callable(inputs):
            raise InvalidArgument("TunableSet: inputs= must be a callable (key, inputs) -> ...")
        if not isinstance(version, str):
            raise InvalidArgument(f"TunableSet: version must be a str, got {version!r}")
        if isinstance(default, bool) or not isinstance(default, int | str):
            raise InvalidArgument(
                f"TunableSet: default must be an index or a tunable's name, got {default!r}"
            )
        self._key = key
        self._inputs = inputs
        self._bound = _bound_spec(bound)
        self._sampling = _sampling(sampling)
        self.version = version
        self._default = default
        self._tunables: list[Tunable[In, Out]] = []
        self._checksum: str | None = None
        for t in tunables:
            self.add(t)
        if self._tunables:  # else the decorator adds them later: checked at first use
            _ = self.default_index  # raises for a default not among them

    def __repr__(self) -> str:
        return f"TunableSet({list(self.names)!r}, version={self.version!r})"

    @property
    def bound(self) -> BoundSpec:
        """The ``bound`` given (seconds given as a :class:`TuneBound`)."""
        return self._bound

    @property
    def sampling(self) -> AdaptiveSampling | bool | None:
        """The ``sampling`` given (True given as the :class:`AdaptiveSampling` defaults)."""
        return self._sampling

    def bound_for(self, key: K) -> TuneBound | None:
        """The set's :class:`TuneBound` for ``key`` (None: no bound)."""
        spec = self._bound
        if spec is None or isinstance(spec, TuneBound):
            return spec
        got = spec(key) if callable(spec) else spec
        if got is None or isinstance(got, TuneBound):
            return got
        if isinstance(got, bool) or not isinstance(got, int | float):
            raise InvalidArgument(
                f"TunableSet: bound({key}) returned {got!r}; return a TuneBound, seconds or None"
            )
        return TuneBound(got)

    # -- building -------------------------------------------------------------------

    def add(
        self, fn: Tunable[In, Out] | TuneFn[In, Out], name: str | None = None
    ) -> TunableSet[K, In, Out]:
        """Append an implementation (a :class:`Tunable`, or a function named ``name``
        or by its ``__name__``); returns the set, for chaining."""
        tunable = fn if isinstance(fn, Tunable) else Tunable(name or _name_of(fn), fn)
        if isinstance(fn, Tunable) and name is not None and name != fn.name:
            tunable = Tunable(name, fn.fn)
        if tunable.name in self.names:
            raise InvalidArgument(f"this set already has a tunable named {tunable.name!r}")
        self._tunables.append(tunable)
        self._checksum = None
        return self

    def tunable(self, name: str | None = None) -> Callable[[TuneFn[In, Out]], TuneFn[In, Out]]:
        """Decorator form of :meth:`add`: ``@tunables.tunable("tiled_128")``."""

        def register(fn: TuneFn[In, Out]) -> TuneFn[In, Out]:
            self.add(fn, name)
            return fn

        return register

    # -- access ---------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._tunables)

    def __iter__(self) -> Iterator[Tunable[In, Out]]:
        return iter(self._tunables)

    def __getitem__(self, item: int | str) -> Tunable[In, Out]:
        if type(item) is int and 0 <= item < len(self._tunables):  # the hot path
            return self._tunables[item]
        return self._tunables[self.index_of(item)]

    @property
    def names(self) -> tuple[str, ...]:
        """The implementations' names, in order."""
        return tuple(t.name for t in self._tunables)

    def index_of(self, item: int | str) -> int:
        """The index of implementation ``item`` (an index or a name)."""
        if type(item) is int and 0 <= item < len(self._tunables):  # the hot path
            return item
        if isinstance(item, str):
            try:
                return self.names.index(item)
            except ValueError:
                raise InvalidArgument(
                    f"no tunable named {item!r}; the set has {list(self.names)}"
                ) from None
        if isinstance(item, bool) or not isinstance(item, int):
            raise InvalidArgument(f"a tunable is chosen by index or name, got {item!r}")
        if not -len(self) <= item < len(self):
            raise InvalidArgument(f"tunable index {item} out of range for {len(self)} tunables")
        return item % len(self)

    @property
    def default_index(self) -> int:
        """The index of the default implementation."""
        if not self._tunables:
            raise InvalidArgument("this TunableSet has no tunables; add() some first")
        try:
            return self.index_of(self._default)
        except InvalidArgument as exc:
            raise InvalidArgument(
                f"TunableSet: default={self._default!r} is not one of its tunables: {exc}; "
                "pass the index or name of one of them"
            ) from None

    # -- keys, inputs, checksum -----------------------------------------------------

    def generate_key(self, inputs: In) -> K:
        """The key of ``inputs``."""
        key = self._key(inputs)
        if not isinstance(key, AutotuneKey):
            raise InvalidArgument(
                f"the key generator returned {type(key).__name__}, not an AutotuneKey "
                "(subclass ac.AutotuneKey with annotated fields)"
            )
        return key

    async def generate_inputs(self, key: K, inputs: In) -> In:
        """The benchmark inputs for ``key`` (the caller's inputs when no generator)."""
        if self._inputs is None:
            return inputs
        out: Any = self._inputs(key, inputs)
        if inspect.isawaitable(out):
            out = await out
        return cast(In, out)

    def checksum(self) -> str:
        """sha256 of what gives stored results their meaning: the implementations'
        names in order, their number and ``version``. A stored result whose checksum
        differs is discarded and the key retuned."""
        if self._checksum is None:
            doc: dict[str, Any] = {
                "format": _CHECKSUM_FORMAT,
                "names": self.names,
                "version": self.version,
            }
            if (bound := _bound_checksum(self._bound)) is not None:
                doc["bound"] = bound
            text = json.dumps(doc, sort_keys=True, separators=(",", ":"))
            self._checksum = hashlib.sha256(text.encode()).hexdigest()
        return self._checksum


def _bound_spec(bound: object) -> BoundSpec:
    if bound is None or isinstance(bound, TuneBound) or callable(bound):
        return cast(BoundSpec, bound)
    if isinstance(bound, bool) or not isinstance(bound, int | float):
        raise InvalidArgument(
            f"TunableSet: bound must be a TuneBound, seconds, or a callable key -> bound, "
            f"got {bound!r}"
        )
    return TuneBound(bound)


def _sampling(sampling: object) -> AdaptiveSampling | bool | None:
    if sampling is None or isinstance(sampling, AdaptiveSampling | bool):
        return AdaptiveSampling() if sampling is True else sampling
    raise InvalidArgument(
        f"TunableSet: sampling must be an AdaptiveSampling, True, False or None, got {sampling!r}"
    )


def _bound_checksum(bound: BoundSpec) -> str | None:
    """What of a bound gives stored results their meaning (None: nothing)."""
    if bound is None or (isinstance(bound, TuneBound) and not bound.short_circuit):
        return None
    if isinstance(bound, TuneBound):
        return repr(bound.seconds)
    return "callable:" + str(getattr(bound, "__qualname__", None) or type(bound).__qualname__)
