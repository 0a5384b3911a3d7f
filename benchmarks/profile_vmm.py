"""What each call of the driver's virtual memory API costs, and where an expandable
client's time goes (issue 40, the expandable pool).

Run on a GPU: ``python benchmarks/profile_vmm.py [--device cuda:0]``. Prints, and writes
``profiles/vmm/<gpu>.md``:

- the raw calls, timed one by one with ``time.perf_counter_ns`` around each binding
  call (best, median and worst of ``--repeat``): ``cuMemAddressReserve`` of the range an
  expandable client reserves (twice the device's memory), ``cuMemCreate`` +
  ``cuMemMap`` of one chunk (2 MiB) and of 10 chunks, ``cuMemSetAccess`` per chunk and
  for a run of them, ``cuMemUnmap`` + ``cuMemRelease``, ``cuMemGetInfo``, and beside
  them ``cuMemAlloc`` / ``cuMemFree`` of the same sizes (what the default pools pay);
- the first steps of an expandable client (the GPU test's sequence: create 4 bodies,
  read, write, read, free), each step's wall time on the loop, and the functions that
  took the loop's time (cProfile, top 25 by cumulative time).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _timed(fn: Any, *args: Any) -> tuple[float, Any]:
    t0 = time.perf_counter_ns()
    out = fn(*args)
    return (time.perf_counter_ns() - t0) / 1e3, out


def _ok(result: Any) -> Any:
    err = result[0]
    if int(err):
        raise RuntimeError(f"driver error {err}")
    return result[1] if len(result) == 2 else result[1:]


def _row(name: str, times: list[float]) -> str:
    return (
        f"| {name} | {min(times):.1f} | {statistics.median(times):.1f} | "
        f"{max(times):.1f} | {len(times)} |"
    )


def raw_calls(ordinal: int, repeat: int) -> list[str]:
    from cuda.bindings import driver as d

    _ok(d.cuInit(0))
    dev = _ok(d.cuDeviceGet(ordinal))
    ctx = _ok(d.cuDevicePrimaryCtxRetain(dev))
    _ok(d.cuCtxSetCurrent(ctx))
    _, total = _ok(d.cuMemGetInfo())
    prop = d.CUmemAllocationProp()
    prop.type = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = ordinal
    gmin = d.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM
    grec = d.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED
    g = int(_ok(d.cuMemGetAllocationGranularity(prop, gmin)))
    grec_v = int(_ok(d.cuMemGetAllocationGranularity(prop, grec)))
    desc = d.CUmemAccessDesc()
    desc.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    desc.location.id = ordinal
    desc.flags = d.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    rows: dict[str, list[float]] = {}

    def add(name: str, us: float) -> None:
        rows.setdefault(name, []).append(us)

    span = 2 * int(total)
    span = -(-span // g) * g
    first_reserve = None
    for _ in range(repeat):
        us, base = _timed(d.cuMemAddressReserve, span, g, 0, 0)
        base = int(_ok(base))
        if first_reserve is None:
            first_reserve = us
        add(f"cuMemAddressReserve {span >> 30} GiB", us)
        # one chunk
        for size, label in ((g, "1 chunk"), (10 * g, "10 chunks (one handle)")):
            us, h = _timed(d.cuMemCreate, size, prop, 0)
            h = _ok(h)
            add(f"cuMemCreate {label}", us)
            us, r = _timed(d.cuMemMap, base, size, 0, h, 0)
            _ok((r[0], None))
            add(f"cuMemMap {label}", us)
            us, r = _timed(d.cuMemSetAccess, base, size, [desc], 1)
            _ok((r[0], None))
            add(f"cuMemSetAccess {label}", us)
            us, r = _timed(d.cuMemUnmap, base, size)
            add(f"cuMemUnmap {label}", us)
            us, r = _timed(d.cuMemRelease, h)
            add(f"cuMemRelease {label}", us)
        # ten chunks, a handle each (what VirtualRange does), one SetAccess for the run
        hs = []
        t0 = time.perf_counter_ns()
        for i in range(10):
            h = _ok(d.cuMemCreate(g, prop, 0))
            _ok((d.cuMemMap(base + i * g, g, 0, h, 0)[0], None))
            hs.append(h)
        add("10 x (cuMemCreate + cuMemMap) 1 chunk", (time.perf_counter_ns() - t0) / 1e3)
        us, r = _timed(d.cuMemSetAccess, base, 10 * g, [desc], 1)
        add("cuMemSetAccess run of 10 chunks", us)
        t0 = time.perf_counter_ns()
        for i, h in enumerate(hs):
            d.cuMemUnmap(base + i * g, g)
            d.cuMemRelease(h)
        add("10 x (cuMemUnmap + cuMemRelease) 1 chunk", (time.perf_counter_ns() - t0) / 1e3)
        us, _ = _timed(d.cuMemAddressFree, base, span)
        add(f"cuMemAddressFree {span >> 30} GiB", us)
        us, _ = _timed(d.cuMemGetInfo)
        add("cuMemGetInfo", us)
        for size, label in ((g, "2 MiB"), (10 * g, "20 MiB")):
            us, p = _timed(d.cuMemAlloc, size)
            p = _ok(p)
            add(f"cuMemAlloc {label}", us)
            us, _ = _timed(d.cuMemFree, p)
            add(f"cuMemFree {label}", us)
    lines = [
        f"granularity: minimum {g >> 20} MiB, recommended {grec_v >> 20} MiB; "
        f"device memory {int(total) >> 30} GiB; first cuMemAddressReserve "
        f"{first_reserve:.1f} µs",
        "",
        "| call | best µs | median µs | worst µs | n |",
        "|---|---|---|---|---|",
    ]
    lines += [_row(k, v) for k, v in rows.items()]
    return lines


def busy_device(ordinal: int, repeat: int = 5) -> list[str]:
    """Does a VMM call wait for device work? Each call timed while a ~50 ms kernel
    (``torch.cuda._sleep``) runs on another stream, on memory the kernel does not use."""
    try:
        import torch
    except ImportError:
        return ["(torch missing: the busy-device measurement did not run)"]
    from cuda.bindings import driver as d

    torch.cuda.set_device(ordinal)
    torch.cuda._sleep(1000)  # loads the kernel
    torch.cuda.synchronize()
    cycles = int(50e-3 * torch.cuda.get_device_properties(ordinal).clock_rate * 1e3)
    prop = d.CUmemAllocationProp()
    prop.type = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = ordinal
    g = int(
        _ok(
            d.cuMemGetAllocationGranularity(
                prop, d.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM
            )
        )
    )
    desc = d.CUmemAccessDesc()
    desc.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    desc.location.id = ordinal
    desc.flags = d.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    rows: dict[str, list[float]] = {}
    for _ in range(repeat):
        base = int(_ok(d.cuMemAddressReserve(4 * g, g, 0, 0)))
        t0 = time.perf_counter_ns()
        torch.cuda._sleep(cycles)
        launched = (time.perf_counter_ns() - t0) / 1e3
        rows.setdefault("the kernel's launch (returns at once)", []).append(launched)
        us, h = _timed(d.cuMemCreate, g, prop, 0)
        rows.setdefault("cuMemCreate, device busy", []).append(us)
        h = _ok(h)
        us, _ = _timed(d.cuMemMap, base, g, 0, h, 0)
        rows.setdefault("cuMemMap, device busy", []).append(us)
        us, _ = _timed(d.cuMemSetAccess, base, g, [desc], 1)
        rows.setdefault("cuMemSetAccess, device busy", []).append(us)
        us, _ = _timed(d.cuMemUnmap, base, g)
        rows.setdefault("cuMemUnmap, device busy", []).append(us)
        us, _ = _timed(d.cuMemRelease, h)
        rows.setdefault("cuMemRelease, device busy", []).append(us)
        t0 = time.perf_counter_ns()
        torch.cuda.synchronize()
        rows.setdefault("then the kernel's rest (synchronize)", []).append(
            (time.perf_counter_ns() - t0) / 1e3
        )
        d.cuMemAddressFree(base, 4 * g)
    lines = [
        "",
        "## The same calls while a 50 ms kernel runs on another stream",
        "",
        "| call | best µs | median µs | worst µs | n |",
        "|---|---|---|---|---|",
    ]
    return lines + [_row(k, v) for k, v in rows.items()]


async def client_steps(device: str) -> tuple[list[str], str]:
    import numpy as np

    import asynccube as ac

    steps: list[tuple[str, float]] = []
    prof = cProfile.Profile()

    def step(name: str, t0: float) -> None:
        steps.append((name, (time.perf_counter() - t0) * 1e3))

    t0 = time.perf_counter()
    async with ac.open_client(device, config={"memory": {"pool": "expandable"}}) as client:
        step("open_client", t0)
        prof.enable()
        data = [np.arange(n, dtype=np.float32) for n in (1, 1000, 3 << 20, 9 << 20)]
        handles = []
        for a in data:
            t0 = time.perf_counter()
            handles.append(client.create(a))
            step(f"create {a.nbytes} bytes (the call)", t0)
        t0 = time.perf_counter()
        await client.sync()
        step("sync after the creates", t0)
        t0 = time.perf_counter()
        got = await client.read([h.binding() for h in handles])
        step("read all four", t0)
        assert [
            np.frombuffer(x, np.float32).tolist() == a.tolist()
            for x, a in zip(got, data, strict=True)
        ] == [True] * 4
        t0 = time.perf_counter()
        more = [client.create(np.arange(n, dtype=np.float32)) for n in (5 << 20, 7 << 20)]
        await client.sync()
        step("create 20 + 28 MiB more, sync", t0)
        t0 = time.perf_counter()
        del handles, got, more
        await client.sync()
        client.memory_cleanup()
        usage = await client.memory_usage()
        step("free all, cleanup, usage", t0)
        prof.disable()
        assert usage.bytes_in_use == 0
    lines = ["| step | ms |", "|---|---|"] + [f"| {n} | {ms:.2f} |" for n, ms in steps]
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(25)
    return lines, buf.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    ordinal = int(args.device.split(":")[1])
    from cuda.bindings import driver as d

    _ok(d.cuInit(0))
    name = _ok(d.cuDeviceGetName(64, _ok(d.cuDeviceGet(ordinal)))).split(b"\0")[0].decode()
    out = [f"# VMM calls and an expandable client's first steps on {name}", ""]
    out += raw_calls(ordinal, args.repeat)
    out += busy_device(ordinal)
    steps, profile = asyncio.run(client_steps(args.device))
    out += ["", "## An expandable client's first steps (wall time on the loop)", ""]
    out += steps
    out += ["", "cProfile of those steps (top 25, cumulative):", "", "```", profile, "```"]
    text = "\n".join(out)
    print(text)
    dest = HERE / "profiles" / "vmm"
    dest.mkdir(parents=True, exist_ok=True)
    slug = name.replace("NVIDIA ", "").split()[0].lower()
    (dest / f"{slug}.md").write_text(text + "\n")
    sys.exit(0)


if __name__ == "__main__":
    main()
