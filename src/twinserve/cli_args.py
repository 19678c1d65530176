"""Argument types shared by the command-line tools."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

__all__ = ["positive"]


def positive(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse type: `kind(text)`, which must be greater than zero."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
        return value

    return parse
