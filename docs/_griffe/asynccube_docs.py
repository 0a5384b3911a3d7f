"""Griffe extension for asynccube's API reference (loaded by mkdocs.yml, not shipped).

Two things griffe does not do on its own:

- Load a subpackage without ``__init__.py`` (``asynccube._core``, an implicit namespace
  package) inside a regular package: without it every public name, an alias of a
  ``_core`` object, stays unresolved. The extension registers such folders as namespace
  subpackages before their modules are loaded.
- Read Sphinx roles (``:class:`Tensor```, ``:meth:`ComputeClient.read```) that the
  docstrings use: each becomes a cross-reference when it names a public name
  (``asynccube.Tensor``, whose page the reference renders) and inline code otherwise.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|attr|data|mod|exc|obj):`~?([^`]+)`")


class AsyncCubeDocs(griffe.Extension):
    """Namespace subpackages loaded, and Sphinx roles turned into Markdown."""

    def __init__(self) -> None:
        self.public: set[str] = set()

    def on_module_members(self, *, mod: griffe.Module, **kwargs: Any) -> None:
        """Register a package's folders that hold modules but no ``__init__.py``."""
        if isinstance(mod.filepath, Path) and mod.filepath.name == "__init__.py":
            _add_namespaces(mod, mod.filepath.parent)

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        """Rewrite the Sphinx roles of one object's docstring."""
        if not self.public and obj.package.exports:
            self.public = {str(name) for name in obj.package.exports}
        if obj.docstring is not None:
            obj.docstring.value = _ROLE.sub(self._role, obj.docstring.value)

    def _role(self, match: re.Match[str]) -> str:
        target = match.group(1).strip()
        name = target.removeprefix("asynccube.").removeprefix("ac.")
        if "_core" in name:
            name = name.rsplit(".", 1)[-1]
        if name.split(".", 1)[0] in self.public and "(" not in name:
            return f"[`{name}`][asynccube.{name}]"
        return f"`{name}`"


def _add_namespaces(parent: griffe.Module, folder: Path) -> None:
    """Each subfolder of ``folder`` without ``__init__.py`` but with modules somewhere
    below it, as a namespace module of ``parent`` (and so on down)."""
    for sub in sorted(folder.iterdir()):
        if not sub.is_dir() or (sub / "__init__.py").exists() or sub.name in parent.members:
            continue
        if sub.name == "__pycache__" or not any(sub.rglob("*.py")):
            continue
        module = griffe.Module(
            sub.name,
            filepath=[sub],
            lines_collection=parent.lines_collection,
            modules_collection=parent.modules_collection,
        )
        parent.set_member(sub.name, module)
        _add_namespaces(module, sub)
