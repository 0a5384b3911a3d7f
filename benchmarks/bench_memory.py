"""Memory management benchmarks: hot-path cost, reservation amplification, many tasks.

Run with ``python benchmarks/bench_memory.py`` (``--quick`` for a short run). Prints a
table and writes the figures to ``benchmarks/results/memory.json``.

1. Pool-hit alloc+free: ``reserve`` + dropping the ``SliceHandle`` (its ``__del__``
   queues the id) + the next ``reserve``, which drains the queue and hands the same slice
   back. Shown beside what a host user would do without a pool (``numpy.empty``).
2. Reservation amplification: a mixed-size trace (1 KiB .. 512 MiB, a recurring
   "program" of allocations with lifetimes, plus one allocation in five of a fresh
   random size) on a fake storage that allocates nothing. Figure: peak bytes reserved /
   peak bytes in use (requested).
3. 200 short-lived tasks doing the work of one: the same 200 units of work, run by one
   task in sequence, and by 200 tasks each running one unit on its own stream, each
   task starting before the previous one has freed everything (they overlap by half a
   unit). All tasks share the server's one manager. Figure: peak bytes reserved (200
   tasks) / peak bytes reserved (one task). For contrast, the same with one manager per
   stream, the layout that burn#4991 reports growing.
"""

from __future__ import annotations

import argparse
import gc
import heapq
import itertools
import json
import platform
import random
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from asynccube._core.memory import (  # noqa: E402
    BytesStorage,
    MemoryConfig,
    MemoryManagement,
    SliceHandle,
    StorageHandle,
)

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

GOAL_HOT_US = 2.0
GOAL_AMPLIFICATION = 1.25
GOAL_TASKS = 1.5


class FakeStorage:
    """A storage that hands out address ranges without allocating anything."""

    alignment = 512
    max_alloc: int | None = None

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self.sizes: dict[int, int] = {}
        self.allocs = 0
        self.deallocs = 0

    def alloc(self, size: int) -> StorageHandle:
        self.allocs += 1
        sid = next(self._ids)
        self.sizes[sid] = size
        return StorageHandle(sid, 0, size)

    def dealloc(self, storage_id: int) -> None:
        self.deallocs += 1
        self.sizes.pop(storage_id, None)

    def resource(self, handle: StorageHandle) -> int:
        return handle.id << 40 | handle.offset

    def storage_ids(self) -> Iterator[int]:
        return iter(list(self.sizes))


# -- 1. hot path ------------------------------------------------------------------------


def _hot_loop(mm: MemoryManagement[object], size: int) -> Callable[[int], None]:
    reserve = mm.reserve
    warm = reserve(size)
    del warm

    def loop(count: int) -> None:
        for _ in range(count):
            handle = reserve(size)
            del handle

    return loop


def _floor_loop(mm: MemoryManagement[object]) -> Callable[[int], None]:
    queue = mm.queue
    pending = queue._queue

    def loop(count: int) -> None:
        for _ in range(count):
            handle = SliceHandle(1, queue)
            del handle
            pending.popleft()

    return loop


def _numpy_loop(size: int) -> Callable[[int], None]:
    def loop(count: int) -> None:
        empty, u8 = np.empty, np.uint8
        for _ in range(count):
            arr = empty(size, u8)
            del arr

    return loop


