"""Autotune: pick and remember the fastest implementation per key and device (cubecl's
``tune`` module).

May import: everything up to ``client``.
"""

from __future__ import annotations

from .cache import AutotuneOutcome, TuneCache, TuneResult, device_fingerprint
from .checks import CheckMismatch, CheckReport, TuneChecks
from .key import AutotuneKey, anchor
from .policy import AdaptiveSampling, TuneBound, TuneReason
from .tunable import Tunable, TunableSet
from .tuner import TuneMode, Tuner

__all__ = [
    "AdaptiveSampling",
    "AutotuneKey",
    "AutotuneOutcome",
    "CheckMismatch",
    "CheckReport",
    "TuneCache",
    "TuneChecks",
    "TuneBound",
    "TuneMode",
    "TuneReason",
    "TuneResult",
    "Tunable",
    "TunableSet",
    "Tuner",
    "anchor",
    "device_fingerprint",
]
