"""The driver's floor beside every launch figure: ``floor.c`` built with gcc at bench time.

:func:`c_floor` builds and runs the C program (a timed loop of ``cuLaunchKernel`` on the
cubin asynccube compiled, launch + sync, 1 KiB read + sync, cuMemAllocAsync + free);
:class:`FloorProgram` builds it once, to run it beside each round of another figure;
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


class FloorProgram:
    """``floor.c`` built once on ``cubin``; :meth:`run` runs it (about 0.6 s), as often as
    a benchmark wants a floor measured beside its own rounds."""

    def __init__(self, cubin: bytes) -> None:
        tmp = Path(tempfile.mkdtemp(prefix="ac-floor-"))
        self.exe, self.blob = tmp / "floor", tmp / "kernels.cubin"
        self.blob.write_bytes(cubin)
        self.error = _gcc(["-O2", "-DFLOOR_MAIN", str(SOURCE), "-ldl", "-o", str(self.exe)])

    def run(self) -> dict[str, Any]:
        """The C program's figures (µs), or ``{"error": ...}``."""
        if self.error:
            return {"error": self.error}
        done = subprocess.run(
            [str(self.exe), str(self.blob)], capture_output=True, text=True, timeout=120,
            check=False,
        )  # fmt: skip
        try:
            out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return {"error": f"floor exited {done.returncode}: {done.stderr.strip()[:300]}"}
        return out


def c_floor(cubin: bytes) -> dict[str, Any]:
    """The C program's figures (µs), or ``{"error": ...}``."""
    return FloorProgram(cubin).run()


class ExtensionFloor:
    """``floor.c`` built once as a CPython extension on ``cubin``, in this process: the
    C loop run here (:meth:`loop`) and one pre-packed launch per Python call
    (:meth:`call`), µs per launch, as often as a benchmark wants them beside its rounds."""

    def __init__(self, cubin: bytes) -> None:
        self.mod: Any = None
        include = sysconfig.get_paths()["include"]
        if not Path(include, "Python.h").exists():
            self.error: str | None = f"no Python.h under {include} (python3-dev missing)"
            return
        tmp = Path(tempfile.mkdtemp(prefix="ac-floor-ext-"))
        lib = tmp / f"_floor{sysconfig.get_config_var('EXT_SUFFIX')}"
        flags = ["-O2", "-shared", "-fPIC", "-DFLOOR_EXT", f"-I{include}"]
        self.error = _gcc([*flags, str(SOURCE), "-ldl", "-o", str(lib)])
        if self.error:
            return
        spec = importlib.util.spec_from_file_location("_floor", lib)
        if spec is None or spec.loader is None:
            self.error = f"cannot import {lib}"
            return
        self.mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(self.mod)
        self.mod.setup(cubin)
        self.mod.launch()
        self.mod.sync()

    def loop(self) -> float | None:
        """The C loop's µs per launch, run inside this process (best of 3 x 20000)."""
        return None if self.mod is None else float(self.mod.loop())

    def call(self, reps: int = 20000) -> float | None:
        """µs per Python call of the extension's one launch (best of 3 rounds)."""
        if self.mod is None:
            return None
        launch, sync = self.mod.launch, self.mod.sync
        best = []
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(reps):
                launch()
            sync()
            best.append((time.perf_counter() - t0) / reps * 1e6)
        return min(best)


def extension_call_floor(cubin: bytes, reps: int = 20000) -> dict[str, Any]:
    """µs per Python call of a C-extension function that does one pre-packed
    ``cuLaunchKernel`` of the same 4-arg kernel (best of 3 rounds, amortized), and the C
    loop run in the same process."""
    ext = ExtensionFloor(cubin)
    if ext.error:
        return {"error": ext.error}
    return {"ext_call_launch_add4_us": ext.call(reps), "c_loop_in_process_us": ext.loop()}
