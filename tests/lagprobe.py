"""The loop-lag probe, as the project's tests import it: the one the pytest plugin uses
(:mod:`asynccube._core.testing.lagprobe`), with its limit read once."""

from __future__ import annotations

from asynccube._core.testing.lagprobe import LoopLagProbe, max_lag_seconds

__all__ = ["MAX_LAG_SECONDS", "LoopLagProbe", "_max_lag_seconds"]

_max_lag_seconds = max_lag_seconds
MAX_LAG_SECONDS = max_lag_seconds()
