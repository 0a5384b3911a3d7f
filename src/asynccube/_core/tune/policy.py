"""How hard the tuner looks: a time bound that ends the search at the first candidate
fast enough (:class:`TuneBound`), adaptive sampling that stops timing candidates far
behind the leader (:class:`AdaptiveSampling`), and why a pick was made
(:class:`TuneReason`)."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Final

from ..errors import InvalidArgument

__all__ = [
    "DEFAULT_MIN_SAMPLES",
    "DEFAULT_PRUNE_RATIO",
    "AdaptiveSampling",
    "TuneBound",
    "TuneReason",
    "check_positive",
]

DEFAULT_MIN_SAMPLES: Final = 3
"""Samples every candidate gets before adaptive sampling may stop timing it."""

DEFAULT_PRUNE_RATIO: Final = 2.0
"""A candidate whose fastest sample is more than this many times the leader's median
stops being sampled."""


def check_positive(what: str, value: object, hint: str) -> float:
    """``value`` as a float if it is a finite real number > 0; else InvalidArgument."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgument(f"{what} must be a number > 0, got {value!r}; {hint}")
    number = float(value)
    if not math.isfinite(number) or number <= 0:
        raise InvalidArgument(f"{what} must be finite and > 0, got {value!r}; {hint}")
    return number


@dataclass(frozen=True, slots=True)
class TuneBound:
    """A time a tunable set's implementations should stay within, per run.

    With ``short_circuit`` (the default), the tuner benchmarks the implementations in
    the set's order and takes the first whose median is within ``seconds``; the rest
    are not benchmarked. When none is, every one has been benchmarked and the fastest
    wins. Without ``short_circuit`` every implementation is benchmarked and the fastest
    wins; the result still says whether it met the bound
    (:attr:`TuneResult.within_bound`).

    Attributes:
        seconds: The bound, in seconds (finite, > 0).
        short_circuit: Stop at the first implementation within the bound.

    Raises:
        InvalidArgument: ``seconds`` is not a finite number > 0.
    """

    seconds: float
    short_circuit: bool = True

    def __post_init__(self) -> None:
        seconds = check_positive(
            "TuneBound: seconds", self.seconds, "give the time one run may take, e.g. 1e-3"
        )
        object.__setattr__(self, "seconds", seconds)
        if not isinstance(self.short_circuit, bool):
            raise InvalidArgument(
                f"TuneBound: short_circuit must be a bool, got {self.short_circuit!r}"
            )

    @classmethod
    def throughput(
        cls, nbytes: float, bytes_per_second: float, *, short_circuit: bool = True
    ) -> TuneBound:
        """The bound that moving ``nbytes`` at ``bytes_per_second`` allows:
        ``TuneBound.throughput(4 * n, 500e9)`` for an ``n``-float32 pass at 500 GB/s.

        Raises:
            InvalidArgument: either number is not finite and > 0.
        """
        size = check_positive(
            "TuneBound.throughput: nbytes", nbytes, "give the bytes one run moves"
        )
        rate = check_positive(
            "TuneBound.throughput: bytes_per_second",
            bytes_per_second,
            "give the target rate, e.g. 500e9",
        )
        return cls(size / rate, short_circuit)

    @property
    def ns(self) -> int:
        """The bound in nanoseconds (as samples are measured)."""
        return max(1, round(self.seconds * 1e9))

    def __str__(self) -> str:
        return f"{self.seconds * 1e3:.6g} ms"


@dataclass(frozen=True, slots=True)
class AdaptiveSampling:
    """Sample every implementation ``min_samples`` times, then keep sampling only the
    contenders: after each round, an implementation whose fastest sample is more than
    ``prune_ratio`` times the leader's median (the lowest median so far) is *pruned*
    (sampled no more, and out of the running); the others continue, one sample each
    per round, up to ``max_samples``, or until one is left. The lowest median wins.

    Attributes:
        min_samples: Samples before any implementation may be pruned (>= 1).
        max_samples: Samples of the contenders at most; None: the tuner's ``samples``,
            else ``[autotune] level`` (minimal 3, balanced 10, extensive 25, full 50).
            Where that count is below ``min_samples``, no one is pruned.
        prune_ratio: How far behind the leader an implementation is pruned (> 1).
            The default 2 keeps any implementation whose best run is within twice the
            leader's median: noise does not prune a true contender.

    Raises:
        InvalidArgument: a count is not an int >= 1, ``min_samples > max_samples``,
            or ``prune_ratio`` is not a finite number > 1.
    """

    min_samples: int = DEFAULT_MIN_SAMPLES
    max_samples: int | None = None
    prune_ratio: float = DEFAULT_PRUNE_RATIO

    def __post_init__(self) -> None:
        _check_count("min_samples", self.min_samples)
        if self.max_samples is not None:
            _check_count("max_samples", self.max_samples)
            if self.min_samples > self.max_samples:
                raise InvalidArgument(
                    f"AdaptiveSampling: min_samples={self.min_samples} > "
                    f"max_samples={self.max_samples}; lower min_samples or raise max_samples"
                )
        ratio = check_positive(
            "AdaptiveSampling: prune_ratio", self.prune_ratio, "e.g. 2.0 (twice the leader)"
        )
        if ratio <= 1:
            raise InvalidArgument(
                f"AdaptiveSampling: prune_ratio must be > 1, got {self.prune_ratio!r}; at 1 "
                "or below the leader itself could be pruned"
            )
        object.__setattr__(self, "prune_ratio", ratio)


def _check_count(what: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgument(f"AdaptiveSampling: {what} must be an int >= 1, got {value!r}")


class TuneReason(enum.StrEnum):
    """Why a :class:`TuneResult` picked its implementation."""

    ALL_BENCHMARKED = "all_benchmarked"
    """Every implementation was sampled to the full count; the lowest median won."""
    PRUNED = "pruned"
    """Adaptive sampling pruned some implementations (see each outcome's ``pruned``);
    the lowest median of the rest won."""
    BOUND_MET = "bound_met"
    """The pick was the first implementation within the set's :class:`TuneBound`; the
    ones after it (``TuneResult.skipped``) were not benchmarked."""
    SINGLE = "single"
    """The set has one implementation: nothing was benchmarked."""
