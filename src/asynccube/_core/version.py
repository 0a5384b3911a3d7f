"""The package's version (``asynccube.__version__``), at the bottom of the layers so
that ``_core`` modules can name it without importing the package's top ``__init__``."""

from __future__ import annotations

from typing import Final

__all__ = ["__version__"]

__version__: Final = "0.1.0.dev0"
