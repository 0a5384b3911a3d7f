"""Time to an autotune decision: adaptive sampling and a time bound against today's
fixed-count tuner, on the host server.

Eight implementations, seven of which sleep ``--slow-ms`` per run on the host stream's
worker and one ten times less (the fast one sits at position ``run % 8``, so every
position is measured). In each run, fresh tuners (memory only) tune the same key:

* fixed: every implementation warmed up once and sampled ``--samples`` times (the
  tuner as it was, ``sampling=False``);
* adaptive: ``AdaptiveSampling()`` with its defaults (min 3 samples, prune ratio 2, at
  most ``--samples``);
* bound: ``TuneBound`` of 30% of a slow run, fixed count: the first within it wins;
* bound + adaptive: both.

Goal (issue 31): adaptive <= 40% of the fixed tuner's time, and the same (fast) pick in
20 of 20 runs. Run::

    python benchmarks/bench_autotune.py [--runs 20] [--slow-ms 4] [--samples 10]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import numpy as np
from _common import clock, environment, table, write

import asynccube as ac

CANDIDATES = 8


def _sleep(launch: ac.HostLaunch) -> None:
    time.sleep(float(launch.scalar(np.float32)))


SLEEP = ac.Kernel("bench_autotune_sleep", host=_sleep)


class Key(ac.AutotuneKey):
    """One key: every run tunes the same problem afresh."""

    n: int


def _sleeper(name: str, seconds: float) -> ac.Tunable[int, str]:
    async def fn(client: ac.ComputeClient, n: int) -> str:
        h = client.empty(4)
        bindings = ac.Bindings().with_buffers([h.binding()]).with_scalar(np.float32, [seconds])
        client.execute(SLEEP, ac.CubeCount(1), bindings)
        return name

    return ac.Tunable(name, fn)


def _set(fast_at: int, slow_s: float, **kwargs: Any) -> ac.TunableSet[Key, int, str]:
    tunables = [
        _sleeper(f"c{i}", slow_s / 10 if i == fast_at else slow_s) for i in range(CANDIDATES)
    ]
    return ac.TunableSet(lambda n: Key(n), tunables=tunables, **kwargs)


MODES: dict[str, dict[str, Any]] = {
    "fixed count (today)": {"sampling": False},
    "adaptive": {"sampling": ac.AdaptiveSampling()},
    "bound": {"sampling": False, "bound": "bound"},
    "bound + adaptive": {"sampling": ac.AdaptiveSampling(), "bound": "bound"},
}


async def _decide(
    client: ac.ComputeClient, mode: str, fast_at: int, slow_s: float, samples: int
) -> tuple[float, str, ac.TuneResult]:
    """Seconds to a decision, the pick, and the result, for one mode."""
    kwargs = dict(MODES[mode])
    if kwargs.get("bound") == "bound":
        kwargs["bound"] = ac.TuneBound(0.3 * slow_s)
    tunables = _set(fast_at, slow_s, **kwargs)
    tuner = ac.Tuner(f"bench_{mode}", samples=samples, persistent=False)
    start = clock()
    result = await tuner.tune(client, tunables, 1)
    return clock() - start, result.fastest_name, result


async def _main(runs: int, slow_s: float, samples: int) -> dict[str, Any]:
    times: dict[str, list[float]] = {m: [] for m in MODES}
    right: dict[str, int] = dict.fromkeys(MODES, 0)
    reasons: dict[str, set[str]] = {m: set() for m in MODES}
    config = {"autotune": {"progress": False}}
    async with ac.open_client("host", config=config) as client:
        await _decide(client, "fixed count (today)", 0, slow_s / 4, 2)  # warm the path
        for run in range(runs):
            fast_at = run % CANDIDATES
            order = list(MODES)[run % len(MODES) :] + list(MODES)[: run % len(MODES)]
            for mode in order:  # rotated, so no mode always runs first
                seconds, pick, result = await _decide(client, mode, fast_at, slow_s, samples)
                times[mode].append(seconds)
                right[mode] += pick == f"c{fast_at}"
                reasons[mode].add(result.reason.value)
    fixed = statistics.median(times["fixed count (today)"])
    return {
        "runs": runs,
        "slow_ms": slow_s * 1e3,
        "samples": samples,
        "modes": {
            m: {
                "median_s": statistics.median(times[m]),
                "max_s": max(times[m]),
                "vs_fixed": statistics.median(times[m]) / fixed,
                "right_picks": right[m],
                "reasons": sorted(reasons[m]),
            }
            for m in MODES
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--slow-ms", type=float, default=4.0)
    parser.add_argument("--samples", type=int, default=10)
    args = parser.parse_args()
    figures = asyncio.run(_main(args.runs, args.slow_ms / 1e3, args.samples))
    rows = []
    for mode, f in figures["modes"].items():
        goal = "<= 40%, 20/20" if mode == "adaptive" else "-"
        rows.append(
            [
                mode,
                f"{f['median_s'] * 1e3:.1f} (max {f['max_s'] * 1e3:.1f})",
                f"{f['vs_fixed']:.0%}",
                f"{f['right_picks']}/{figures['runs']}",
                ", ".join(f["reasons"]),
                goal,
            ]
        )
    body = table(
        ["tuner", "time to decision, ms: median (max)", "vs fixed", "fast pick", "reason", "goal"],
        rows,
    )
    body += (
        f"\n\n{CANDIDATES} implementations: seven sleep {args.slow_ms:g} ms per run on the "
        f"host stream's worker, one {args.slow_ms / 10:g} ms (at position run % 8); warm-up "
        f"1, at most {args.samples} samples; the bound is 30% of a slow run. "
        f"{figures['runs']} runs, every tuner in each (rotated order), fresh tuners in "
        "memory only. Adaptive: `AdaptiveSampling()` defaults (min 3 samples, a "
        "candidate whose best sample is beyond 2x the leader's median is pruned). The "
        "bound alone costs what the implementations before the first within it cost "
        "(on average half the set here). Command: `python benchmarks/bench_autotune.py`."
    )
    write("autotune", "Bounded and adaptive autotune (issue 31)", environment(), body, figures)


if __name__ == "__main__":
    main()
