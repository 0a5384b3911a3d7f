"""Profiling bookkeeping: tokens, per-kernel records, and summaries.

* :class:`Profiler` hands out :class:`~asynccube._core.values.types.ProfilingToken` ids and
  keeps each active profile's start (a timestamp, and whatever the server attaches,
  such as a CUDA event). Profiles nest and overlap freely: each token is independent.
  Ending an unknown or already-ended token raises
  :class:`~asynccube._core.errors.ProfileError`. It is pure bookkeeping: the server
  decides when to synchronize and how to time.
* :class:`KernelRecorder` collects one :class:`KernelRecord` per kernel, copy and wait
  when the profiling level is ``medium`` or ``full`` (see
  :class:`~asynccube._core.config.config.ProfilingLevel`); otherwise ``record`` returns after
  one attribute test. Servers may guard with ``if recorder.enabled:`` to skip building
  the arguments too.
* :class:`ProfileSummary` aggregates durations by name (count, total, mean, min, max),
  for ``client.profile(name)`` and for kernel records.

All timestamps are integer nanoseconds on one monotonic clock (``time.perf_counter_ns``
unless a server says otherwise); device timestamps are converted onto it by the server.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Final, Generic, Literal, TypeVar

from ..config.config import ProfilingConfig, ProfilingLevel
from ..errors import InvalidArgument, ProfileError
from ..html import html_table
from ..values.types import ProfileDuration, ProfilingToken, TimingMethod

__all__ = [
    "ActiveProfile",
    "Clock",
    "KernelRecord",
    "KernelRecorder",
    "Profiler",
    "ProfileStats",
    "ProfileSummary",
    "RecordKind",
    "format_ns",
    "profile_summary_html",
]

P = TypeVar("P")

Clock = Callable[[], int]
"""A monotonic clock in integer nanoseconds."""

RecordKind = Literal["kernel", "copy", "wait"]
"""What a :class:`KernelRecord` describes: a kernel launch, a copy, or a stream waiting
on another stream's event."""
RECORD_KINDS: Final[frozenset[str]] = frozenset({"kernel", "copy", "wait"})


def format_ns(ns: float) -> str:
    """A duration for people: ``"850 ns"``, ``"12.35 µs"``, ``"3.20 ms"``, ``"1.234 s"``."""
    magnitude = abs(ns)
    if magnitude < 1e3:
        return f"{ns:.0f} ns"
    if magnitude < 1e6:
        return f"{ns / 1e3:.2f} µs"
    if magnitude < 1e9:
        return f"{ns / 1e6:.2f} ms"
    return f"{ns / 1e9:.3f} s"


# -- tokens ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ActiveProfile(Generic[P]):
    """A started profile: its token, start timestamp, and the server's payload."""

    token: ProfilingToken
    start_ns: int
    payload: P | None


class Profiler(Generic[P]):
    """Hands out profiling tokens and remembers when (and with what) each started.

    ``P`` is whatever the server keeps per profile (``None`` for the host server, a
    start event for a device-timed CUDA profile).

    Args:
        clock: Integer-nanosecond monotonic clock (injectable for tests).
    """

    __slots__ = ("_active", "_clock", "_next_id")

    def __init__(self, clock: Clock = time.perf_counter_ns) -> None:
        self._clock = clock
        self._active: dict[int, ActiveProfile[P]] = {}
        self._next_id = 1

    def __len__(self) -> int:
        return len(self._active)

    def __contains__(self, token: object) -> bool:
        return isinstance(token, ProfilingToken) and token.id in self._active

    def start(self, payload: P | None = None) -> ProfilingToken:
        """Start a profile now; returns its token."""
        token = ProfilingToken(self._next_id)
        self._next_id += 1
        self._active[token.id] = ActiveProfile(token, self._clock(), payload)
        return token

    def get(self, token: ProfilingToken) -> ActiveProfile[P]:
        """The active profile of ``token``; raises ProfileError if it is not active."""
        try:
            return self._active[token.id]
        except KeyError:
            raise self._not_active(token) from None

    def pop(self, token: ProfilingToken) -> ActiveProfile[P]:
        """End ``token`` and return its start, for servers that time it themselves."""
        active = self.get(token)
        del self._active[token.id]
        return active

    def end(
        self, token: ProfilingToken, method: TimingMethod = TimingMethod.FULL
    ) -> ProfileDuration:
        """End ``token`` now; the duration runs from its start to the clock's now."""
        active = self.pop(token)
        return ProfileDuration(active.start_ns, self._clock(), method)

    def active(self) -> list[ActiveProfile[P]]:
        """The active profiles, oldest first."""
        return list(self._active.values())

    def clear(self) -> list[ActiveProfile[P]]:
        """Forget every active profile (on close); returns those that were active."""
        dropped = self.active()
        self._active.clear()
        return dropped

    def _not_active(self, token: ProfilingToken) -> ProfileError:
        if 0 < token.id < self._next_id:
            return ProfileError(f"profiling token {token.id} has already ended")
        return ProfileError(
            f"unknown profiling token {token.id}: it was not started by this client"
        )


