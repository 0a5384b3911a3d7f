"""The driver's floor beside every launch figure: ``floor.c`` built with gcc at bench time.

:func:`c_floor` builds and runs the C program (a timed loop of ``cuLaunchKernel`` on the
cubin asynccube compiled, launch + sync, 1 KiB read + sync, cuMemAllocAsync + free);
:func:`extension_call_floor` builds the same file as a CPython extension and times one
pre-packed launch per Python call. Both need only gcc and ``libcuda.so.1`` (no CUDA
headers); each returns ``{"error": why}`` where it cannot run.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).with_name("floor.c")


def _gcc(args: list[str]) -> str | None:
    """Run gcc; the error text, or None on success."""
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        return "no C compiler (gcc/cc) on PATH"
    done = subprocess.run([gcc, *args], capture_output=True, text=True, check=False)
    return None if done.returncode == 0 else f"gcc failed: {done.stderr.strip()[:300]}"


def c_floor(cubin: bytes) -> dict[str, Any]:
    """The C program's figures (µs), or ``{"error": ...}``."""
    tmp = Path(tempfile.mkdtemp(prefix="ac-floor-"))
    exe, blob = tmp / "floor", tmp / "kernels.cubin"
    blob.write_bytes(cubin)
    err = _gcc(["-O2", "-DFLOOR_MAIN", str(SOURCE), "-ldl", "-o", str(exe)])
    if err:
        return {"error": err}
    done = subprocess.run(
        [str(exe), str(blob)], capture_output=True, text=True, timeout=120, check=False
    )
    try:
        out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": f"floor exited {done.returncode}: {done.stderr.strip()[:300]}"}
    return out


def extension_call_floor(cubin: bytes, reps: int = 20000) -> dict[str, Any]:
    """µs per Python call of a C-extension function that does one pre-packed
    ``cuLaunchKernel`` of the same 4-arg kernel (best of 3 rounds, amortized)."""
    include = sysconfig.get_paths()["include"]
    if not Path(include, "Python.h").exists():
        return {"error": f"no Python.h under {include} (python3-dev missing)"}
    tmp = Path(tempfile.mkdtemp(prefix="ac-floor-ext-"))
    lib = tmp / f"_floor{sysconfig.get_config_var('EXT_SUFFIX')}"
    flags = ["-O2", "-shared", "-fPIC", "-DFLOOR_EXT", f"-I{include}"]
    err = _gcc([*flags, str(SOURCE), "-ldl", "-o", str(lib)])
    if err:
        return {"error": err}
    spec = importlib.util.spec_from_file_location("_floor", lib)
    if spec is None or spec.loader is None:
        return {"error": f"cannot import {lib}"}
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.setup(cubin)
    launch, sync = mod.launch, mod.sync
    launch()
    sync()
    best = []
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(reps):
            launch()
        sync()
        best.append((time.perf_counter() - t0) / reps * 1e6)
    return {"ext_call_launch_add4_us": min(best)}
