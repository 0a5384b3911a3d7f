"""The loop-lag limit is settable (``ASYNCCUBE_MAX_LAG_MS``), e.g. for a GPU suite run
under compute-sanitizer, which slows every CUDA call down."""

from __future__ import annotations

import pytest

from .lagprobe import _max_lag_seconds


def test_default_limit_is_5_ms(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ASYNCCUBE_MAX_LAG_MS", raising=False)
    assert _max_lag_seconds() == 0.005


def test_limit_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASYNCCUBE_MAX_LAG_MS", "250")
    assert _max_lag_seconds() == 0.25


@pytest.mark.parametrize("bad", ["fast", "0", "-3", "nan"])
def test_a_bad_limit_says_what_is_wrong(monkeypatch: pytest.MonkeyPatch, bad: str) -> None:
    monkeypatch.setenv("ASYNCCUBE_MAX_LAG_MS", bad)
    with pytest.raises(ValueError, match="ASYNCCUBE_MAX_LAG_MS must be a number"):
        _max_lag_seconds()