# -- per-kernel records --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KernelRecord:
    """One kernel launch, copy, or cross-stream wait, as it ran.

    Attributes:
        name: The kernel id, or a label such as ``"read"``/``"write"``/``"wait 3"``.
        stream: The stream id it ran on.
        kind: ``"kernel"``, ``"copy"`` or ``"wait"``.
        queued_ns: When the client submitted it.
        start_ns: When it started running.
        end_ns: When it finished.
        nbytes: Bytes moved, for copies; ``None`` otherwise.
    """

    name: str
    stream: int
    kind: RecordKind
    queued_ns: int
    start_ns: int
    end_ns: int
    nbytes: int | None = None

    @property
    def duration_ns(self) -> int:
        """How long it ran."""
        return self.end_ns - self.start_ns

    @property
    def queue_delay_ns(self) -> int:
        """How long it waited between submission and start."""
        return self.start_ns - self.queued_ns


class KernelRecorder:
    """Collects :class:`KernelRecord` s when profiling is ``medium`` or ``full``.

    Keeps at most ``max_records`` (the oldest are dropped and counted in ``dropped``),
    so a long-running process cannot grow without bound.

    Attributes:
        enabled: True when records are kept (level ``medium`` or ``full``).
        device_timing: True when servers should take device timestamps for each
            operation (level ``full``); at ``medium``, host timestamps.
        dropped: Records dropped because the buffer was full.
    """

    __slots__ = ("_records", "device_timing", "dropped", "enabled")

    def __init__(
        self, level: ProfilingLevel = ProfilingLevel.DISABLED, *, max_records: int = 1_000_000
    ) -> None:
        if max_records < 1:
            raise InvalidArgument(f"max_records must be >= 1, got {max_records}")
        self.enabled = level >= ProfilingLevel.MEDIUM
        self.device_timing = level >= ProfilingLevel.FULL
        self.dropped = 0
        self._records: deque[KernelRecord] = deque(maxlen=max_records)

    @classmethod
    def from_config(cls, config: ProfilingConfig) -> KernelRecorder:
        """A recorder for the ``[profiling]`` section's level."""
        return cls(config.level)

    def __len__(self) -> int:
        return len(self._records)

    def __iter__(self) -> Iterator[KernelRecord]:
        return iter(list(self._records))

    def record(
        self,
        name: str,
        stream: int,
        kind: RecordKind,
        queued_ns: int,
        start_ns: int,
        end_ns: int,
        nbytes: int | None = None,
    ) -> None:
        """Keep one record if enabled; otherwise return at once."""
        if not self.enabled:
            return
        if kind not in RECORD_KINDS:
            raise InvalidArgument(f"record kind must be kernel, copy or wait, got {kind!r}")
        if len(self._records) == self._records.maxlen:
            self.dropped += 1
        self._records.append(KernelRecord(name, stream, kind, queued_ns, start_ns, end_ns, nbytes))

    def records(self) -> list[KernelRecord]:
        """The records kept, oldest first (a copy)."""
        return list(self._records)

    def drain(self) -> list[KernelRecord]:
        """The records kept, oldest first, removing them from the recorder."""
        out = list(self._records)
        self._records.clear()
        return out

    def clear(self) -> None:
        """Forget every record and the dropped count."""
        self._records.clear()
        self.dropped = 0

    def summary(self) -> ProfileSummary:
        """Durations aggregated by record name."""
        return ProfileSummary.from_records(self._records)


