"""Command line: python -m asynccube demo | info | config."""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
from collections.abc import Callable, Sequence
from importlib import metadata
from typing import Any, NoReturn

from . import __version__

_DESCRIPTION = """\
asynccube: an async GPU compute runtime for Python.

commands:
  demo     run concurrent tasks of chained SAXPYs and check every result against numpy
  info     the versions and devices found, and why a GPU is not used
  config   the effective configuration and where each value came from
"""
_PACKAGES = ("cuda-bindings", "cuda-core", "nvidia-cuda-nvrtc", "numpy", "anyio")


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (no usage block)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def _device(text: str) -> str:
    from ._core.errors import InvalidArgument
    from ._core.runtime.devices import parse_device

    try:
        parse_device(text)
    except InvalidArgument as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _check_demo(args: argparse.Namespace) -> None:
    """The demo's bounds (each count, and their memory together), as a parser error."""
    from ._core.cli.demo import check_demo_args
    from ._core.errors import InvalidArgument

    try:
        check_demo_args(args.tasks, args.elements, args.rounds, prefix="--")
    except InvalidArgument as exc:
        args.parser.error(str(exc))


def _demo(args: argparse.Namespace) -> int:
    from ._core.cli.demo import format_report, run_demo

    report = asyncio.run(run_demo(args.device, args.tasks, args.elements, args.rounds))
    print(format_report(report))
    return 0 if report.ok else 1


def _info(args: argparse.Namespace) -> int:
    from ._core.runtime.devices import probe_gpus

    probe = probe_gpus()
    if args.json:
        print(json.dumps(_info_dict(probe), indent=2))
        return 0
    print(f"asynccube {__version__} on Python {platform.python_version()}")
    for pkg in _PACKAGES:
        print(f"  {pkg:<18} {_version(pkg)}")
    print(f"  {'nvrtc':<18} {_nvrtc_version()}")
    print(f"hot path: {_hot_path()}")
    print("devices:")
    print("  host               numpy host server (always available)")
    for dev in probe.devices:
        print(f"  {dev}")
    if len(probe.devices) > 1:
        from ._core.cuda.peer import describe_links

        links = describe_links(len(probe.devices))
        print("peer links:", *(f"  {line}" for line in links), sep="\n")
    if not probe.usable:
        print(f"GPU not used: {probe.reason}")
    print(f"default device: {'cuda:0' if probe.usable else 'host'}")
    return 0


def _info_dict(probe: Any) -> dict[str, Any]:
    """What ``info --json`` prints."""
    return {
        "asynccube": __version__,
        "python": platform.python_version(),
        "packages": {pkg: _version(pkg) for pkg in _PACKAGES},
        "nvrtc": _nvrtc_version(),
        "devices": ["host", *probe.devices],
        "gpu_usable": probe.usable,
        "gpu_reason": probe.reason,
        "default_device": "cuda:0" if probe.usable else "host",
        "hot_path": _hot_path(),
    }


def _version(pkg: str) -> str:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return "not installed"


def _nvrtc_version() -> str:
    try:
        from cuda.bindings import nvrtc

        _, major, minor = nvrtc.nvrtcVersion()
    except Exception as exc:
        return f"unavailable ({exc})"
    return f"{major}.{minor}"


def _hot_path() -> str:
    from ._core.channel import awaitable
    from ._core.client import dlpack
    from ._core.cuda.native import hotpath
    from ._core.values import slices

    kind = "compiled (C extension)" if hotpath.ACTIVE == "native" else "pure Python"
    token = "compiled" if slices.TOKEN == "native" else "pure Python"
    reader = "pure Python" if dlpack._NATIVE is None else "compiled"
    futures = "pure Python" if awaitable._NATIVE is None else "compiled"
    return (
        f"{kind}: {hotpath.REASON}; slice token: {token}; DLPack capsule reader: {reader}; "
        f"future maker: {futures}"
    )


def _config(args: argparse.Namespace) -> int:
    from ._core.config.config import format_config, load_effective_config
    from ._core.errors import ConfigError

    try:
        print(format_config(load_effective_config()))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m asynccube",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"asynccube {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{demo,info,config}")
    demo = sub.add_parser("demo", help="run concurrent tasks and check them against numpy")
    demo.add_argument("--device", type=_device, default=None, help="host, cuda or cuda:N")
    demo.add_argument("--tasks", type=_at_least_one, default=8, help="concurrent tasks")
    demo.add_argument(
        "--elements", type=_at_least_one, default=1 << 16, help="float32 elements per task"
    )
    demo.add_argument("--rounds", type=_at_least_one, default=4, help="launches per task")
    demo.set_defaults(run=_demo, parser=demo)
    info = sub.add_parser("info", help="the devices found, and why a GPU is not used")
    info.add_argument("--json", action="store_true", help="print it as JSON")
    info.set_defaults(run=_info)
    sub.add_parser("config", help="the effective configuration and its sources").set_defaults(
        run=_config
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m asynccube``: 0 on success, 1 when the demo finds a
    mismatch or a command fails (one line on stderr), 2 for bad arguments."""
    from ._core.errors import AsyncCubeError

    args = _parser().parse_args(argv)
    if args.command == "demo":
        _check_demo(args)
    run: Callable[[argparse.Namespace], int] = args.run
    try:
        return run(args)
    except AsyncCubeError as exc:
        print(f"python -m asynccube {args.command}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
