"""The tables of ``bench_service.py``: each service's figures, and per asynccube service
each goal of issue 30 with its measured value, met or missed.

Goals, small bodies: asynccube >= 0.9x the numpy floor, >= 0.75x the echo floor,
>= 1.6x the best GPU peer, loop lag p99 <= 5 ms. Compute-bound: >= 0.8x the echo floor,
>= 2.5x ``cupy_streams`` over HTTP, >= 4x ``cupy_blocking``, p99 <= 3x p50.
"""

from __future__ import annotations

import argparse
from typing import Any

from _common import table
from _service_work import GPU_PEERS, OURS

SMALL_GOALS = {"numpy": 0.9, "echo": 0.75, "best_gpu": 1.6, "lag_ms": 5.0}
COMPUTE_GOALS = {"echo": 0.8, "cupy_streams": 2.5, "cupy_blocking": 4.0, "p99_p50": 3.0}


def _rps(peers: dict[str, Any], peer: str) -> float | None:
    value = peers.get(peer, {}).get("requests_per_s")
    return float(value) if value else None


def goal(value: float | None, limit: float, at_most: bool = False, unit: str = "x") -> str:
    """``value`` against its goal: ``1.23x met`` / ``missed``, or ``n/a`` when a figure it
    needs was not measured (a peer skipped)."""
    if value is None:
        return "n/a (not measured)"
    ok = value <= limit if at_most else value >= limit
    return f"{value:.2f}{unit} {'met' if ok else 'missed'}"


