"""``LoopMonitor``: watch the event loop of a running service.

Two measurements, both cheap enough to leave on in production:

* **Lag**: a ticker sleeps ``interval`` seconds (10 ms by default) and records how late
  it wakes: the time a request that became ready at that moment waited for the loop.
  Its percentiles (p50, p99, max) over the last ``window`` seconds are the loop's lag.
* **Slow steps**: the steps the loop runs (an asyncio callback or task step, a trio
  task step) are timed with the wall clock through the hooks the pytest plugin's lag
  probe uses (:func:`_asynccube_pytest.lagprobe.attach_steps`,
  :class:`~_asynccube_pytest.lagprobe.TrioSteps`); a step of ``record_above`` (1 ms) or
  more is kept, named as the probe names its culprit (a task's coroutine, or the
  callback). Wall time is what the loop's other work waited, whatever held the thread.
  Timing a step costs a few hundred nanoseconds, so by default steps are timed during
  one tick in ten (``step_sampling=0.1``), and during every tick for ``burst`` seconds
  after a tick woke ``threshold`` late while they were not: code that blocks the loop
  again and again is named; a block seen only by the ticker is logged as such.

Results come three ways: :meth:`LoopMonitor.snapshot` (a :class:`LoopLagReport`, e.g.
for a ``/health`` endpoint), ``on_report`` called every ``report_every`` seconds, and a
WARNING on the ``asynccube.loop`` logger for each step of ``threshold`` or more.

While no monitor runs on a loop, nothing is hooked: the loop runs as if none existed.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import sniffio

from _asynccube_pytest.lagprobe import (
    TrioSteps,
    attach_steps,
    describe_handle,
    describe_trio_task,
    detach_steps,
    suspended_at,
)

from ..errors import InvalidArgument, LoopMismatchError

__all__ = ["LoopLagReport", "LoopMonitor", "SlowStep"]

log = logging.getLogger("asynccube.loop")
"""Where a step of ``threshold`` or more is reported (WARNING)."""

_MAX_SLOW_STEPS = 256


@dataclass(frozen=True, slots=True)
class SlowStep:
    """One step that held the event loop.

    Attributes:
        seconds: how long the step ran (wall clock).
        culprit: the code behind it: ``a step of task 'name' running coro_qualname``, a
            callback's repr, or ``a step of trio task 'name'``; for a task's step, where
            the task stopped at its end (``, which ended at app.py:40 > db.py:12``, its
            coroutines outermost first): the step ran from its previous await to there.
        when: when it ended (``time.time()``).
    """

    seconds: float
    culprit: str
    when: float


@dataclass(frozen=True, slots=True)
class LoopLagReport:
    """The loop's health over the last ``window`` seconds.

    Attributes:
        window: the seconds the report covers (at most the monitor's ``window``).
        samples: how many ticks the lag figures come from.
        p50: the median lag of a tick, in seconds.
        p99: the 99th percentile of the lag, in seconds.
        max: the largest lag, in seconds.
        worst_step: the longest step of the window (``None``: no step reached the
            monitor's ``record_above``).
        slow_steps: the steps of ``threshold`` or more in the window, oldest first (the
            latest 256 at most).
    """

    window: float
    samples: int
    p50: float
    p99: float
    max: float
    worst_step: SlowStep | None
    slow_steps: tuple[SlowStep, ...]

    def as_dict(self) -> dict[str, Any]:
        """The report as JSON-ready values, times in milliseconds (for ``/health``)."""
        worst = self.worst_step
        return {
            "window_s": round(self.window, 3),
            "samples": self.samples,
            "lag_p50_ms": round(self.p50 * 1e3, 3),
            "lag_p99_ms": round(self.p99 * 1e3, 3),
            "lag_max_ms": round(self.max * 1e3, 3),
            "worst_step_ms": None if worst is None else round(worst.seconds * 1e3, 3),
            "worst_step_culprit": None if worst is None else worst.culprit,
            "slow_steps": len(self.slow_steps),
        }


def _percentile(ordered: list[float], fraction: float) -> float:
    """Nearest-rank percentile of an ascending list (0.0 when empty)."""
    if not ordered:
        return 0.0
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


def _positive(name: str, value: float) -> float:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not number or not 0 < value < math.inf:
        raise InvalidArgument(
            f"LoopMonitor({name}=...) must be a finite number of seconds > 0, got {value!r}"
        )
    return float(value)


class LoopMonitor:
    """Watches the running event loop (asyncio or trio): lag percentiles, the worst step
    and the code that caused it.

    Start it on the loop it watches, e.g. in a service's lifespan, and stop it at
    shutdown (or use ``async with``)::

        monitor = ac.LoopMonitor(threshold=0.05)
        monitor.start()
        ...
        health = monitor.snapshot().as_dict()
        ...
        monitor.stop()

    Args:
        interval: the ticker's period, in seconds (the rate of lag samples).
        window: the seconds a snapshot covers.
        threshold: a step this long or longer is logged (WARNING on ``asynccube.loop``)
            and listed in the report's ``slow_steps``.
        record_above: a step this long or longer is named and kept (``worst_step``).
        on_report: called on the loop with a :class:`LoopLagReport` every
            ``report_every`` seconds, and once more by :meth:`stop`. An exception it
            raises is logged, never raised into the loop.
        report_every: the seconds between two ``on_report`` calls.
        step_sampling: the share of ticks during which steps are timed (1.0: every
            step, the surest naming, at about 0.4 µs a step).
        burst: after a tick woke ``threshold`` late with steps untimed, steps are timed
            for this many seconds.

    Raises:
        InvalidArgument: a duration that is not a number > 0, or ``record_above`` above
            ``threshold``, or a ``step_sampling`` outside (0, 1].
    """

    def __init__(
        self,
        *,
        interval: float = 0.01,
        window: float = 60.0,
        threshold: float = 0.05,
        record_above: float = 0.001,
        on_report: Callable[[LoopLagReport], object] | None = None,
        report_every: float = 10.0,
        step_sampling: float = 0.1,
        burst: float = 1.0,
    ) -> None:
        self.interval = _positive("interval", interval)
        self.window = _positive("window", window)
        self.threshold = _positive("threshold", threshold)
        self.record_above = _positive("record_above", record_above)
        self.report_every = _positive("report_every", report_every)
        self.burst = _positive("burst", burst)
        if not _positive("step_sampling", step_sampling) <= 1:
            raise InvalidArgument(
                f"LoopMonitor(step_sampling={step_sampling!r}) must be in (0, 1]: the share "
                "of ticks during which steps are timed"
            )
        self.step_sampling = float(step_sampling)
        self._every = max(1, round(1 / self.step_sampling))
        self._hooked = False
        if self.record_above > self.threshold:
            raise InvalidArgument(
                f"LoopMonitor(record_above={record_above!r}) is above threshold="
                f"{threshold!r}: every step logged must be kept; lower record_above"
            )
        if on_report is not None and not callable(on_report):
            raise InvalidArgument(f"LoopMonitor(on_report=...) must be callable, got {on_report!r}")
        self.on_report = on_report
        self._lags: deque[tuple[float, float]] = deque(
            maxlen=math.ceil(self.window / self.interval) + 2
        )
        self._steps: deque[tuple[float, SlowStep]] = deque(maxlen=_MAX_SLOW_STEPS)
        self._library: Literal["asyncio", "trio"] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._instrument: TrioSteps | None = None
        self._ticker: Any = None  # asyncio.Task, or trio.CancelScope
        self._started = 0.0
        self._describe: Callable[[Any], str] = describe_handle

    @property
    def running(self) -> bool:
        """Whether the monitor is watching a loop."""
        return self._library is not None

    def start(self) -> None:
        """Start watching the running loop (call it from a task on that loop).

        Raises:
            LoopMismatchError: no asyncio or trio loop runs in this thread.
            InvalidArgument: the monitor is running already.
        """
        if self._library is not None:
            raise InvalidArgument("this LoopMonitor is running already; stop() it first")
        try:
            library = sniffio.current_async_library()
        except sniffio.AsyncLibraryNotFoundError:
            library = ""
        self._lags.clear()
        self._steps.clear()
        self._started = time.monotonic()
        if library == "trio":
            self._start_trio()
        elif library == "asyncio":
            self._start_asyncio()
        else:
            raise LoopMismatchError(
                "LoopMonitor.start() must be called from a task of a running asyncio or "
                "trio event loop"
            )

    def _start_asyncio(self) -> None:
        loop = asyncio.get_running_loop()
        self._library, self._loop, self._describe = "asyncio", loop, describe_handle
        self._hook()
        self._ticker = loop.create_task(self._tick_asyncio(), name="asynccube-loop-monitor")

    def _start_trio(self) -> None:
        import trio

        self._library, self._describe = "trio", describe_trio_task
        self._instrument = TrioSteps(self)
        self._hook()
        self._ticker = scope = trio.CancelScope()
        trio.lowlevel.spawn_system_task(self._tick_trio, scope, name="asynccube-loop-monitor")

    def stop(self) -> None:
        """Stop watching; ``on_report`` gets a last report. Stopping a monitor that is
        not running does nothing.

        Raises:
            LoopMismatchError: called from another loop than the one it watches.
        """
        if self._library is None:
            return
        if self._library == "asyncio":
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is not self._loop:
                raise LoopMismatchError("LoopMonitor.stop() must run on the loop it watches")
        self._unhook()
        self._instrument = None
        self._ticker.cancel()
        self._library, self._loop, self._ticker = None, None, None
        self._deliver()

    async def __aenter__(self) -> LoopMonitor:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        ticker = self._ticker
        self.stop()
        if isinstance(ticker, asyncio.Task):
            await asyncio.gather(ticker, return_exceptions=True)

    # -- the step hooks (StepSink) ---------------------------------------------------------

    def _hook(self) -> None:
        if self._hooked:
            return
        self._hooked = True
        if self._loop is not None:
            attach_steps(self._loop, self)
        else:
            import trio

            trio.lowlevel.add_instrument(self._instrument)  # type: ignore[arg-type]  # (by name)

    def _unhook(self) -> None:
        if not self._hooked:
            return
        self._hooked = False
        if self._loop is not None:
            detach_steps(self._loop, self)
        else:
            import trio

            trio.lowlevel.remove_instrument(self._instrument)  # type: ignore[arg-type]

    begin = staticmethod(time.perf_counter)
    """A step starts (the step hooks call this; a builtin: no Python frame per step)."""

    def end(self, step: Any, mark: float) -> None:
        """A step has ended (the step hooks call this): keep it if it was slow."""
        seconds = time.perf_counter() - mark
        if seconds >= self.record_above:
            self._slow(step, seconds)

    def _slow(self, step: Any, seconds: float) -> None:
        slow = SlowStep(seconds, f"{self._describe(step)}{suspended_at(step)}", time.time())
        self._steps.append((time.monotonic(), slow))
        if seconds >= self.threshold:
            log.warning("the event loop was blocked for %.1f ms by %s", seconds * 1e3, slow.culprit)

    # -- the ticker -----------------------------------------------------------------------

    async def _tick_asyncio(self) -> None:
        try:
            await self._tick(asyncio.sleep)
        finally:
            if self._ticker is asyncio.current_task():  # the loop ends, never stopped
                self._abandon()

    async def _tick_trio(self, scope: Any) -> None:
        import trio

        try:
            with scope:
                await self._tick(trio.sleep)
        finally:
            if self._ticker is scope:  # the run ends, never stopped
                self._abandon()

    def _abandon(self) -> None:
        """The loop (or trio run) is ending while the monitor runs: unhook it, so that
        nothing stays hooked to a finished loop."""
        try:
            self._unhook()
        finally:
            self._library, self._loop, self._ticker, self._instrument = None, None, None, None

    async def _tick(self, sleep: Callable[[float], Any]) -> None:
        interval = self.interval
        last_report = time.monotonic()
        burst_until = 0.0
        ticks = 0
        while True:
            before = time.monotonic()
            timed = self._hooked
            await sleep(interval)
            now = time.monotonic()
            lag = max(0.0, now - before - interval)
            self._lags.append((now, lag))
            if lag >= self.threshold and not timed:
                burst_until = now + self.burst
                log.warning(
                    "the event loop was blocked for about %.1f ms while its steps were not "
                    "timed (a tick woke that late); steps are timed for the next %g s",
                    lag * 1e3,
                    self.burst,
                )
            ticks += 1
            if ticks % self._every == 0 or now < burst_until:
                self._hook()
            else:
                self._unhook()
            if now - last_report >= self.report_every:
                last_report = now
                self._deliver()

    def _deliver(self) -> None:
        if self.on_report is None:
            return
        try:
            self.on_report(self.snapshot())
        except Exception:
            log.exception("LoopMonitor's on_report raised")

    # -- reading --------------------------------------------------------------------------

    def snapshot(self) -> LoopLagReport:
        """The loop's health over the last ``window`` seconds (cheap: a sort of at most
        ``window / interval`` numbers)."""
        now = time.monotonic()
        since = now - self.window
        lags = sorted(lag for when, lag in self._lags if when >= since)
        steps = [step for when, step in self._steps if when >= since]
        worst = max(steps, key=lambda s: s.seconds, default=None)
        return LoopLagReport(
            window=min(self.window, now - self._started),
            samples=len(lags),
            p50=_percentile(lags, 0.50),
            p99=_percentile(lags, 0.99),
            max=lags[-1] if lags else 0.0,
            worst_step=worst,
            slow_steps=tuple(s for s in steps if s.seconds >= self.threshold),
        )
