"""The copy helpers of the compiled hot path (issue 38, the 1 MiB request): what a host
copy of a request body into page-locked staging costs the calling thread (the loop's).

    python benchmarks/bench_copy_helpers.py [--sizes 262144,1048576] [--copies 2000]

``hot.copy_into(dst, src, threads)`` splits a copy of 256 KiB to 16 MiB into 64 KiB
pieces that the caller and up to ``threads - 1`` helpers (3 at most) take in turn. For
each size it times the call, wall and the calling thread's CPU (µs per copy), with no
helper (``threads`` 1: the copy before the helpers) and with ``transfers.COPY_HELPERS``
(this machine's policy; 0 below 8 cores) and 3, into one warm target (a body staged into
the same pinned buffer each time) and into 64 rotating ones (64 requests in flight: the
targets fall out of the caches), back to back and with a pause between copies (requests
a few hundred µs apart: helpers asleep or watching). Needs the compiled extension; no GPU
(the targets are ordinary memory, touched first, as pinned memory is). Figures and the
analysis: ``notes/copy_helpers.md``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _common import table


def _spin(seconds: float) -> None:
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


def measure(
    hot: object, size: int, threads: int, targets: int, gap_us: float, copies: int
) -> tuple[float, float]:
    """(wall µs, calling thread's CPU µs) per copy, the best of 3 rounds by wall."""
    copy = hot.copy_into  # type: ignore[attr-defined]
    src = np.random.default_rng(size).integers(0, 255, size, dtype=np.uint8)
    dsts = [np.ones(size, np.uint8) for _ in range(targets)]
    best = (float("inf"), 0.0)
    for _ in range(3):
        wall = cpu = 0.0
        for i in range(copies):
            w0, c0 = time.perf_counter(), time.thread_time()
            copy(dsts[i % targets], src, threads)
            wall += time.perf_counter() - w0
            cpu += time.thread_time() - c0
            if gap_us:
                _spin(gap_us * 1e-6)
        best = min(best, (wall / copies * 1e6, cpu / copies * 1e6))
    assert np.array_equal(dsts[0], src)
    return best


def main() -> None:
    """Print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="262144,1048576")
    ap.add_argument("--copies", type=int, default=2000)
    args = ap.parse_args()
    from asynccube._core.cuda.native.hotpath import ACTIVE, hot
    from asynccube._core.cuda.transfers import COPY_HELPERS

    if ACTIVE != "native":
        sys.exit("needs the compiled extension (the twin has no copy helpers)")
    helpers = sorted({0, COPY_HELPERS, 3})
    rows = []
    for size in (int(s) for s in args.sizes.split(",")):
        for targets, gap in ((1, 0.0), (64, 0.0), (64, 300.0)):
            cells = []
            for h in helpers:
                wall, cpu = measure(hot, size, 1 + h, targets, gap, args.copies)
                cells.append(f"{wall:.1f} / {cpu:.1f}")
            rows.append([f"{size >> 10} KiB", str(targets), f"{gap:.0f}", *cells])
    head = ["size", "targets", "pause µs", *(f"{h} helpers: wall / CPU µs" for h in helpers)]
    print(f"COPY_HELPERS on this machine: {COPY_HELPERS}\n")
    print(table(head, rows))
    pooled, pieces = hot.copy_stats()
    print(f"\ncopies through the helpers: {pooled}, pieces they took: {pieces}")


if __name__ == "__main__":
    main()