def _div(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def _small_rows(by_loop: dict[str, dict[str, Any]]) -> list[list[str]]:
    rows = []
    for loop, peers in by_loop.items():
        gpu = {p: _rps(peers, p) for p in GPU_PEERS if _rps(peers, p)}
        best = max(gpu, key=lambda p: gpu[p] or 0.0) if gpu else None
        numpy, echo = _rps(peers, "numpy_loop"), _rps(peers, "echo")
        for ours in OURS:
            rps = _rps(peers, ours)
            if ours not in peers or rps is None:
                continue
            lag = peers[ours].get("loop_lag_p99_ms")
            g = SMALL_GOALS
            rows.append([f"{loop}, {ours}", goal(_div(rps, numpy), g["numpy"]),
                         goal(_div(rps, echo), g["echo"]),
                         goal(_div(rps, gpu.get(best or "")), g["best_gpu"])
                         + (f" ({best} {gpu[best]:.0f}/s)" if best else ""),
                         goal(lag, g["lag_ms"], at_most=True, unit=" ms")])  # fmt: skip
    return rows


def _compute_rows(by_loop: dict[str, dict[str, Any]]) -> list[list[str]]:
    rows = []
    for loop, peers in by_loop.items():
        echo = _rps(peers, "echo")
        for ours in OURS:
            rps = _rps(peers, ours)
            if ours not in peers or rps is None:
                continue
            r, g = peers[ours], COMPUTE_GOALS
            tail = _div(r.get("p99_ms"), r.get("p50_ms"))
            rows.append([f"{loop}, {ours}", goal(_div(rps, echo), g["echo"]),
                         goal(_div(rps, _rps(peers, "cupy_streams")), g["cupy_streams"]),
                         goal(_div(rps, _rps(peers, "cupy_blocking")), g["cupy_blocking"]),
                         goal(tail, g["p99_p50"], at_most=True)])  # fmt: skip
    return rows


def verdicts(work: str, by_loop: dict[str, dict[str, Any]]) -> str:
    """The goals table of ``work``: one row per server loop and asynccube service."""
    if work == "small":
        g = SMALL_GOALS
        head = ["server loop, service", f"vs numpy floor (goal >= {g['numpy']}x)",
                f"vs echo floor (goal >= {g['echo']}x)",
                f"vs best GPU peer (goal >= {g['best_gpu']}x)",
                f"loop lag p99 (goal <= {g['lag_ms']:g} ms)"]  # fmt: skip
        return table(head, _small_rows(by_loop))
    g = COMPUTE_GOALS
    head = ["server loop, service", f"vs echo floor (goal >= {g['echo']}x)",
            f"vs cupy_streams over HTTP (goal >= {g['cupy_streams']}x)",
            f"vs cupy_blocking (goal >= {g['cupy_blocking']:g}x)",
            f"p99 / p50 (goal <= {g['p99_p50']:g}x)"]  # fmt: skip
    return table(head, _compute_rows(by_loop))


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _figures(by_loop: dict[str, dict[str, Any]], checked: str) -> str:
    rows = []
    for loop, peers in by_loop.items():
        for peer, r in peers.items():
            if "skipped" in r:
                rows.append([loop, peer, "skipped", "-", "-", "-", "-", r["skipped"][:90]])
                continue
            ok = f"{r['checked']} checked, {r['mismatches']} wrong, {r['errors']} errors"
            rows.append([loop, peer, _rps_text(r), _ms(r["p50_ms"]), _ms(r["p99_ms"]),
                         _ms(r["loop_lag_p99_ms"]), _gc_text(r), ok])  # fmt: skip
    return table(["loop", "service", "requests/s", "p50 ms", "p99 ms", "loop lag p99 ms",
                  "GC ms/s, longest, full", checked], rows)  # fmt: skip


def render_http(
    work: str, by_loop: dict[str, dict[str, Any]], args: argparse.Namespace, kernel: dict[str, Any]
) -> str:
    """The figures over HTTP, the goals and how they were measured."""
    return (f"{_figures(by_loop, 'responses checked')}\n\n{verdicts(work, by_loop)}\n\n"
            f"{_how(work, args, kernel)}")  # fmt: skip


def render_direct(work: str, by_loop: dict[str, dict[str, Any]], args: argparse.Namespace) -> str:
    """The services with no HTTP: their figures and asynccube's ratios to the peers."""
    rows = []
    for loop, peers in by_loop.items():
        ours = _rps(peers, "asynccube")
        rows.append([loop, *(f"{x:.2f}x" if (x := _div(ours, _rps(peers, p))) else "-"
                             for p in ("cupy_streams", "cupy_blocking"))])  # fmt: skip
    ratios = table(["loop", "asynccube vs cupy_streams", "asynccube vs cupy_blocking"], rows)
    return (f"No HTTP, {work} workload: {args.clients} tasks in one loop call the handler "
            f"directly ({args.warmup:g} s warm-up, {args.seconds:g} s measured); the loop lag "
            "is counted when the probe was due (a handler that never suspends starves it)."
            f"\n\n{_figures(by_loop, 'answers checked')}\n\n{ratios}")  # fmt: skip


def _how(work: str, args: argparse.Namespace, kernel: dict[str, Any]) -> str:
    """The paragraph under the tables: the load, the floors, the options, the command."""
    frozen = ", with every server's start-up objects frozen (`gc.freeze()`)"
    bound = f"Every server lets at most {args.admit} requests into its handler at once (the "
    options = (frozen if args.gc_freeze else "") + ". "
    options += bound + "others wait, their bodies unread). " if args.admit else ""
    flags = (" --gc-freeze" if args.gc_freeze else "") + (
        f" --admit {args.admit}" if args.admit else ""
    )
    flags += f" --runs {args.runs} --seconds {args.seconds:g} --warmup {args.warmup:g}"
    runs = (
        f", {args.runs} runs (requests/s: the median run's, the lowest and highest)"
        if args.runs > 1
        else ""
    )
    if work == "small":
        what = "256 KiB float32 in, `y = 2x + 1`, 256 KiB out"
    else:
        what = (f"64 KiB float32 in, one block of 256 threads, {kernel.get('iters')} dependent "
                f"FMAs per element ({kernel.get('how')}), 64 KiB out; the CuPy peers run the "
                "same CUDA source (`cupy.RawKernel`)")  # fmt: skip
    return (
        f"Each request: {what}; {args.clients} concurrent clients from {args.procs} load "
        f"processes on loopback, {args.warmup:g} s warm-up then {args.seconds:g} s measured "
        f"per service{runs}. The floor `numpy_loop` computes on the loop with no device; the "
        "echo floor (`echo`) answers the body itself, the HTTP stack's own cost. GC: the "
        f"garbage collector's pauses in the window (they stop the loop too){options}Command: "
        f"`python benchmarks/bench_service.py --device {args.device} --workload {work}{flags}`."
    )


def _rps_text(r: dict[str, Any]) -> str:
    """Requests/s, with the spread of the runs where there are several."""
    runs = r.get("runs_requests_per_s", [])
    spread = f" ({min(runs):.0f}-{max(runs):.0f})" if len(runs) > 1 else ""
    return f"{r['requests_per_s']:.0f}{spread}"


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run of median requests/s, with every run's requests/s and the responses of all
    runs counted; or the first skip."""
    done = sorted((r for r in runs if "skipped" not in r), key=lambda r: r["requests_per_s"])
    if not done:
        return runs[0]
    merged = {**done[(len(done) - 1) // 2]}
    merged["runs_requests_per_s"] = [r["requests_per_s"] for r in runs if "skipped" not in r]
    for key in ("checked", "mismatches", "errors"):
        merged[key] = sum(r[key] for r in done)
    merged["first_error"] = next((r["first_error"] for r in done if r["first_error"]), "")
    return merged


def _gc_text(r: dict[str, Any]) -> str:
    if "gc_ms_per_s" not in r:
        return "-"
    return f"{r['gc_ms_per_s']:.1f}, {r['gc_max_ms']:.1f} ms, {r['gc_full']}"
