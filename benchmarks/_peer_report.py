"""bench_peer's section of RESULTS.md: the curve, the 256 MiB goals run by run, and the
ordering check."""

from __future__ import annotations

import statistics
from typing import Any

from _common import table

GOAL_SIZE = 256 << 20
GOALS = {"torch": 0.90, "raw": 0.85}
"""asynccube's share of each peer's GB/s at :data:`GOAL_SIZE`, in every run (issue 32)."""
TO_CLIENT_US = 50.0
"""The ordering check's goal for one ``to_client`` call of 256 MiB: it does not wait."""


def size_name(size: int) -> str:
    """``4096`` -> ``"4 KiB"``, ``1 << 30`` -> ``"1 GiB"``."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift} {unit}"
    return f"{size} B"


def ratios(row: dict[str, Any], peer: str) -> list[float]:
    """asynccube / ``peer`` in each run of ``row`` (empty if the peer did not run)."""
    return [r["asynccube"] / r[peer] for r in row["runs"] if peer in r]


def _ratio_cell(rs: list[float]) -> str:
    return f"{min(rs):.2f}, {statistics.median(rs):.2f}" if rs else "-"


def _gbps(row: dict[str, Any], who: str) -> str:
    v = row["gbps"].get(who)
    if v is None:
        return "-"
    return f"{v:.1f}" if v >= 10 else f"{v:.3g}"


def _goal_lines(figs: dict[str, Any]) -> list[str]:
    row = next((r for r in figs["sizes"] if r["size"] == GOAL_SIZE), None)
    if row is None:
        return ["No 256 MiB row in this run: the issue's goals are not judged."]
    lines = []
    for peer, goal in GOALS.items():
        rs = ratios(row, peer)
        if not rs:
            lines.append(f"- vs {peer}: not measured ({figs['skipped'].get(peer, '-')}).")
            continue
        verdict = "met" if min(rs) >= goal else "missed"
        each = ", ".join(f"{r:.3f}" for r in rs)
        lines.append(
            f"- asynccube / {peer} at 256 MiB, run by run: {each} (min {min(rs):.3f}, median "
            f"{statistics.median(rs):.3f}); goal >= {goal:.2f} in every run: **{verdict}**."
        )
    return lines


def _ordering_line(o: dict[str, Any]) -> str:
    tries = "; ".join(
        f"to_client {t['to_client_us']:.0f} µs, kernel on the copy queued after "
        f"{t['queued_ms']:.2f} ms, copy read back after {t['done_ms']:.0f} ms"
        for t in o["tries"]
    )
    waits = "no host wait" if o["no_host_wait"] else "**a host wait** (queued late)"
    goal = "met" if o["to_client_us"] < TO_CLIENT_US else "missed"
    return (
        f"Ordering check ({size_name(o['size'])}, source busy {o['spin_ms']:.0f} ms with a "
        f"slow kernel then a write): {tries}. Data {'ok' if o['data_ok'] else '**WRONG**'}, "
        f"{waits}; `to_client` median {o['to_client_us']:.1f} µs (goal < {TO_CLIENT_US:.0f} "
        f"µs: {goal})."
    )


def render(figs: dict[str, Any]) -> str:
    """The markdown body: table, goals, ordering check, command."""
    raw, args = figs["raw"], figs["args"]
    header = ["size", "copies per batch", "asynccube GB/s", "torch .to GB/s", f"{raw} GB/s",
              "asynccube/torch (min, median)", "asynccube/raw (min, median)",
              "bytes checked"]  # fmt: skip
    rows = [
        [size_name(r["size"]), r["copies"], _gbps(r, "asynccube"), _gbps(r, "torch"),
         _gbps(r, "raw"), _ratio_cell(ratios(r, "torch")), _ratio_cell(ratios(r, "raw")),
         "ok" if all(r["checked"].values()) else f"**FAILED** {r['checked']}"]
        for r in figs["sizes"]
    ]  # fmt: skip
    skipped = "".join(f" {k} skipped: {v}." for k, v in figs["skipped"].items())
    how = (
        f"`to_client` from {figs['src']} to {figs['dst']}, path: {figs['path']}.{skipped} "
        f"Each figure is the median over {args['runs']} runs of the best of 3 timed batches "
        "(copies, then a sync); the three are interleaved in each run, and the ratios are "
        "taken run by run."
    )
    cmd = (
        f"Command: `python benchmarks/bench_peer.py --src {args['src']} --dst {args['dst']} "
        f"--max-mib {args['max_mib']} --batch-mib {args['batch_mib']} --runs {args['runs']}`."
    )
    parts = [how, table(header, rows), "\n".join(_goal_lines(figs)),
             _ordering_line(figs["ordering"]), cmd]  # fmt: skip
    return "\n\n".join(parts)
