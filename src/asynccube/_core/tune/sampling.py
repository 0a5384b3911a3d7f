"""How a key's implementations are benchmarked: a fixed count each (today's tuner), in
interleaved rounds that prune those far behind the leader (:class:`AdaptiveSampling`),
or one at a time until one is within the set's :class:`TuneBound`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..config.logging import area_logger
from ..errors import AutotuneError
from .bench import SAMPLES_BY_LEVEL, autotune_config, benchmark, profiled
from .key import AutotuneKey
from .outcome import AutotuneOutcome, TuneResult
from .policy import AdaptiveSampling, TuneBound, TuneReason
from .tunable import Tunable, TunableSet

if TYPE_CHECKING:
    from ..client.client import ComputeClient

__all__ = ["Plan", "Run", "pick", "resolve_plan", "run_plan"]

log = area_logger("autotune")

Step = Callable[[str], None]
"""Called with an implementation's name when it is settled (for the progress bar)."""


@dataclass(frozen=True, slots=True)
class Plan:
    """How one key is benchmarked.

    Attributes:
        warmup: Unprofiled runs of each implementation first.
        samples: Profiled runs of each implementation (the most, when adaptive).
        adaptive: Adaptive sampling, its counts resolved (None: a fixed count).
        bound: The set's bound for the key (None: none).
    """

    warmup: int
    samples: int
    adaptive: AdaptiveSampling | None
    bound: TuneBound | None


@dataclass(frozen=True, slots=True)
class Run:
    """What benchmarking a key produced: each outcome, why it ended, and who was left
    out because an implementation before them met the bound."""

    outcomes: list[AutotuneOutcome]
    reason: TuneReason
    skipped: tuple[str, ...] = ()


async def resolve_plan(
    client: ComputeClient,
    tunables: TunableSet[Any, Any, Any],
    key: AutotuneKey,
    warmup: int,
    samples: int | None,
) -> Plan:
    """The plan for ``key``: the set's sampling and bound, else the tuner's ``samples``,
    else ``[autotune]`` (set in code on the client, else the file and environment)."""
    sampling = tunables.sampling
    count = sampling.max_samples if isinstance(sampling, AdaptiveSampling) else None
    count = count or samples
    if count is None or sampling is None:
        config = await autotune_config(client)
        count = count or SAMPLES_BY_LEVEL[str(config.level.value)]
        if sampling is None and config.adaptive:
            sampling = AdaptiveSampling(config.min_samples, None, config.prune_ratio)
    adaptive = None
    if isinstance(sampling, AdaptiveSampling):  # a max below min_samples prunes no one
        adaptive = AdaptiveSampling(min(sampling.min_samples, count), count, sampling.prune_ratio)
    return Plan(warmup, count, adaptive, tunables.bound_for(key))


async def run_plan(
    client: ComputeClient,
    name: str,
    tunables: TunableSet[Any, Any, Any],
    inputs: Any,
    plan: Plan,
    step: Step,
) -> Run:
    """Benchmark ``tunables`` on ``inputs`` as ``plan`` says."""
    if plan.bound is not None and plan.bound.short_circuit:
        return await _bounded(client, name, tunables, inputs, plan, plan.bound, step)
    if plan.adaptive is not None:
        return await _adaptive(client, name, tunables, inputs, plan, plan.adaptive, step)
    outcomes = []
    for index, tunable in enumerate(tunables):
        outcome, _ = await benchmark(
            client, name, index, tunable, inputs, plan.warmup, plan.samples
        )
        outcomes.append(outcome)
        step(tunable.name)
    return Run(outcomes, TuneReason.ALL_BENCHMARKED)


def pick(name: str, key: AutotuneKey, checksum: str, plan: Plan, run: Run) -> TuneResult:
    """The result of ``run``: the lowest median wins (raises AutotuneError if every
    implementation failed)."""
    outcomes = run.outcomes
    ranked = sorted(outcomes, key=lambda o: (o.sort_key, o.index))
    best = ranked[0]
    if not best.ok:
        failures = "; ".join(f"{o.name}: {o.error}" for o in outcomes)
        raise AutotuneError(f"autotune {name}: every implementation failed for {key}: {failures}")
    bound = None if plan.bound is None else plan.bound.seconds
    result = TuneResult(
        best.index, best.name, checksum, tuple(ranked), "tuned", run.reason, bound, run.skipped
    )
    log.info(
        "Fastest result %s-%s: %s. Top 3 times: %s",
        best.name,
        key,
        result.explain(),
        "; ".join(str(o) for o in ranked[:3]),
    )
    return result


# -- one at a time, up to the first within the bound ---------------------------------


