"""bench_cuda's table: each of issue 11's figures with its peers, ratio and goal.

:func:`markdown` renders ``results/cuda.json`` (and, when given, the runs of the
pure-Python fallback and of the code before issue 11, ``cuda_fallback.json`` and
``cuda_baseline.json``) as the CUDA section of RESULTS.md.
"""

from __future__ import annotations

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


def _both(r: dict[str, Any], key: str, digits: int = 2) -> str:
    return " / ".join(fmt(get(r, c, key), digits) for _, c in LOOPS)


def _rows(r: dict[str, Any]) -> list[tuple[str, str, str, str, str, str]]:
    """(figure, goal, asynccube asyncio / uvloop, peers, ratio(s), verdict)."""
    L, P, F = "launch_us", "client_peers", "floor"
    c_launch = get(r, F, "c_launch_add4_us")
    cupy = get(r, L, "cupy")
    rows = []
    ex = [get(r, c, "execute_unchecked_us") for _, c in LOOPS]
    exf = [ratio(v, c_launch) for v in ex]
    rows.append((
        "host µs per `execute`, 4-arg kernel, UNCHECKED", "<= 1.4x C-loop floor, < CuPy",
        _both(r, "execute_unchecked_us"),
        f"C loop {fmt(c_launch)}, C-ext call {fmt(get(r, F, 'ext_call_launch_add4_us'))}, "
        f"cuda.bindings tuple {fmt(get(r, L, 'raw_tuple'))} / pre-packed "
        f"{fmt(get(r, L, 'raw_prepacked'))}, cuda.core {fmt(get(r, L, 'cuda_core'))}, CuPy "
        f"RawKernel {fmt(cupy)}, torch.add {fmt(get(r, L, 'torch_add'))}",
        " / ".join(_x(v) for v in exf) + " of floor",
        _verdict([_le(v, 1.4) for v in exf] + [None if v is None or cupy is None else v < cupy
                                              for v in ex]),
    ))  # fmt: skip
    ck = [ratio(get(r, c, "execute_checked_us"), get(r, c, "execute_unchecked_us"))
          for _, c in LOOPS]  # fmt: skip
    rows.append(("host µs per `execute`, CHECKED (the default)", "<= 1.15x UNCHECKED",
                 _both(r, "execute_checked_us"), "UNCHECKED above",
                 " / ".join(_x(v) for v in ck), _verdict([_le(v, 1.15) for v in ck])))  # fmt: skip
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
    al = [ratio(get(r, c, "alloc_free_1MiB_us"), raw_al) for _, c in LOOPS]
    rows.append((
        "`empty` + drop of 1 MiB, a pool hit (µs)", "<= 1.0x raw cuMemAllocAsync+FreeAsync",
        _both(r, "alloc_free_1MiB_us"),
        f"cuda.bindings {fmt(raw_al)}, C {fmt(get(r, F, 'c_alloc_free_async_1MiB_us'))}, CuPy "
        f"pool {fmt(get(r, P, 'cupy_alloc_free_1MiB_us'))}, torch "
        f"{fmt(get(r, P, 'torch_alloc_free_1MiB_us'))}",
        " / ".join(_x(v) for v in al), _verdict([_le(v, 1.0) for v in al]),
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
        "`benchmarks/floor.c`, a C loop on the same cubin, and a C-extension call."
    )
    return "\n".join(parts) + "\n"
