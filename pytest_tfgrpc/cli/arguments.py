"""Argument types shared by the command-line tools: numbers checked against their bounds."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import TypeVar

__all__ = ["bounded"]

_Number = TypeVar("_Number", int, float)


def bounded(
    kind: Callable[[str], _Number], accepts: Callable[[_Number], bool], expected: str
) -> Callable[[str], _Number]:
    """An argparse ``type`` that reads ``kind`` (``int`` or ``float``) and keeps the values
    ``accepts`` admits; anything else raises ``argparse.ArgumentTypeError`` as
    ``'TEXT' is not EXPECTED`` (argparse prefixes the option's name)."""

    def parse(text: str) -> _Number:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or (isinstance(value, float) and math.isnan(value)) or not accepts(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not {expected}")
        return value

    return parse