async def _bounded(
    client: ComputeClient,
    name: str,
    tunables: TunableSet[Any, Any, Any],
    inputs: Any,
    plan: Plan,
    bound: TuneBound,
    step: Step,
) -> Run:
    """In the set's order, the first implementation whose median is within ``bound``
    ends the search. With adaptive sampling, one whose fastest sample is beyond
    ``prune_ratio`` times the bound after ``min_samples`` is pruned."""
    adaptive = plan.adaptive
    cutoff = None if adaptive is None else adaptive.prune_ratio * bound.ns
    least = plan.samples if adaptive is None else adaptive.min_samples
    outcomes = []
    for index, tunable in enumerate(tunables):
        outcome = await _sample_one(client, name, index, tunable, inputs, plan, least, cutoff)
        outcomes.append(outcome)
        step(tunable.name)
        if outcome.median_ns is not None and outcome.median_ns <= bound.ns:
            log.info("autotune %s: %s is within the bound of %s", name, tunable.name, bound)
            return Run(outcomes, TuneReason.BOUND_MET, tunables.names[index + 1 :])
    pruned = any(o.pruned for o in outcomes)
    return Run(outcomes, TuneReason.PRUNED if pruned else TuneReason.ALL_BENCHMARKED)


async def _sample_one(
    client: ComputeClient,
    name: str,
    index: int,
    tunable: Tunable[Any, Any],
    inputs: Any,
    plan: Plan,
    least: int,
    cutoff: float | None,
) -> AutotuneOutcome:
    """Warm up and sample one implementation; stop after ``least`` samples once its
    fastest is beyond ``cutoff`` (pruned)."""
    timings: list[int] = []
    try:
        await _warm(client, tunable, inputs, plan.warmup)
        for _ in range(plan.samples):
            timings.append(await profiled(client, tunable, inputs))
            if cutoff is not None and len(timings) >= least and min(timings) > cutoff:
                _log_pruned(name, tunable, timings, f"the bound's cutoff {cutoff / 1e6:.3f} ms")
                return AutotuneOutcome.from_samples(tunable.name, index, timings, pruned=True)
    except Exception as exc:
        return _failed(name, index, tunable, exc)
    return AutotuneOutcome.from_samples(tunable.name, index, timings)


# -- adaptive rounds -------------------------------------------------------------------


async def _adaptive(
    client: ComputeClient,
    name: str,
    tunables: TunableSet[Any, Any, Any],
    inputs: Any,
    plan: Plan,
    adaptive: AdaptiveSampling,
    step: Step,
) -> Run:
    """Warm every implementation up, then sample the contenders one run each per round;
    after ``min_samples`` rounds, prune those far behind the leader."""
    settled: dict[int, AutotuneOutcome] = {}
    timings: dict[int, list[int]] = {}
    for index, tunable in enumerate(tunables):
        try:
            await _warm(client, tunable, inputs, plan.warmup)
            timings[index] = []
        except Exception as exc:
            settled[index] = _failed(name, index, tunable, exc)
            step(tunable.name)
    for done in range(1, plan.samples + 1):
        for index in list(timings):
            tunable = tunables[index]
            try:
                timings[index].append(await profiled(client, tunable, inputs))
            except Exception as exc:
                settled[index] = _failed(name, index, tunable, exc)
                del timings[index]
                step(tunable.name)
        if done >= adaptive.min_samples:
            for index in _behind(timings, adaptive.prune_ratio):
                _log_pruned(name, tunables[index], timings[index], "the leader's median")
                settled[index] = AutotuneOutcome.from_samples(
                    tunables[index].name, index, timings.pop(index), pruned=True
                )
                step(tunables[index].name)
            if len(timings) <= 1:  # one contender left: nothing to compare it with
                break
    for index, samples in timings.items():
        settled[index] = AutotuneOutcome.from_samples(tunables[index].name, index, samples)
        step(tunables[index].name)
    outcomes = [settled[i] for i in sorted(settled)]
    pruned = any(o.pruned for o in outcomes)
    return Run(outcomes, TuneReason.PRUNED if pruned else TuneReason.ALL_BENCHMARKED)


def _behind(timings: dict[int, list[int]], ratio: float) -> list[int]:
    """The contenders whose fastest sample is beyond ``ratio`` times the leader's
    median (the leader itself never is: its fastest is at most its median)."""
    if not timings:
        return []
    leader = min(_median(s) for s in timings.values())
    return [i for i, s in timings.items() if min(s) > ratio * leader]


def _median(samples: list[int]) -> float:
    ordered = sorted(samples)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


# -- shared ----------------------------------------------------------------------------


async def _warm(client: ComputeClient, tunable: Tunable[Any, Any], inputs: Any, n: int) -> None:
    for _ in range(n):
        await tunable(client, inputs)
    await client.sync()  # warm-up done, and its errors raised here


def _failed(name: str, index: int, tunable: Tunable[Any, Any], exc: Exception) -> AutotuneOutcome:
    log.info("autotune %s: %s failed: %s: %s", name, tunable.name, type(exc).__name__, exc)
    return AutotuneOutcome.failed(tunable.name, index, exc)


def _log_pruned(name: str, tunable: Tunable[Any, Any], timings: list[int], behind: str) -> None:
    log.info(
        "autotune %s: %s pruned after %d samples (best %.3f ms, far behind %s)",
        name,
        tunable.name,
        len(timings),
        min(timings) / 1e6,
        behind,
    )
