"""bench_cuda's table: each of issue 11's figures with its peers, ratio and goal.

:func:`markdown` renders ``results/cuda.json`` (and, when given, the runs of the
pure-Python fallback and of the code before issue 11, ``cuda_fallback.json`` and
``cuda_baseline.json``) as the CUDA section of RESULTS.md.
"""

from __future__ import annotations

import statistics
from typing import Any

LOOPS = (("asyncio", "client"), ("uvloop", "client_uvloop"))


def get(r: dict[str, Any] | None, *path: str) -> float | None:
    """``r[path[0]][path[1]]...`` as a float, or None."""
    cur: Any = r
    for key in path:
        if not isinstance(cur, dict) or key not in cur:
            return None
        cur = cur[key]
    return float(cur) if isinstance(cur, int | float) else None


def fmt(v: float | None, digits: int = 2) -> str:
    return "n/a" if v is None else f"{v:.{digits}f}"


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def _x(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}x"


def _verdict(ok: list[bool | None]) -> str:
    known = [v for v in ok if v is not None]
    if not known:
        return "n/a"
    return ("met" if all(known) else "missed") + ("" if len(known) == len(ok) else " (partial)")


def _le(v: float | None, limit: float) -> bool | None:
    return None if v is None else v <= limit


def _ge(v: float | None, limit: float) -> bool | None:
    return None if v is None else v >= limit


def paired(r: dict[str, Any], loop: str, rounds: str, num: str, den: str) -> list[float]:
    """``num / den`` in each round of ``r[loop][rounds]`` that has both (the figures of a
    round were measured side by side), sorted."""
    found = r.get(loop, {}).get(rounds) if isinstance(r.get(loop), dict) else None
    out = []
    for x in found if isinstance(found, list) else []:
        q = ratio(x.get(num), x.get(den)) if isinstance(x, dict) else None
        if q is not None:
            out.append(q)
    return sorted(out)


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _paired_text(qs: list[list[float]]) -> str:
    """Each loop's median ratio, then the count of rounds and each loop's range."""
    meds = " / ".join(_x(_median(q)) for q in qs)
    spans = " / ".join(f"{q[0]:.2f}-{q[-1]:.2f}x" if q else "n/a" for q in qs)
    return f"{meds} (median of {max(len(q) for q in qs)} paired rounds; {spans})"


def _span(r: dict[str, Any], key: str) -> str:
    """The median and range of ``key`` over both loops' execute rounds, e.g. "3.0 (2.5-3.3)"."""
    vs = sorted(x[key] for _, c in LOOPS for x in r.get(c, {}).get("execute_rounds", [])
                if isinstance(x, dict) and x.get(key))  # fmt: skip
    return f"{fmt(_median(vs))} ({fmt(vs[0])}-{fmt(vs[-1])})" if vs else "n/a"


def _both(r: dict[str, Any], key: str, digits: int = 2) -> str:
    return " / ".join(fmt(get(r, c, key), digits) for _, c in LOOPS)


