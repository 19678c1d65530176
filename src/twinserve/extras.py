"""Optional extras: find out, cheaply and before any work starts, whether the one a feature needs is installed.

The base install serves, benchmarks and advises; Ray Serve, OpenTelemetry, Locust, torch and the safe model
loaders come with extras (`pip install 'twinserve[ray]'`). A feature that needs one calls `require` where it
starts, so a missing extra is one line naming the pip command (`MissingExtra`, exit code 2 from the CLI), never a
traceback from deep inside the feature.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from twinserve.errors import MissingExtra

__all__ = ["import_extra", "installed", "require"]


def installed(module: str) -> bool:
    """Whether `module` can be imported, found without importing it (its parent packages are imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a parent package is missing
        return False


def require(extra: str, what: str, *modules: str, needs: str | None = None) -> None:
    """Raise MissingExtra unless every one of `modules` (provided by `extra`) can be imported."""
    if not all(installed(module) for module in modules):
        raise MissingExtra(what, extra, needs)


def import_extra(module: str, extra: str, what: str, needs: str | None = None) -> ModuleType:
    """Import `module`, provided by `extra`; MissingExtra if it (or something it needs) is not installed."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingExtra(what, extra, needs) from None
