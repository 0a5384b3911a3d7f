"""The tuner: benchmarks a tunable set per key and remembers the fastest (cubecl's
``Tuner``).

For a key seen for the first time, each implementation runs ``warmup`` times, then
``samples`` times between ``client.start_profile()`` and ``client.end_profile()`` (device
timing with CUDA events on a GPU, synchronized wall clock on the host); the one with the
lowest median wins. A set of one implementation is used without benchmarking. An
implementation that raises is recorded as failed; if all fail,
:class:`~asynccube.AutotuneError` names each failure. A set's :class:`TuneBound` and
:class:`AdaptiveSampling` shorten the search (see :mod:`.sampling`); the result says why
it picked what it did (:class:`TuneReason`).

Tuning runs in its own task (asyncio's, or a trio system task; so on its own stream),
shared by every caller asking for the same key: fifty concurrent callers start one run. In
:attr:`TuneMode.BLOCKING` callers wait for it; in :attr:`TuneMode.BACKGROUND` they are
served by the set's default implementation until the result is in (the seed's
``Pending`` state), and by the fastest afterwards.
"""

from __future__ import annotations

import asyncio
import enum
import os
import weakref
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, TypeVar

from ..channel.backend import running_loop, shield, wait_all
from ..channel.progress import open_progress
from ..client.warmup import Scope, current_scope, leave_scopes
from ..config.logging import area_logger
from ..errors import AutotuneCheckError, AutotuneError, InvalidArgument, LaunchDropped
from .bench import SAMPLES_BY_LEVEL, configured_samples, from_code
from .cache import TuneCache, TuneResult, device_fingerprint
from .checks import CheckReport, TuneChecks, run_checks
from .key import AutotuneKey
from .policy import TuneReason
from .sampling import Plan, Run, pick, resolve_plan, run_plan
from .tunable import Tunable, TunableSet

if TYPE_CHECKING:
    from ..client.client import ComputeClient

__all__ = ["SAMPLES_BY_LEVEL", "TuneMode", "Tuner", "configured_samples"]

log = area_logger("autotune")

K = TypeVar("K", bound=AutotuneKey)
In = TypeVar("In")
Out = TypeVar("Out")


class TuneMode(enum.Enum):
    """When callers get the tuned implementation."""

    BLOCKING = "blocking"
    """The first call for a key waits for tuning, then runs the fastest."""
    BACKGROUND = "background"
    """Tuning runs as a task; calls use the default implementation until it is done."""