def _rows(r: dict[str, Any]) -> list[tuple[str, str, str, str, str, str]]:
    """(figure, goal, asynccube asyncio / uvloop, peers, ratio(s), verdict)."""
    L, P, F = "launch_us", "client_peers", "floor"
    c_launch = get(r, F, "c_launch_add4_us")
    cupy = get(r, L, "cupy")
    rows = []
    ex = [get(r, c, "execute_unchecked_us") for _, c in LOOPS]
    here = [paired(r, c, "execute_rounds", "unchecked_us", "c_loop_here_us") for _, c in LOOPS]
    prog = [paired(r, c, "execute_rounds", "unchecked_us", "c_floor_us") for _, c in LOOPS]
    ext = [paired(r, c, "execute_rounds", "unchecked_us", "ext_call_us") for _, c in LOOPS]
    if all(here):  # each round beside its own floors: judged on the C loop in-process
        exf = [_median(q) for q in here]
        ex_text = (f"{_paired_text(here)} of the C loop in this process; "
                   f"{_paired_text(prog)} of the C loop program; "
                   f"{_paired_text(ext)} of a C-extension call")  # fmt: skip
        floor_text = (f"C loop in this process {_span(r, 'c_loop_here_us')}, C loop program "
                      f"{_span(r, 'c_floor_us')} ({fmt(c_launch)} in the floor section), "
                      f"C-ext call {_span(r, 'ext_call_us')}")  # fmt: skip
    else:
        exf = [ratio(v, c_launch) for v in ex]
        ex_text = " / ".join(_x(v) for v in exf) + " of floor"
        floor_text = (
            f"C loop {fmt(c_launch)}, C-ext call {fmt(get(r, F, 'ext_call_launch_add4_us'))}"
        )
    rows.append((
        "host µs per `execute`, 4-arg kernel, UNCHECKED", "<= 1.4x C-loop floor, < CuPy",
        _both(r, "execute_unchecked_us"),
        f"{floor_text}, "
        f"cuda.bindings tuple {fmt(get(r, L, 'raw_tuple'))} / pre-packed "
        f"{fmt(get(r, L, 'raw_prepacked'))}, cuda.core {fmt(get(r, L, 'cuda_core'))}, CuPy "
        f"RawKernel {fmt(cupy)}, torch.add {fmt(get(r, L, 'torch_add'))}",
        ex_text,
        _verdict([_le(v, 1.4) for v in exf] + [None if v is None or cupy is None else v < cupy
                                              for v in ex]),
    ))  # fmt: skip
    ckq = [paired(r, c, "execute_rounds", "checked_us", "unchecked_us") for _, c in LOOPS]
    if all(ckq):
        ck = [_median(q) for q in ckq]
        ck_text = _paired_text(ckq)
    else:
        ck = [ratio(get(r, c, "execute_checked_us"), get(r, c, "execute_unchecked_us"))
              for _, c in LOOPS]  # fmt: skip
        ck_text = " / ".join(_x(v) for v in ck)
    rows.append(("host µs per `execute`, CHECKED (the default)", "<= 1.15x UNCHECKED",
                 _both(r, "execute_checked_us"), "UNCHECKED above",
                 ck_text, _verdict([_le(v, 1.15) for v in ck])))  # fmt: skip
    raw_rd = get(r, P, "raw_read_1KiB_us")
    rd = [ratio(get(r, c, "read_1KiB_us"), raw_rd) for _, c in LOOPS]
    rows.append((
        "await 1 KiB read, round trip (µs)", "<= 1.5x raw DtoHAsync+sync",
        _both(r, "read_1KiB_us"),
        f"cuda.bindings DtoHAsync+sync {fmt(raw_rd)}, C {fmt(get(r, F, 'c_read_1KiB_sync_us'))}"
        f", torch .cpu() {fmt(get(r, P, 'torch_cpu_1KiB_us'))}, CuPy .get() "
        f"{fmt(get(r, P, 'cupy_get_1KiB_us'))}",
        " / ".join(_x(v) for v in rd), _verdict([_le(v, 1.5) for v in rd]),
    ))  # fmt: skip
    raw_sy = get(r, "roundtrip_us", "raw_stream_sync")
    sy = [ratio(get(r, c, "sync_after_launch_us"), raw_sy) for _, c in LOOPS]
    rows.append((
        "await sync after one launch (µs)", "<= 1.3x raw launch+sync",
        _both(r, "sync_after_launch_us"),
        f"cuda.bindings launch+cuStreamSynchronize {fmt(raw_sy)}, C "
        f"{fmt(get(r, F, 'c_launch_sync_us'))}",
        " / ".join(_x(v) for v in sy), _verdict([_le(v, 1.3) for v in sy]),
    ))  # fmt: skip
    raw_al = get(r, P, "raw_cuMemAllocAsync_free_1MiB_us")
    alq = [paired(r, c, "alloc_rounds", "asynccube_us", "raw_us") for _, c in LOOPS]
    raws = sorted(x["raw_us"] for _, c in LOOPS
                  for x in r.get(c, {}).get("alloc_rounds", []) if x.get("raw_us"))  # fmt: skip
    if all(alq):
        al = [_median(q) for q in alq]
        al_text = _paired_text(alq)
        raw_text = (
            f"cuda.bindings {fmt(_median(raws))} (beside the rounds: {fmt(raws[0])}-"
            f"{fmt(raws[-1])}; {fmt(raw_al)} with the peers)"
        )
    else:
        al = [ratio(get(r, c, "alloc_free_1MiB_us"), raw_al) for _, c in LOOPS]
        al_text = " / ".join(_x(v) for v in al)
        raw_text = f"cuda.bindings {fmt(raw_al)}"
    rows.append((
        "`empty` + drop of 1 MiB, a pool hit (µs)", "<= 1.0x raw cuMemAllocAsync+FreeAsync",
        _both(r, "alloc_free_1MiB_us"),
        f"{raw_text}, C {fmt(get(r, F, 'c_alloc_free_async_1MiB_us'))}, CuPy "
        f"pool {fmt(get(r, P, 'cupy_alloc_free_1MiB_us'))}, torch "
        f"{fmt(get(r, P, 'torch_alloc_free_1MiB_us'))}",
        al_text, _verdict([_le(v, 1.0) for v in al]),
    ))  # fmt: skip
    cc = [get(r, c, "concurrency_speedup") for _, c in LOOPS]
    rows.append((
        "4 tasks x 1000 small kernels vs 1 task x 4000 (speed-up)", ">= 3x",
        _both(r, "concurrency_speedup"),
        "one task / four tasks (ms): " + "; ".join(
            f"{fmt(get(r, c, 'one_task_4000_ms'), 1)} / {fmt(get(r, c, 'four_tasks_1000_ms'), 1)}"
            for _, c in LOOPS),
        " / ".join(_x(v) for v in cc), _verdict([_ge(v, 3.0) for v in cc]),
    ))  # fmt: skip
    pg = get(r, "storage", "h2d_pageable_GBs")
    wp = [ratio(get(r, c, "write_256MiB_pageable_GBs"), pg) for _, c in LOOPS]
    rows.append((
        "256 MiB `write` from pageable bytes (GB/s)", ">= 90% of pageable cuMemcpyHtoD",
        _both(r, "write_256MiB_pageable_GBs"), f"pageable cuMemcpyHtoDAsync {fmt(pg)}",
        " / ".join(_x(v) for v in wp), _verdict([_ge(v, 0.9) for v in wp]),
    ))  # fmt: skip
    pn = get(r, "storage", "h2d_pinned_GBs")
    ws = [ratio(get(r, c, "write_256MiB_staging_GBs"), pn) for _, c in LOOPS]
    rows.append((
        "256 MiB `write` from `staging()` (GB/s)", ">= 90% of pinned",
        _both(r, "write_256MiB_staging_GBs"), f"pinned cuMemcpyHtoDAsync {fmt(pn)}",
        " / ".join(_x(v) for v in ws), _verdict([_ge(v, 0.9) for v in ws]),
    ))  # fmt: skip
    d2h = get(r, "storage", "d2h_pinned_GBs")
    rb = [ratio(get(r, c, "read_256MiB_GBs"), d2h) for _, c in LOOPS]
    rows.append((
        "256 MiB read (GB/s)", "(issue 5: >= 90% of pinned)", _both(r, "read_256MiB_GBs"),
        f"pinned cuMemcpyDtoHAsync {fmt(d2h)}, pageable "
        f"{fmt(get(r, 'storage', 'd2h_pageable_GBs'))}",
        " / ".join(_x(v) for v in rb), _verdict([_ge(v, 0.9) for v in rb]),
    ))  # fmt: skip
    rows.append((
        "loop while awaiting a 1 s kernel: lag p99 ms / CPU %", "(issue 5: <= 1 ms / <= 10%)",
        "; ".join(f"{fmt(get(r, c, 'long_wait_lag_p99_ms'))} / "
                  f"{fmt(get(r, c, 'long_wait_cpu_pct'), 1)}" for _, c in LOOPS),
        "idle loop: " + fmt(get(r, "long_wait", "idle_baseline", "lag_p99_ms")), "", "",
    ))  # fmt: skip
    return rows


