"""Build the optional compiled hot path (``asynccube._core.cuda.native._native``), slice token
(``asynccube._core.values._native_slices``) and DLPack capsule reader
(``asynccube._core.client._native_dlpack``).

Everything else is declared in ``pyproject.toml``. The extensions need only a C compiler
and Python's headers (no CUDA toolkit: the driver is opened at run time). If one cannot be
built, installation goes on without it, with a warning, and asynccube uses its
pure-Python twin (``python -m asynccube info`` says which are active).
"""

from __future__ import annotations

import os
import sys
import warnings

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

NATIVE = Extension(
    "asynccube._core.cuda.native._native",
    sources=[
        f"src/asynccube/_core/cuda/native/_native{part}.c"
        for part in (
            "_module",
            "",
            "_launch",
            "_copies",
            "_notify",
            "_fast",
            "_plan",
            "_read",
            "_alloc",
            "_write",
        )
    ],
    depends=["src/asynccube/_core/cuda/native/_native.h"],
    extra_compile_args=["-O2", "-std=c11", "-Wall", "-fvisibility=hidden"],
    libraries=["dl", "pthread"],
    optional=True,
)
TOKEN = Extension(
    "asynccube._core.values._native_slices",
    sources=["src/asynccube/_core/values/_native_slices.c"],
    extra_compile_args=["-O2", "-std=c11", "-Wall", "-fvisibility=hidden"],
    optional=True,
)

DLPACK = Extension(
    "asynccube._core.client._native_dlpack",
    sources=["src/asynccube/_core/client/_native_dlpack.c"],
    extra_compile_args=["-O2", "-std=c11", "-Wall", "-fvisibility=hidden"],
    optional=True,
)

FUTURE = Extension(
    "asynccube._core.channel._native_future",
    sources=["src/asynccube/_core/channel/_native_future.c"],
    extra_compile_args=["-O2", "-std=c11", "-Wall", "-fvisibility=hidden"],
    optional=True,
)


class OptionalBuildExt(build_ext):
    """``build_ext`` that warns instead of failing when the extension cannot be built."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # no compiler at all, for example
            self._skip(exc)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            self._skip(exc)

    @staticmethod
    def _skip(exc: BaseException) -> None:
        msg = (
            f"asynccube: the compiled hot path was not built ({exc}); the pure-Python "
            "twin will be used"
        )
        warnings.warn(msg, stacklevel=1)
        print(msg, file=sys.stderr)


skip = os.environ.get("ASYNCCUBE_NO_EXTENSIONS", "") not in ("", "0")
setup(
    ext_modules=[] if skip or not sys.platform.startswith("linux") else [NATIVE, TOKEN, DLPACK, FUTURE],
    cmdclass={"build_ext": OptionalBuildExt},
)
