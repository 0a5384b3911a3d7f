"""NVRTC compilation to cubins, and the kernel cache (no GPU needed)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from asynccube._core.cuda import compiler
from asynccube._core.cuda.compiler import KernelCompiler, arch_for, compile_cubin
from asynccube._core.errors import CompilationError
from asynccube._core.values.kernel import CudaSource

try:
    compiler.nvrtc_version()
except CompilationError as exc:  # pragma: no cover - depends on the machine
    pytest.skip(f"NVRTC is not available: {exc}", allow_module_level=True)

ELF = b"\x7fELF"

ADD = CudaSource(
    r"""
    #include <asynccube.h>
    extern "C" __global__ void add(const float* a, const float* b, float* out,
                                   unsigned int n, ac_metadata<2> meta) {
        unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) out[i] = a[i] + b[i] + meta.v[0];
    }
    """,
    entry="add",
)


@pytest.fixture
def comp(tmp_path: Path) -> KernelCompiler:
    return KernelCompiler(cache_dir=tmp_path / "kernels")


@pytest.mark.parametrize("arch", ["sm_90a", "sm_80"])
def test_compiles_a_cubin_for_the_exact_arch(comp: KernelCompiler, arch: str) -> None:
    out = comp.compile(ADD, arch)
    assert out.cubin.startswith(ELF)
    assert out.symbol == "add"
    assert out.arch == arch


def test_memory_cache_hits_without_compiling(comp: KernelCompiler) -> None:
    first = comp.compile(ADD, "sm_90a")
    second = comp.compile(ADD, "sm_90a")
    assert second is first
    assert (comp.stats.compiles, comp.stats.memory_hits) == (1, 1)


def test_disk_cache_hits_on_a_fresh_compiler(tmp_path: Path) -> None:
    cold = KernelCompiler(cache_dir=tmp_path)
    cubin = cold.compile(ADD, "sm_90a").cubin
    warm = KernelCompiler(cache_dir=tmp_path)
    assert warm.compile(ADD, "sm_90a").cubin == cubin
    assert (warm.stats.compiles, warm.stats.disk_hits) == (0, 1)
    assert [p.suffix for p in tmp_path.iterdir()] == [".cubin"]


def test_key_changes_with_arch_options_and_source(comp: KernelCompiler) -> None:
    comp.compile(ADD, "sm_90a")
    comp.compile(ADD, "sm_80")
    comp.compile(CudaSource(ADD.source, "add", options=("-lineinfo",)), "sm_90a")
    comp.compile(CudaSource(ADD.source + "\n// changed", "add"), "sm_90a")
    assert comp.stats.compiles == 4
    assert comp.cache_dir is not None
    assert len(list(comp.cache_dir.iterdir())) == 4


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty", "garbage"])
def test_corrupt_entry_is_recompiled(tmp_path: Path, damage: str) -> None:
    good = KernelCompiler(cache_dir=tmp_path).compile(ADD, "sm_90a").cubin
    (entry,) = tmp_path.iterdir()
    raw = bytearray(entry.read_bytes())
    if damage == "flip":
        raw[-100] ^= 0xFF
    elif damage == "truncate":
        del raw[len(raw) // 2 :]
    elif damage == "empty":
        raw.clear()
    else:
        raw[:] = os.urandom(64)
    entry.write_bytes(bytes(raw))
    again = KernelCompiler(cache_dir=tmp_path)
    assert again.compile(ADD, "sm_90a").cubin == good
    assert (again.stats.compiles, again.stats.disk_rejected) == (1, 1)
    healed = KernelCompiler(cache_dir=tmp_path)
    healed.compile(ADD, "sm_90a")
    assert (healed.stats.compiles, healed.stats.disk_hits) == (0, 1)


def test_unwritable_cache_dir_is_not_fatal(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    comp = KernelCompiler(cache_dir=blocker / "kernels")
    assert comp.compile(ADD, "sm_90a").cubin.startswith(ELF)
    assert comp.stats.disk_write_errors == 1


def test_no_disk_cache(tmp_path: Path) -> None:
    comp = KernelCompiler(cache_dir=None)
    assert comp.compile(ADD, "sm_80").cubin.startswith(ELF)


def test_syntax_error_raises_with_nvrtc_log(comp: KernelCompiler) -> None:
    bad = CudaSource('extern "C" __global__ void k(float* a) { a[0] = ; }', entry="k")
    with pytest.raises(CompilationError) as info:
        comp.compile(bad, "sm_90a")
    assert "expected an expression" in info.value.log
    assert "'k'" in str(info.value)
    assert comp.cache_dir is not None
    assert not comp.cache_dir.exists()


def test_missing_entry_raises(comp: KernelCompiler) -> None:
    with pytest.raises(CompilationError, match="nope"):
        comp.compile(CudaSource(ADD.source, entry="nope"), "sm_90a")


def test_template_entry_gets_its_lowered_name(comp: KernelCompiler) -> None:
    src = CudaSource(
        "template <class T> __global__ void fill(T* p, T v) { p[threadIdx.x] = v; }",
        entry="fill<float>",
    )
    out = comp.compile(src, "sm_90a")
    assert out.symbol.startswith("_Z")
    assert "fill" in out.symbol


def test_default_cache_dir_honors_xdg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert compiler.default_cache_dir() == tmp_path / "asynccube" / "kernels"
    assert compile_cubin(ADD, "sm_80", tmp_path / "c").startswith(ELF)
    assert len(list((tmp_path / "c").iterdir())) == 1


@pytest.mark.parametrize(
    ("cc", "arch"), [((9, 0), "sm_90a"), ((10, 0), "sm_100a"), ((8, 0), "sm_80"), ((8, 9), "sm_89")]
)
def test_arch_for(cc: tuple[int, int], arch: str) -> None:
    assert arch_for(cc) == arch