FALLBACK_KEYS = (
    ("execute UNCHECKED (µs)", "execute_unchecked_us", False),
    ("execute CHECKED (µs)", "execute_checked_us", False),
    ("await 1 KiB read (µs)", "read_1KiB_us", False),
    ("await sync after a launch (µs)", "sync_after_launch_us", False),
    ("empty + drop 1 MiB (µs)", "alloc_free_1MiB_us", False),
    ("4 tasks vs 1 (speed-up)", "concurrency_speedup", True),
    ("256 MiB write, pageable (GB/s)", "write_256MiB_pageable_GBs", True),
    ("256 MiB write, staging (GB/s)", "write_256MiB_staging_GBs", True),
)


def fallback_table(
    r: dict[str, Any], fallback: dict[str, Any] | None, baseline: dict[str, Any] | None
) -> str:
    """The pure-Python fallback beside the code before issue 11 (asyncio), same machine."""
    if not fallback and not baseline:
        return ""
    out = [
        "Pure-Python fallback (`ASYNCCUBE_NO_EXTENSIONS=1`) against the code before issue 11 "
        "(same machine, asyncio; goal: not slower):",
        "",
        "| figure | before issue 11 | fallback | compiled | fallback vs before |",
        "| --- | --- | --- | --- | --- |",
    ]
    for label, key, higher_better in FALLBACK_KEYS:
        b, f, n = get(baseline, "client", key), get(fallback, "client", key), get(r, "client", key)
        q = ratio(f, b)
        verdict = "n/a" if q is None else (
            "not slower" if (q >= 0.95 if higher_better else q <= 1.05) else "slower")  # fmt: skip
        out.append(f"| {label} | {fmt(b)} | {fmt(f)} | {fmt(n)} | {_x(q)} ({verdict}) |")
    return "\n".join(out) + "\n"