# -- summaries -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProfileStats:
    """Aggregate durations of one name.

    Attributes:
        name: What was timed.
        count: How many times.
        total_ns: Sum of the durations.
        min_ns: Shortest duration.
        max_ns: Longest duration.
    """

    name: str
    count: int
    total_ns: int
    min_ns: int
    max_ns: int

    @property
    def mean_ns(self) -> float:
        """Average duration."""
        return self.total_ns / self.count


class ProfileSummary:
    """Durations aggregated by name: count, total, mean, min and max.

    ``summary.add("matmul", duration)`` for each measurement; ``summary["matmul"]`` is
    its :class:`ProfileStats`; iteration yields stats by total time, largest first.
    In Jupyter it displays as a table.
    """

    __slots__ = ("_stats",)

    def __init__(self, entries: Iterable[tuple[str, ProfileDuration | int]] = ()) -> None:
        self._stats: dict[str, list[int]] = {}
        for name, duration in entries:
            self.add(name, duration)

    @classmethod
    def from_records(cls, records: Iterable[KernelRecord]) -> ProfileSummary:
        """Kernel/copy/wait durations aggregated by record name."""
        return cls((r.name, r.duration_ns) for r in records)

    def add(self, name: str, duration: ProfileDuration | int) -> None:
        """Add one measurement (a ProfileDuration, or nanoseconds)."""
        ns = duration.duration_ns if isinstance(duration, ProfileDuration) else int(duration)
        stats = self._stats.get(name)
        if stats is None:
            self._stats[name] = [1, ns, ns, ns]
            return
        stats[0] += 1
        stats[1] += ns
        stats[2] = min(stats[2], ns)
        stats[3] = max(stats[3], ns)

    def merge(self, other: ProfileSummary) -> ProfileSummary:
        """A new summary holding both summaries' measurements."""
        out = ProfileSummary()
        for source in (self, other):
            for s in source:
                out._merge_stats(s)
        return out

    def _merge_stats(self, s: ProfileStats) -> None:
        mine = self._stats.setdefault(s.name, [0, 0, s.min_ns, s.max_ns])
        mine[0] += s.count
        mine[1] += s.total_ns
        mine[2] = min(mine[2], s.min_ns)
        mine[3] = max(mine[3], s.max_ns)

    def __getitem__(self, name: str) -> ProfileStats:
        count, total, lo, hi = self._stats[name]
        return ProfileStats(name, count, total, lo, hi)

    def __contains__(self, name: object) -> bool:
        return name in self._stats

    def __len__(self) -> int:
        return len(self._stats)

    def __iter__(self) -> Iterator[ProfileStats]:
        return iter(self.stats())

    def stats(self) -> list[ProfileStats]:
        """Every name's stats, largest total first."""
        return sorted((self[n] for n in self._stats), key=lambda s: (-s.total_ns, s.name))

    def __repr__(self) -> str:
        return f"ProfileSummary({len(self)} names)"

    def __str__(self) -> str:
        header = ("name", "count", "total", "mean", "min", "max")
        rows = [header, *(_stats_row(s) for s in self)]
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
        return "\n".join(_text_row(r, widths) for r in rows)

    def _repr_html_(self) -> str:
        return profile_summary_html(self)


def profile_summary_html(summary: ProfileSummary, *, title: str = "Profile summary") -> str:
    """One row per name: count, total, mean, min and max, largest total first."""
    header = ("name", "count", "total", "mean", "min", "max")
    return html_table(header, [_stats_row(s) for s in summary], caption=title)


def _stats_row(s: ProfileStats) -> tuple[str, ...]:
    return (
        s.name,
        str(s.count),
        format_ns(s.total_ns),
        format_ns(s.mean_ns),
        format_ns(s.min_ns),
        format_ns(s.max_ns),
    )


def _text_row(cells: tuple[str, ...], widths: list[int]) -> str:
    first = cells[0].ljust(widths[0])
    rest = (c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True))
    return "  ".join((first, *rest)).rstrip()
