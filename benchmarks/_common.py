"""Shared by the benchmarks: the environment header and the results files.

Each benchmark writes ``results/<name>.json`` (figures) and ``results/<name>.md`` (its
section of RESULTS.md); ``python benchmarks/report.py`` joins the sections into
``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"


def environment(device: str = "") -> dict[str, str]:
    """Machine, device, versions and date of a run."""
    env = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(),
        "cpu": f"{platform.machine()}, {os.cpu_count()} cores",
        "device": device or "host (numpy)",
    }
    for pkg in ("asynccube", "numpy", "cuda-bindings", "cuda-core"):
        try:
            env[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            env[pkg] = "-"
    if env["asynccube"] == "-":  # run from a checkout (PYTHONPATH=src): its own version
        try:
            from asynccube import __version__

            env["asynccube"] = f"{__version__} (source)"
        except ImportError:
            pass
    return env


def best_of(fn: Callable[[], float], rounds: int) -> float:
    """The smallest of ``rounds`` measurements (the least disturbed by other load)."""
    return min(fn() for _ in range(rounds))


def median_of(fn: Callable[[], float], rounds: int) -> float:
    """The median of ``rounds`` measurements."""
    return statistics.median(fn() for _ in range(rounds))


def median_us(fn: Callable[[], object], calls: int) -> float:
    """The median of ``calls`` timed calls of ``fn``, in µs (each call timed alone)."""
    samples = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e6


async def amedian_us(fn: Callable[[], Awaitable[object]], calls: int) -> float:
    """:func:`median_us` of ``await fn()``."""
    samples = []
    for _ in range(calls):
        t0 = time.perf_counter()
        await fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e6


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def write(name: str, title: str, env: dict[str, str], body: str, figures: dict[str, Any]) -> None:
    """Write ``results/<name>.json`` and ``results/<name>.md``; print the section."""
    RESULTS.mkdir(exist_ok=True)
    header = ", ".join(f"{k} {v}" for k, v in env.items())
    section = f"## {title}\n\n{header}\n\n{body}\n"
    (RESULTS / f"{name}.md").write_text(section)
    (RESULTS / f"{name}.json").write_text(json.dumps({"environment": env, **figures}, indent=2))
    print(section)


def clock() -> float:
    """A monotonic high-resolution clock, in seconds."""
    return time.perf_counter()
