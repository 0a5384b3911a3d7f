"""The loop-lag probe (:mod:`_asynccube_pytest.lagprobe`: it lives beside the pytest
plugin's light half, importable without asynccube, so that a run of another project
with the probe on imports nothing of asynccube's)."""

from __future__ import annotations

from _asynccube_pytest.lagprobe import LoopLagProbe, TrioLagProbe, max_lag_seconds

__all__ = ["LoopLagProbe", "TrioLagProbe", "max_lag_seconds"]