def header(r: dict[str, Any]) -> str:
    env = r.get("environment", {})
    keys = ("device", "driver_version", "python", "cuda.bindings", "nvrtc", "cuda.core",
            "cupy", "torch", "uvloop", "hot_path", "date")  # fmt: skip
    facts = ", ".join(f"{k} {env.get(k, '?')}" for k in keys)
    return f"## CUDA hot path (issues 5, 11)\n\n{facts}"


def markdown(
    r: dict[str, Any],
    fallback: dict[str, Any] | None = None,
    baseline: dict[str, Any] | None = None,
) -> str:
    """The CUDA section of RESULTS.md."""
    lines = [
        "| figure | goal | asynccube asyncio / uvloop | peers and floors (same run) | ratio "
        "asyncio / uvloop | goal |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in _rows(r)]
    parts = [header(r), "", *lines, "", fallback_table(r, fallback, baseline)]
    parts.append(
        "Command: `scripts/gpu-check benchmarks/bench_gpu.sh` on the GPU machine (tool `run`, "
        "carry `.whl`); every figure from one run: best of 3 rounds (launch, execute, "
        "alloc), median of 2000 (round trips), best of 4-5 (bandwidth). Floors: "
        "`benchmarks/floor.c`, a C loop on the same cubin, and a C-extension call. "
        "Execute and `empty` + drop run in 5 rounds (`ASYNCCUBE_BENCH_ROUNDS`), each beside "
        "fresh runs of its peers (the C loop program, the same C loop inside this process, "
        "a C-extension call; cuda.bindings' alloc + free), the order alternated: their "
        "ratios are the median of the rounds' ratios (execute judged on the C loop inside "
        "the process), since these machines drift by 20-30% within seconds. The absolute "
        "figures are the best round."
    )
    return "\n".join(parts) + "\n"
