"""The routes of commands written in module docstrings are true.

A module docstring may hold lines such as::

    route: client.client.ComputeClient.execute -> [channel.channel.Channel.send]
        -> client.launch.Launcher.launch -> ... -> driver:cuLaunchKernel

(one line, or continued on indented lines). Each hop is a dotted name under
``asynccube._core`` (a function, or a method as ``Class.method``); ``driver:NAME`` is a
CUDA driver API function (``cuda.bindings.driver.NAME``); a hop in brackets is the
carrier that takes the command to the next hop (the channel, or the hot path's function,
compiled or its twin), not a hop itself. This test checks that every name resolves, that
each hop's source names the next hop (through its carrier, where there is one), and
that a route from the client reaches the device in at most five hops, so a reader can
follow ``client.execute`` to ``cuLaunchKernel``.
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

CORE = "asynccube._core"
SRC = Path(__file__).resolve().parents[1] / "src" / "asynccube" / "_core"
MAX_HOPS = 5
_ROUTE = re.compile(r"^\s*route: (.+?)\s*$")


def _module_name(path: Path) -> str:
    rel = path.relative_to(SRC).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join([CORE, *parts])


def documented_routes() -> list[tuple[str, list[str]]]:
    """``(module, hops)`` for every route line in the docstrings of ``_core``."""
    routes = []
    for path in sorted(SRC.rglob("*.py")):
        name = _module_name(path)
        doc = inspect.getdoc(importlib.import_module(name)) or ""
        lines = doc.splitlines()
        for i, line in enumerate(lines):
            match = _ROUTE.match(line)
            if match is None:
                continue
            text = match.group(1)
            for more in lines[i + 1 :]:
                if not more.strip().startswith("->"):
                    break
                text += " " + more.strip()
            routes.append((name, [hop.strip() for hop in text.split("->")]))
    return routes


def resolve(hop: str) -> Callable[..., Any]:
    """The function a hop names."""
    if hop.startswith("driver:"):
        from cuda.bindings import driver

        fn: Callable[..., Any] = getattr(driver, hop.removeprefix("driver:"))
        return fn
    parts = hop.strip("[]").split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj: Any = importlib.import_module(".".join([CORE, *parts[:cut]]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj  # type: ignore[no-any-return]
    raise LookupError(f"no module for {hop!r}")


def _short(hop: str) -> str:
    return hop.strip("[]").rsplit(".", 1)[-1].removeprefix("driver:")


def _names(hop: str, name: str) -> bool:
    """True if the source of ``hop`` names ``name`` (``self._name`` counts)."""
    fn: Any = resolve(hop)
    if isinstance(fn, property):  # a property hop: its getter's source
        fn = fn.fget
    source = inspect.getsource(inspect.unwrap(fn))
    return re.search(rf"(?<![A-Za-z0-9]){re.escape(name)}\b", source) is not None


def _check_route(hops: list[str]) -> None:
    real = [h for h in hops if not h.startswith("[")]
    assert 2 <= len(real) <= MAX_HOPS + 1, f"{len(real) - 1} hops (at most {MAX_HOPS})"
    for hop in hops:
        resolve(hop)
    for i, hop in enumerate(hops[:-1]):
        if hop.startswith("["):
            continue
        carriers = []
        j = i + 1
        while hops[j].startswith("["):
            carriers.append(hops[j])
            j += 1
        for carrier in carriers:
            assert _names(hop, _short(carrier)), f"{hop} does not name the next hop {carrier}"
        nxt = _short(hops[j])
        named = _names(hop, nxt) or any(_names(c, nxt) for c in carriers)
        assert named, f"{hop} does not name the next hop {hops[j]}"


ROUTES = documented_routes()


def test_the_routes_of_client_commands_are_written_down() -> None:
    starts = {hops[0] for _, hops in ROUTES}
    for op in ("execute", "read", "sync", "to_client"):
        assert f"client.client.ComputeClient.{op}" in starts, f"no route for client.{op}"
    for export in ("__dlpack__", "__cuda_array_interface__"):
        assert f"client.tensor.Tensor.{export}" in starts, f"no route for Tensor.{export}"
    assert any(hops[-1] == "driver:cuLaunchKernel" for _, hops in ROUTES)


@pytest.mark.parametrize(("module", "hops"), ROUTES, ids=[" -> ".join(h) for _, h in ROUTES])
def test_each_documented_hop_exists_and_names_the_next(module: str, hops: list[str]) -> None:
    _check_route(hops)


def test_every_hop_of_the_client_routes_exists() -> None:
    """Each named hop of the routes from the client resolves to a function (a renamed
    part or method breaks its route here, not silently)."""
    hops = {hop for _, route in ROUTES for hop in route if not hop.startswith("driver:")}
    for hop in (
        "client.launch.Launcher.launch",
        "client.movement.DataMovement.read_on_actor",
        "client.transfer._inline",
        "client.interop.export_dlpack",
        "client.interop.cuda_array_interface",
    ):
        assert hop in hops, f"{hop} is on no documented route"
    for hop in hops:
        target: Any = resolve(hop)
        assert callable(target) or isinstance(target, property), hop


def test_a_wrong_route_is_caught() -> None:
    with pytest.raises(AttributeError):
        _check_route(
            ["client.client.ComputeClient.execute", "client.client.ComputeClient._nowhere"]
        )
    with pytest.raises(AssertionError, match="does not name the next hop"):
        _check_route(["client.client.ComputeClient.execute", "channel.channel.Channel.take_held"])
