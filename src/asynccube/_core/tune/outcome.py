"""What tuning produces: the outcome of each implementation, and the result of a key
(the fastest implementation and every outcome), with their on-disk dictionaries."""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import AutotuneError
from .key import AutotuneKey
from .policy import TuneReason

__all__ = ["AutotuneOutcome", "TuneResult"]


@dataclass(frozen=True, slots=True)
class AutotuneOutcome:
    """How one implementation did for one key (cubecl's ``AutotuneOutcome``).

    Attributes:
        name: The implementation's name.
        index: Its index in the tunable set.
        median_ns: Median of the samples (None if it failed).
        mean_ns: Mean of the samples.
        min_ns: Fastest sample.
        max_ns: Slowest sample.
        samples_ns: Every profiled sample, in nanoseconds.
        error: ``"ErrorType: message"`` if it failed, else None.
        pruned: True if adaptive sampling stopped sampling it, far behind the leader
            (its statistics are over the samples it got).
    """

    name: str
    index: int
    median_ns: int | None = None
    mean_ns: int | None = None
    min_ns: int | None = None
    max_ns: int | None = None
    samples_ns: tuple[int, ...] = ()
    error: str | None = None
    pruned: bool = False

    @classmethod
    def from_samples(
        cls, name: str, index: int, samples_ns: Sequence[int], *, pruned: bool = False
    ) -> AutotuneOutcome:
        """The outcome of a successful benchmark (``pruned``: stopped early)."""
        if not samples_ns:
            raise AutotuneError(f"tunable {name!r}: a benchmark needs at least one sample")
        samples = tuple(int(s) for s in samples_ns)
        return cls(
            name,
            index,
            median_ns=int(statistics.median(samples)),
            mean_ns=int(statistics.fmean(samples)),
            min_ns=min(samples),
            max_ns=max(samples),
            samples_ns=samples,
            pruned=pruned,
        )

    @classmethod
    def failed(cls, name: str, index: int, error: BaseException | str) -> AutotuneOutcome:
        """The outcome of an implementation that raised ``error``."""
        text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        return cls(name, index, error=text)

    @property
    def ok(self) -> bool:
        """True if the implementation ran."""
        return self.error is None

    @property
    def sort_key(self) -> float:
        """Median seconds, infinite for failures (for ranking)."""
        return float("inf") if self.median_ns is None else self.median_ns / 1e9

    def __str__(self) -> str:
        if self.error is not None:
            return f"{self.name} [{self.index}]: failed: {self.error}"
        return (
            f"{self.name} [{self.index}]: median {_ms(self.median_ns)} "
            f"(min {_ms(self.min_ns)}, max {_ms(self.max_ns)}, n={len(self.samples_ns)})"
            + (", pruned" if self.pruned else "")
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (failures keep only name, index and error)."""
        if self.error is not None:
            return {"name": self.name, "index": self.index, "error": self.error}
        pruned = {"pruned": True} if self.pruned else {}
        return {
            "name": self.name,
            "index": self.index,
            "median_ns": self.median_ns,
            "mean_ns": self.mean_ns,
            "min_ns": self.min_ns,
            "max_ns": self.max_ns,
            "samples_ns": list(self.samples_ns),
        } | pruned

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AutotuneOutcome:
        """Inverse of :meth:`to_dict` (raises ValueError/TypeError/KeyError if malformed)."""
        name, index = str(data["name"]), _int(data["index"])
        if data.get("error") is not None:
            return cls(name, index, error=str(data["error"]))
        pruned = data.get("pruned", False)
        if not isinstance(pruned, bool):
            raise TypeError(f"pruned must be a bool, got {pruned!r}")
        samples = [_int(s) for s in data["samples_ns"]]
        out = cls.from_samples(name, index, samples, pruned=pruned)
        if _int(data["median_ns"]) != out.median_ns:
            raise ValueError("median_ns does not match samples_ns")
        return out


def _ms(ns: int | None) -> str:
    return "-" if ns is None else f"{ns / 1e6:.3f} ms"


def _int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an int, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class TuneResult:
    """The result of tuning one key.

    Attributes:
        fastest_index: Index of the implementation to use.
        fastest_name: Its name.
        checksum: The tunable set's checksum when it was tuned.
        outcomes: The outcome of every implementation benchmarked, fastest first (empty
            when the set had a single implementation, which is used without
            benchmarking; without those a bound left unbenchmarked: ``skipped``).
        source: ``"tuned"`` (this process), ``"disk"`` (read from the cache file) or
            ``"single"`` (one implementation, nothing to tune).
        reason: Why this implementation was picked (:class:`TuneReason`).
        bound_s: The set's :class:`TuneBound` for the key, in seconds (None: none).
        skipped: Names of the implementations not benchmarked, because one before them
            met the bound.
    """

    fastest_index: int
    fastest_name: str
    checksum: str
    outcomes: tuple[AutotuneOutcome, ...] = ()
    source: str = field(default="tuned", compare=False)
    reason: TuneReason = TuneReason.ALL_BENCHMARKED
    bound_s: float | None = None
    skipped: tuple[str, ...] = ()

    @property
    def pruned(self) -> tuple[str, ...]:
        """Names of the implementations adaptive sampling stopped sampling, in the
        set's order."""
        return tuple(o.name for o in sorted(self.outcomes, key=lambda o: o.index) if o.pruned)

    @property
    def within_bound(self) -> bool | None:
        """Whether the pick's median is within ``bound_s`` (None without a bound, or
        without a measured pick)."""
        pick = next((o for o in self.outcomes if o.index == self.fastest_index), None)
        if self.bound_s is None or pick is None or pick.median_ns is None:
            return None
        return pick.median_ns <= self.bound_s * 1e9

    def explain(self) -> str:
        """Why the pick was made, in words (as the autotune log says it)."""
        bound = "" if self.bound_s is None else f" (bound {self.bound_s * 1e3:.6g} ms)"
        if self.reason is TuneReason.BOUND_MET:
            return f"first within the bound{bound}; {len(self.skipped)} not benchmarked"
        if self.reason is TuneReason.SINGLE:
            return "the only implementation"
        met = {True: ", within the bound", False: ", none within the bound", None: ""}
        text = f"fastest of {len(self.outcomes)}{bound}{met[self.within_bound]}"
        if self.reason is TuneReason.PRUNED:
            text += f"; pruned early: {', '.join(self.pruned)}"
        return text

    def to_dict(self, key: AutotuneKey) -> dict[str, Any]:
        """The on-disk record of this result for ``key``."""
        return {
            "key": key.to_dict(),
            "key_type": type(key).__qualname__,
            "checksum": self.checksum,
            "fastest_index": self.fastest_index,
            "fastest_name": self.fastest_name,
            "outcomes": [o.to_dict() for o in self.outcomes],
            "reason": self.reason.value,
            "bound_s": self.bound_s,
            "skipped": list(self.skipped),
            "tuned_at": time.time(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TuneResult:
        """Inverse of :meth:`to_dict` (raises ValueError/TypeError/KeyError if malformed;
        an entry written before reasons were recorded reads as all benchmarked)."""
        outcomes = tuple(AutotuneOutcome.from_dict(o) for o in data["outcomes"])
        bound = data.get("bound_s")
        if bound is not None and (isinstance(bound, bool) or not isinstance(bound, int | float)):
            raise TypeError(f"bound_s must be a number, got {bound!r}")
        skipped = data.get("skipped", [])
        if not isinstance(skipped, list) or not all(isinstance(s, str) for s in skipped):
            raise TypeError(f"skipped must be a list of names, got {skipped!r}")
        return cls(
            _int(data["fastest_index"]),
            str(data["fastest_name"]),
            str(data["checksum"]),
            outcomes,
            source="disk",
            reason=TuneReason(data.get("reason", TuneReason.ALL_BENCHMARKED.value)),
            bound_s=None if bound is None else float(bound),
            skipped=tuple(skipped),
        )