class Tuner:
    """Picks and remembers the fastest implementation of one operation, per key and
    device.

    Args:
        name: Names the operation (and its cache file); one tuner per operation.
        mode: :attr:`TuneMode.BLOCKING` (default) or :attr:`TuneMode.BACKGROUND`.
        warmup: Unprofiled runs of each implementation before its samples.
        samples: Profiled runs of each implementation (the median decides; the most,
            under adaptive sampling); by default from ``[autotune] level``: minimal 3,
            balanced 10, extensive 25, full 50.
        cache_dir: Root of the on-disk cache (default: ``[autotune] cache_dir`` from
            the configuration, i.e. ``$XDG_CACHE_HOME/asynccube/autotune`` or
            ``~/.cache/asynccube/autotune``).
        persistent: Keep results on disk (default: ``[autotune] cache``, true).
        checks: Compare every implementation's output when a key is tuned
            (``True`` for default tolerances, or a :class:`TuneChecks`).

    A tuner may be shared by any number of clients and tasks (on one event loop at a
    time); results are kept per device fingerprint (device string and name), so a
    second client on the same device reuses them.

    When every implementation fails for a key, the :class:`~asynccube.AutotuneError`
    is kept in memory and raised again for that key without retuning (unless the
    client was closed meanwhile); :meth:`forget` clears it. Background callers get the
    default implementation instead.

    Attributes:
        runs: Tuning runs started (benchmarks, not cache hits): for tests and logs.
        check_reports: Reports of the output checks run so far.
    """

    def __init__(
        self,
        name: str,
        *,
        mode: TuneMode | str = TuneMode.BLOCKING,
        warmup: int = 1,
        samples: int | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        persistent: bool | None = None,
        checks: TuneChecks | bool | None = None,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise InvalidArgument("Tuner: name must be a non-empty str")
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
            raise InvalidArgument(f"Tuner: warmup must be an int >= 0, got {warmup!r}")
        if samples is not None and (
            isinstance(samples, bool) or not isinstance(samples, int) or samples < 1
        ):
            raise InvalidArgument(f"Tuner: samples must be an int >= 1, got {samples!r}")
        self.name = name
        self.mode = _mode(mode)
        self.warmup = warmup
        self.samples = samples
        self.checks = TuneChecks() if checks is True else (checks or None)
        self._cache_dir = cache_dir
        self._persistent = persistent
        self._caches: dict[str, TuneCache] = {}
        self._tasks: set[asyncio.Task[TuneResult]] = set()
        self._last: tuple[weakref.ReferenceType[ComputeClient], TuneCache] | None = None
        self.runs = 0
        self.check_reports: list[CheckReport] = []

    def __repr__(self) -> str:
        return f"Tuner({self.name!r}, mode={self.mode.value}, runs={self.runs})"

    # -- public ---------------------------------------------------------------------

    async def execute(
        self,
        client: ComputeClient,
        tunables: TunableSet[K, In, Out],
        inputs: In,
        *,
        mode: TuneMode | str | None = None,
    ) -> Out:
        """Run the fastest implementation for ``inputs``' key (tuning it first if it
        is new: see ``mode``) and return its output.

        In the caller's ``client.tuning()`` scope the key is tuned now, whatever the
        mode. In its ``client.warm_up()`` scope nothing is measured (nothing runs): for
        a key not tuned yet every implementation runs once, so each one's kernels are
        compiled, then the default's output is returned; for a tuned key, the pick's.
        """
        scope = _scope(client)
        if scope is not None and scope.dropping:
            return await self._warm_up(client, tunables, inputs, scope)
        index = await self.select(client, tunables, inputs, mode=mode)
        return await tunables[index](client, inputs)

    async def select(
        self,
        client: ComputeClient,
        tunables: TunableSet[K, In, Out],
        inputs: In,
        *,
        mode: TuneMode | str | None = None,
    ) -> int:
        """The index of the implementation :meth:`execute` would run now (tuning in a
        ``client.tuning()`` scope, never in a ``client.warm_up()`` scope)."""
        key = tunables.generate_key(inputs)
        scope = _scope(client)
        if scope is not None and scope.dropping:
            known = await self._known_index(client, tunables, key)
            return tunables.default_index if known is None else known
        mode = TuneMode.BLOCKING if scope is not None else mode
        if (self.mode if mode is None else _mode(mode)) is TuneMode.BLOCKING:
            result = await self._result(client, tunables, key, inputs, wait=True, scope=scope)
            assert result is not None
            return result.fastest_index
        try:
            result = await self._result(client, tunables, key, inputs, wait=False)
        except AutotuneError:
            result = None
        return tunables.default_index if result is None else result.fastest_index

    async def fastest(
        self, client: ComputeClient, tunables: TunableSet[K, In, Out], inputs: In
    ) -> Tunable[In, Out]:
        """The implementation :meth:`execute` would run now."""
        return tunables[await self.select(client, tunables, inputs)]

    async def tune(
        self, client: ComputeClient, tunables: TunableSet[K, In, Out], inputs: In
    ) -> TuneResult:
        """The result for ``inputs``' key, waiting for tuning whatever the mode (from
        memory or disk when known)."""
        key = tunables.generate_key(inputs)
        result = await self._result(client, tunables, key, inputs, wait=True)
        assert result is not None
        return result

    def result(self, client: ComputeClient, key: AutotuneKey) -> TuneResult | None:
        """The result for ``key`` on ``client``'s device, if in memory."""
        return self.cache(client).get(key)

    async def check(
        self,
        client: ComputeClient,
        tunables: TunableSet[K, In, Out],
        inputs: In,
        checks: TuneChecks | None = None,
    ) -> CheckReport:
        """Run every implementation on ``inputs`` (as given) and compare their outputs
        (``checks``, else the tuner's, else default tolerances); never raises for a
        disagreement: read the report."""
        key = tunables.generate_key(inputs)
        return await run_checks(
            client, tunables, key, inputs, checks or self.checks or TuneChecks()
        )

    async def wait(self) -> None:
        """Wait for every tuning run in flight on this loop (including its disk write)."""
        loop = running_loop()
        tasks: list[asyncio.Future[Any]] = [t for t in self._tasks if t.get_loop() is loop]
        await wait_all(tasks)

    def cache(self, client: ComputeClient) -> TuneCache:
        """The cache of ``client``'s device."""
        last = self._last
        if last is not None and last[0]() is client:
            return last[1]
        cache = self._cache_of(client)
        self._last = (weakref.ref(client), cache)
        return cache

    def _cache_of(self, client: ComputeClient) -> TuneCache:
        fingerprint = device_fingerprint(client)
        cache = self._caches.get(fingerprint)
        if cache is None:
            cache_dir = self._cache_dir
            if cache_dir is None:
                cache_dir = from_code(client, "cache_dir")
            persistent = self._persistent
            if persistent is None:
                persistent = from_code(client, "cache")
            cache = self._caches[fingerprint] = TuneCache(
                self.name, fingerprint, cache_dir=cache_dir, persistent=persistent
            )
        return cache

    def forget(self, key: AutotuneKey | None = None) -> None:
        """Drop ``key`` (or everything) from memory on every device; disk stays."""
        for cache in self._caches.values():
            cache.forget(key)

    # -- warm-up runs (client.warm_up(), client.tuning()) ----------------------------

    async def _warm_up(
        self, client: ComputeClient, tunables: TunableSet[K, In, Out], inputs: In, scope: Scope
    ) -> Out:
        """:meth:`execute` in a warm-up scope (see there): every implementation of a key
        not tuned yet runs once (its launches compiled and dropped), the default last."""
        key = tunables.generate_key(inputs)
        index = await self._known_index(client, tunables, key)
        if index is None:
            index = tunables.default_index
            for other in range(len(tunables)):
                if other != index:
                    what = f"{self.name} {key}: {tunables.names[other]}"
                    await _dry_run(scope, what, tunables[other](client, inputs))
        return await tunables[index](client, inputs)

    async def _known_index(
        self, client: ComputeClient, tunables: TunableSet[K, In, Out], key: K
    ) -> int | None:
        """The pick for ``key`` when it is known without tuning (memory, disk, a single
        implementation), else None; a kept failure counts as unknown."""
        if not len(tunables):
            raise InvalidArgument(f"autotune {self.name}: the TunableSet has no tunables")
        cache = self.cache(client)
        checksum = tunables.checksum()
        result = cache.get(key, checksum)
        if result is None:
            await cache.load()
            try:
                result = self._known(cache, tunables, key, checksum)
            except AutotuneError:
                return None
        return None if result is None else result.fastest_index

    # -- lookup ---------------------------------------------------------------------

    async def _result(
        self,
        client: ComputeClient,
        tunables: TunableSet[K, In, Out],
        key: K,
        inputs: In,
        *,
        wait: bool,
        scope: Scope | None = None,
    ) -> TuneResult | None:
        cache = self.cache(client)
        checksum = tunables.checksum()
        result = cache.get(key, checksum)
        if result is not None:  # the hot path
            if scope is not None:
                scope.tuning_outcome(f"{self.name} {key}", "cached")
            return result
        if not len(tunables):
            raise InvalidArgument(f"autotune {self.name}: the TunableSet has no tunables")
        try:
            return await self._lookup(client, cache, tunables, key, inputs, wait, scope)
        except AutotuneError as exc:
            if scope is not None:
                scope.tuning_outcome(f"{self.name} {key}", "failed", exc)
            raise

    async def _lookup(
        self,
        client: ComputeClient,
        cache: TuneCache,
        tunables: TunableSet[K, In, Out],
        key: K,
        inputs: In,
        wait: bool,
        scope: Scope | None,
    ) -> TuneResult | None:
        """:meth:`_result` past the memory: known, or tuned (a run started or joined)."""
        checksum = tunables.checksum()
        known = self._known(cache, tunables, key, checksum)
        task = cache.pending(key) if known is None else None
        if known is None and task is None:
            await cache.load()
            known = self._known(cache, tunables, key, checksum)
            if known is None:
                task = cache.pending(key) or self._start(
                    client, cache, tunables, key, inputs, scope
                )
        if known is not None:
            if scope is not None:
                scope.tuning_outcome(f"{self.name} {key}", "cached")
            return known
        assert task is not None
        if not wait:
            return None
        tuned: TuneResult = await shield(task)
        if scope is not None:
            scope.tuning_outcome(f"{self.name} {key}", "tuned")
        return tuned

    def _known(
        self,
        cache: TuneCache,
        tunables: TunableSet[Any, Any, Any],
        key: AutotuneKey,
        checksum: str,
    ) -> TuneResult | None:
        """A result without tuning: memory, a single implementation, or disk (after
        ``cache.load()``). Raises the kept error of a run in which all failed."""
        result = cache.get(key, checksum)
        if result is not None:
            return result
        failure = cache.failure(key, checksum)
        if failure is not None:
            raise failure
        if len(tunables) == 1:
            result = TuneResult(0, tunables.names[0], checksum, (), "single", TuneReason.SINGLE)
        else:
            result = cache.persisted(key, checksum)
            if result is None:
                return None
            log.debug("autotune %s: %s from disk: %s", self.name, key, result.fastest_name)
        cache.insert(key, result)
        return result

    def _start(
        self,
        client: ComputeClient,
        cache: TuneCache,
        tunables: TunableSet[K, In, Out],
        key: K,
        inputs: In,
        scope: Scope | None = None,
    ) -> asyncio.Task[TuneResult]:
        self.runs += 1
        task = running_loop().create_task(  # a system task under trio
            self._tune(client, cache, tunables, key, inputs, scope),
            name=f"asynccube-autotune-{self.name}",
        )
        cache.mark_pending(key, task)
        self._tasks.add(task)
        task.add_done_callback(self._finished)
        return task

    def _finished(self, task: asyncio.Task[TuneResult]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        error = task.exception()  # retrieved here, so never "never retrieved"
        if error is not None:
            log.warning("autotune %s failed: %s", self.name, error)

    # -- tuning ---------------------------------------------------------------------

    async def _tune(
        self,
        client: ComputeClient,
        cache: TuneCache,
        tunables: TunableSet[K, In, Out],
        key: K,
        inputs: In,
        scope: Scope | None = None,
    ) -> TuneResult:
        leave_scopes()  # the measurements run, whatever scope the caller is in (RealRun)
        checksum = tunables.checksum()
        log.info("Tuning %s %s", self.name, key)
        try:
            bench_inputs = await tunables.generate_inputs(key, inputs)
            await self._run_checks(client, tunables, key, bench_inputs)
            plan, run = await self._benchmark_all(client, tunables, key, bench_inputs)
            result = pick(self.name, key, checksum, plan, run)
        except AutotuneError as exc:
            if not client.closed:  # a closed client says nothing about the tunables
                cache.insert_failure(key, checksum, exc)
            raise
        cache.insert(key, result)
        if await cache.persist(key, result) and scope is not None:
            scope.tuning_outcome(f"{self.name} {key}", "stored")
        return result

    async def _run_checks(
        self, client: ComputeClient, tunables: TunableSet[K, In, Out], key: K, inputs: In
    ) -> None:
        if self.checks is None:
            return
        report = await run_checks(client, tunables, key, inputs, self.checks)
        self.check_reports.append(report)
        if report.ok:
            log.info("%s", report)
            return
        log.warning("%s", report)
        if self.checks.strict:
            raise AutotuneCheckError(report)

    async def _benchmark_all(
        self, client: ComputeClient, tunables: TunableSet[K, In, Out], key: K, inputs: In
    ) -> tuple[Plan, Run]:
        """Benchmark the implementations as the plan for ``key`` says, with a progress
        bar where one is shown."""
        plan = await resolve_plan(client, tunables, key, self.warmup, self.samples)
        config = getattr(client, "config", None)
        enabled = config is None or config.autotune.progress
        progress = await open_progress(len(tunables), f"autotune {self.name}", enabled=enabled)
        try:
            run = await run_plan(
                client, self.name, tunables, inputs, plan, lambda n: progress.step(f"{key}: {n}")
            )
        finally:
            progress.close()
        return plan, run


def _scope(client: ComputeClient) -> Scope | None:
    """The calling task's warm-up or tuning scope on ``client``, if one is open."""
    part = getattr(client, "_warm", None)
    return None if part is None else current_scope(part)


async def _dry_run(scope: Scope, what: str, run: Awaitable[Any]) -> None:
    """Run one implementation in a warm-up scope: a read of a result the scope dropped
    ends it (as expected); another error is recorded in the scope's statistics."""
    try:
        await run
    except LaunchDropped:
        pass
    except Exception as exc:
        scope.stats.tune_failures.setdefault(what, exc)


def _mode(mode: TuneMode | str) -> TuneMode:
    try:
        return TuneMode(mode)
    except ValueError:
        raise InvalidArgument(
            f"unknown tune mode {mode!r}; use TuneMode.BLOCKING or TuneMode.BACKGROUND"
        ) from None