def hot_paths(n: int, rounds: int) -> dict[str, float]:
    """µs per operation, best of ``rounds`` interleaved rounds of ``n`` operations.

    - ``reserve+free <size>``: ``reserve`` + drop the SliceHandle + the next ``reserve``
      draining it (the slice comes from its pool every time);
    - ``floor``: a SliceHandle created, dropped and its id drained, nothing else: what
      any reserve costs at least;
    - ``numpy.empty <size>``: ``numpy.empty`` + drop, the host user's way without a pool.

    Rounds alternate between the cases so each samples the same moments of a shared,
    noisy machine; the minimum is the uncontended cost.
    """
    mm: MemoryManagement[object] = MemoryManagement(BytesStorage(), owner_id=1)
    cases: dict[str, tuple[Callable[[int], None], int]] = {
        "reserve+free 1 KiB (sliced)": (_hot_loop(mm, KiB), n),
        "reserve+free 4 MiB (sliced)": (_hot_loop(mm, 4 * MiB), n),
        "reserve+free 64 MiB (exclusive)": (_hot_loop(mm, 64 * MiB), n),
        "floor: SliceHandle create+drop+drain": (_floor_loop(mm), n),
        "numpy.empty 1 KiB": (_numpy_loop(KiB), n),
        "numpy.empty 4 MiB": (_numpy_loop(4 * MiB), max(1, n // 10)),
    }
    best = dict.fromkeys(cases, float("inf"))
    for _ in range(rounds):
        for name, (loop, count) in cases.items():
            gc.disable()
            start = time.perf_counter()
            loop(count)
            elapsed = time.perf_counter() - start
            gc.enable()
            best[name] = min(best[name], elapsed / count * 1e6)
    mm.close()
    return best


# -- 2. amplification -------------------------------------------------------------------


def _log_uniform(rng: random.Random, low: int, high: int) -> int:
    return int(low * (high / low) ** rng.random()) & ~3 or 4


def mixed_trace(seed: int, iterations: int) -> list[tuple[int, int]]:
    """A list of ``(size, lifetime in steps)``: a recurring program of 200 allocations
    whose sizes come from a catalogue of 64 tensor sizes (1 KiB .. 512 MiB), one in five
    replaced by a fresh random size; 24 long-lived buffers (weights) come first."""
    rng = random.Random(seed)
    catalogue = [_log_uniform(rng, KiB, 512 * MiB) for _ in range(64)]
    program = [(rng.choice(catalogue), 1 + int(rng.expovariate(1 / 12))) for _ in range(200)]
    trace = [(rng.choice(catalogue), 10**9) for _ in range(24)]
    for _ in range(iterations):
        for size, life in program:
            if rng.random() < 0.2:
                size = _log_uniform(rng, KiB, 512 * MiB)
            trace.append((size, life))
    return trace


def amplification(config: MemoryConfig, trace: list[tuple[int, int]]) -> dict[str, float]:
    """Replay ``trace``; peak bytes reserved over peak bytes in use."""
    storage = FakeStorage()
    mm = MemoryManagement(storage, config, owner_id=1)
    live: list[tuple[int, int, int, SliceHandle]] = []
    in_use = peak_use = peak_reserved = 0
    for step, (size, life) in enumerate(trace):
        while live and live[0][0] <= step:
            in_use -= heapq.heappop(live)[2]
        handle = mm.reserve(size)
        in_use += size
        heapq.heappush(live, (step + life, step, size, handle))
        del handle
        peak_use = max(peak_use, in_use)
        peak_reserved = max(peak_reserved, mm.bytes_reserved)
    live.clear()
    mm.cleanup(explicit=True)
    after = mm.memory_usage().bytes_reserved
    mm.close()
    return {
        "peak_in_use_bytes": peak_use,
        "peak_reserved_bytes": peak_reserved,
        "ratio": peak_reserved / peak_use,
        "reserved_after_cleanup_bytes": after,
        "storage_allocs_per_1000_reserves": 1000 * storage.allocs / len(trace),
    }


# -- 3. many short-lived tasks ----------------------------------------------------------


def unit_events(rng: random.Random) -> list[tuple[str, int, int]]:
    """One unit of work: 8 buffers (1 KiB .. 64 MiB) allocated in turn, each freed a few
    steps later, everything freed at the end. Events are ``("a"|"f", key, size)``."""
    sizes = [_log_uniform(rng, KiB, 64 * MiB) for _ in range(8)]
    events: list[tuple[str, int, int]] = []
    for i, size in enumerate(sizes):
        events.append(("a", i, size))
        if i >= 2:
            events.append(("f", i - 2, 0))
    events += [("f", 6, 0), ("f", 7, 0)]
    return events


def run_schedule(
    schedule: list[tuple[int, str, int, int]], managers: Callable[[int], MemoryManagement[int]]
) -> dict[str, int]:
    """Replay ``(task, kind, key, size)`` events; peak reserved (summed over the distinct
    managers) and peak in use."""
    held: dict[tuple[int, int], tuple[int, SliceHandle]] = {}
    seen: dict[int, MemoryManagement[int]] = {}
    in_use = peak_use = peak_reserved = reserved = 0
    for task, kind, key, size in schedule:
        mm = managers(task)
        seen.setdefault(id(mm), mm)
        if kind == "a":
            before = mm.bytes_reserved
            held[task, key] = (size, mm.reserve(size))
            reserved += mm.bytes_reserved - before
            in_use += size
        else:
            freed, _ = held.pop((task, key))
            in_use -= freed
        peak_use = max(peak_use, in_use)
        peak_reserved = max(peak_reserved, reserved)
    for mm in seen.values():
        mm.close()
    return {"peak_reserved_bytes": peak_reserved, "peak_in_use_bytes": peak_use}


def many_tasks(config: MemoryConfig, seed: int, units: int = 200) -> dict[str, float]:
    rng = random.Random(seed)
    work = [unit_events(rng) for _ in range(units)]
    sequential = [(0, k, key + 100 * u, s) for u, ev in enumerate(work) for k, key, s in ev]
    overlapped: list[tuple[int, str, int, int]] = []
    for u, ev in enumerate(work):
        half = len(ev) // 2
        # the second half of unit u interleaves with the first half of unit u + 1
        nxt = work[u + 1][: len(work[u + 1]) // 2] if u + 1 < units else []
        if u == 0:
            overlapped += [(0, k, key, s) for k, key, s in ev[:half]]
        for i in range(max(len(ev) - half, len(nxt))):
            if i < len(ev) - half:
                k, key, s = ev[half + i]
                overlapped.append((u, k, key, s))
            if i < len(nxt):
                k, key, s = nxt[i]
                overlapped.append((u + 1, k, key, s))
    shared = MemoryManagement(FakeStorage(), config, owner_id=1)
    one = run_schedule(sequential, lambda _t: shared)
    shared = MemoryManagement(FakeStorage(), config, owner_id=2)
    many = run_schedule(overlapped, lambda _t: shared)
    per_stream: dict[int, MemoryManagement[int]] = {}

    def own(task: int) -> MemoryManagement[int]:
        if task not in per_stream:
            per_stream[task] = MemoryManagement(FakeStorage(), config, owner_id=10 + task)
        return per_stream[task]

    split = run_schedule(overlapped, own)
    return {
        "one_task_peak_reserved_bytes": one["peak_reserved_bytes"],
        "one_task_peak_in_use_bytes": one["peak_in_use_bytes"],
        "tasks_peak_reserved_bytes": many["peak_reserved_bytes"],
        "tasks_peak_in_use_bytes": many["peak_in_use_bytes"],
        "ratio": many["peak_reserved_bytes"] / one["peak_reserved_bytes"],
        "in_use_ratio": many["peak_in_use_bytes"] / one["peak_in_use_bytes"],
        "manager_per_stream_ratio": split["peak_reserved_bytes"] / one["peak_reserved_bytes"],
    }


# -- report -----------------------------------------------------------------------------


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/memory.json")
    args = parser.parse_args()
    n, repeats, iterations = (20_000, 3, 5) if args.quick else (20_000, 51, 30)

    hot = hot_paths(n, repeats)
    configs = {"default": MemoryConfig.default(), "exclusive_pages": MemoryConfig.exclusive_pages()}
    trace = mixed_trace(seed=7, iterations=iterations)
    amp = {name: amplification(cfg, trace) for name, cfg in configs.items()}
    other_seeds = {
        seed: amplification(configs["default"], mixed_trace(seed, iterations))["ratio"]
        for seed in range(1, 6)
    }
    tasks = {name: many_tasks(cfg, seed=11) for name, cfg in configs.items()}

    print(
        f"asynccube memory benchmarks ({platform.python_implementation()} "
        f"{platform.python_version()}, {platform.machine()})\n"
    )
    print("| measure | asynccube | baseline | ratio | goal |")
    print("| --- | --- | --- | --- | --- |")
    floor = hot["floor: SliceHandle create+drop+drain"]
    for size in ("1 KiB", "4 MiB"):
        us, ref = hot[f"reserve+free {size} (sliced)"], hot[f"numpy.empty {size}"]
        goal = f"<= {GOAL_HOT_US} µs" if size == "1 KiB" else "-"
        print(
            f"| pool-hit reserve+free, {size} (sliced) | {us:.2f} µs | numpy.empty + drop "
            f"{ref:.2f} µs | {us / ref:.2f}x | {goal} |"
        )
    us = hot["reserve+free 64 MiB (exclusive)"]
    print(f"| pool-hit reserve+free, 64 MiB (exclusive) | {us:.2f} µs | - | - | - |")
    print(f"| floor: SliceHandle create+drop+drain alone | {floor:.2f} µs | - | - | - |")
    for name, r in amp.items():
        print(
            f"| amplification ({name}), {len(trace)} allocations | {r['ratio']:.3f} | "
            f"peak reserved {_fmt_bytes(r['peak_reserved_bytes'])} / in use "
            f"{_fmt_bytes(r['peak_in_use_bytes'])}; "
            f"{r['storage_allocs_per_1000_reserves']:.0f} storage allocs / 1000 reserves "
            f"| - | <= {GOAL_AMPLIFICATION} |"
        )
    spread = ", ".join(f"{r:.3f}" for r in other_seeds.values())
    print(
        f"| amplification (default), traces of seeds 1-5 | {max(other_seeds.values()):.3f} max "
        f"| {spread} | - | <= {GOAL_AMPLIFICATION} |"
    )
    for name, r in tasks.items():
        print(
            f"| 200 tasks vs 1, reserved ({name}) | {r['ratio']:.3f} | in-use ratio "
            f"{r['in_use_ratio']:.3f}; manager per stream {r['manager_per_stream_ratio']:.1f} "
            f"| - | <= {GOAL_TASKS} |"
        )
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "quick": args.quick,
        "hot_path_us": hot,
        "amplification": amp,
        "trace_allocations": len(trace),
        "amplification_default_other_seeds": other_seeds,
        "tasks": tasks,
        "goals": {
            "hot_path_us": GOAL_HOT_US,
            "amplification": GOAL_AMPLIFICATION,
            "tasks_ratio": GOAL_TASKS,
        },
        "met": {
            "hot_path": hot["reserve+free 1 KiB (sliced)"] <= GOAL_HOT_US,
            "amplification": amp["default"]["ratio"] <= GOAL_AMPLIFICATION,
            "tasks": tasks["default"]["ratio"] <= GOAL_TASKS,
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
