"""``python -m asynccube``: a demo whose check can fail, one-line errors for bad
arguments, ``--version``, ``info --json``, plain help text (issue 10, finding 6)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import asynccube as ac
from asynccube.__main__ import main
from asynccube._core.cli import demo
from asynccube._core.runtime.devices import probe_gpus

SMALL = ["--device", "host", "--tasks", "2", "--elements", "1000", "--rounds", "2"]


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_the_demo_counts_real_comparisons(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "demo", *SMALL)
    assert code == 0
    assert "checked:  3/3 results match numpy (2 tasks and 1 warm-up" in out
    assert "device:   host (numpy host server): as asked" in out
    assert "ms wall clock for the 2 tasks (create, launches, read back" in out


def test_the_demo_fails_on_a_mismatch(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def wrong(launch: ac.HostLaunch) -> None:
        x, y, out = (b.view(np.float32) for b in launch.buffers)
        out[:] = x + y + 1  # not a SAXPY

    monkeypatch.setattr(demo, "SAXPY", ac.Kernel("test_wrong_saxpy", host=wrong))
    code, out, _ = _run(capsys, "demo", *SMALL)
    assert code == 1
    assert "checked:  0/3 results match numpy" in out and "MISMATCH" in out


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["--tasks", "-1"], "argument --tasks: must be an integer >= 1, got '-1'"),
        (["--rounds", "0"], "argument --rounds: must be an integer >= 1, got '0'"),
        (["--elements", "-5"], "argument --elements: must be an integer >= 1"),
        (["--elements", "many"], "argument --elements: must be an integer >= 1"),
        (["--device", "foo"], "argument --device: unknown device 'foo'"),
        (["--device", "host:1"], "argument --device: unknown device 'host:1'"),
        (["--elements", "10000000000"], "--elements must be at most 268,435,456"),
        (["--tasks", "100000000"], "--tasks must be at most 100,000, got 100,000,000"),
        (["--tasks", "100000", "--elements", "268435456"], "of memory at once"),
    ],
)
def test_bad_demo_arguments_get_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], match: str
) -> None:
    code, out, err = _run(capsys, "demo", *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and match in err and "Traceback" not in err


def test_run_demo_refuses_bad_counts() -> None:
    with pytest.raises(ac.InvalidArgument, match="tasks must be an integer >= 1"):
        demo.check_demo_args(-1, 10, 1)


@pytest.mark.skipif(probe_gpus().usable, reason="a GPU is usable here")
def test_demo_on_cuda_without_a_driver_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "demo", "--device", "cuda")
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and "error: cannot open cuda:0" in err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "--version")
    assert code == 0 and out.strip() == f"asynccube {ac.__version__}"


def test_info_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "info", "--json")
    info = json.loads(out)
    assert code == 0 and info["asynccube"] == ac.__version__
    assert info["devices"][0] == "host"
    assert info["default_device"] == ("cuda:0" if info["gpu_usable"] else "host")
    assert set(info["packages"]) >= {"numpy", "cuda-bindings"}


def test_help_is_plain_text(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "--help")
    assert code == 0 and "``" not in out and ":class:" not in out
    assert "demo" in out and "info" in out and "config" in out
