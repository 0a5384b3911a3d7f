"""The plugin's settings: the loop-lag limit and the markers that ask for a GPU.

A bad value is a :class:`pytest.UsageError` with one line saying what to set, raised
only in a run that uses asynccube: a project that sets one of asynccube's options, or
whose collected tests use its fixtures or markers. Elsewhere (the same environment,
another project) a bad ``ASYNCCUBE_MAX_LAG_MS`` leaves the probe off and says so in the
report header.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import pytest

__all__ = ["GPU_MARKER", "LAG_FAILURE", "Settings", "loop_scope_of", "read_settings"]

LAG_FAILURE = "the event loop was blocked"
"""How a failure of the loop-lag probe starts (e.g. for pytest-rerunfailures' --only-rerun)."""

GPU_MARKER = "asynccube_cuda"
"""asynccube's own marker: the test needs a GPU asynccube can use."""

_ENV = "ASYNCCUBE_MAX_LAG_MS"


@dataclass
class Settings:
    """What the plugin was asked to do in this run.

    Attributes:
        limit: Seconds one loop callback may take in a probed test; None: no probe.
        limit_error: Why ``ASYNCCUBE_MAX_LAG_MS`` was ignored ("" when it was not);
            a :class:`pytest.UsageError` once the run turns out to use asynccube.
        gpu_markers: The markers that mean "needs asynccube's GPU": asynccube's own and
            those the ini value ``asynccube_gpu_markers`` names.
        configured: The project set one of asynccube's options (it uses asynccube).
    """

    limit: float | None = None
    limit_error: str = ""
    gpu_markers: tuple[str, ...] = (GPU_MARKER,)
    configured: bool = False


def _milliseconds(raw: str) -> float | None:
    """Seconds from a positive, finite number of milliseconds; None if it is not one."""
    try:
        ms = float(raw)
    except ValueError:
        return None
    return ms / 1e3 if ms > 0 and math.isfinite(ms) else None


def read_settings(config: pytest.Config) -> Settings:
    """The settings of this run (see the module docstring)."""
    settings = Settings()
    option = config.getoption("asynccube_max_lag_ms")
    ini = str(config.getini("asynccube_max_lag_ms")).strip()
    names = [str(n).strip() for n in config.getini("asynccube_gpu_markers") if str(n).strip()]
    devices = config.getoption("asynccube_devices")
    settings.configured = bool(option is not None or ini or names or devices)
    for name in names:
        if not name.isidentifier():
            raise pytest.UsageError(
                f"asynccube_gpu_markers: {name!r} is not a marker name; set it to marker "
                "names such as cuda, one per line"
            )
    settings.gpu_markers = (GPU_MARKER, *dict.fromkeys(n for n in names if n != GPU_MARKER))
    if option is not None:
        settings.limit = _milliseconds(str(option))
        if settings.limit is None:
            raise pytest.UsageError(
                f"--asynccube-max-lag-ms {option}: set it to milliseconds > 0, e.g. 5"
            )
        return settings
    env = os.environ.get(_ENV, "").strip()
    if env:
        settings.limit = _milliseconds(env)
        if settings.limit is None:
            settings.limit_error = (
                f"{_ENV}={env!r} is not a number of milliseconds > 0: set it to one "
                f"(e.g. {_ENV}=5) or unset it"
            )
            if settings.configured:
                raise pytest.UsageError(settings.limit_error)
        return settings
    if ini:
        settings.limit = _milliseconds(ini)
        if settings.limit is None:
            raise pytest.UsageError(
                f"asynccube_max_lag_ms = {ini!r} in the ini file: set it to milliseconds > 0, "
                'e.g. asynccube_max_lag_ms = "5"'
            )
    return settings


def loop_scope_of(config: pytest.Config, marker: pytest.Mark) -> str:
    """The loop scope pytest-asyncio runs a test marked ``marker`` in: the marker's
    ``loop_scope``, else the ini value ``asyncio_default_test_loop_scope``, else
    ``function``."""
    scope = marker.kwargs.get("loop_scope") or marker.kwargs.get("scope")
    if scope:
        return str(scope)
    try:
        default = config.getini("asyncio_default_test_loop_scope")
    except ValueError:  # a pytest-asyncio without that setting
        default = None
    return str(default or "function")
