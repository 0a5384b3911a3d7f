"""Command line: ``python -m asynccube demo | info | config``."""

from __future__ import annotations

import argparse
import asyncio
import platform
import sys
from collections.abc import Sequence
from importlib import metadata


def _demo(args: argparse.Namespace) -> int:
    from ._core.demo import format_report, run_demo

    report = asyncio.run(run_demo(args.device, args.tasks, args.elements, args.rounds))
    print(format_report(report))
    return 0


def _info(args: argparse.Namespace) -> int:
    from ._core.devices import probe_gpus

    print(f"asynccube {_version('asynccube')} on Python {platform.python_version()}")
    for pkg in ("cuda-bindings", "cuda-core", "nvidia-cuda-nvrtc", "numpy", "anyio"):
        print(f"  {pkg:<18} {_version(pkg)}")
    print(f"  {'nvrtc':<18} {_nvrtc_version()}")
    probe = probe_gpus()
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


def _config(args: argparse.Namespace) -> int:
    from ._core.config import format_config, load_effective_config
    from ._core.errors import ConfigError

    try:
        print(format_config(load_effective_config()))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m asynccube", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run concurrent tasks and check them against numpy")
    demo.add_argument("--device", default=None, help="host, cuda or cuda:N (default: auto)")
    demo.add_argument("--tasks", type=int, default=8)
    demo.add_argument("--elements", type=int, default=1 << 16)
    demo.add_argument("--rounds", type=int, default=4)
    demo.set_defaults(run=_demo)
    sub.add_parser("info", help="the devices found, and why a GPU is not used").set_defaults(
        run=_info
    )
    sub.add_parser("config", help="the effective configuration and its sources").set_defaults(
        run=_config
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m asynccube``."""
    args = _parser().parse_args(argv)
    code: int = args.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
