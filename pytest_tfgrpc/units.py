"""Sizes, durations and rates as people write them (``64KiB``, ``500us``, ``10 Gbit/s``).

Parsers turn user text into base units (bytes, nanoseconds, seconds, bytes per second) and raise
:class:`UnitError` quoting the bad value and saying what was expected. Formatters turn base units
back into short labels for tables and JUnit property names.

Decimal prefixes (``KB``, ``MB``, ``GB``, ``TB``) are powers of 1000 and binary ones (``KiB``,
``MiB``, ``GiB``, ``TiB``) powers of 1024. Sizes are parsed with :class:`~decimal.Decimal` so
that ``0.1MB`` is exactly 100000 bytes and ``1.3B`` is caught as a fraction of a byte.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation

__all__ = [
    "UnitError",
    "align_columns",
    "counted",
    "format_duration",
    "format_rate",
    "format_size",
    "parse_duration_ns",
    "parse_rate_Bps",
    "parse_seconds",
    "parse_size",
    "parse_sizes",
    "size_label",
]


class UnitError(ValueError):
    """A size, duration or rate that cannot be read; the message quotes it and says why."""


_NUMBER = r"(?P<num>[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)"
_QUANTITY = re.compile(rf"^\s*{_NUMBER}\s*(?P<unit>\S*?)\s*$")

_PREFIXES = "KMGT"
#: Size units in the spelling :func:`size_label` writes, largest first, binary before decimal.
_SIZE_UNITS: tuple[tuple[str, int], ...] = tuple(
    (f"{p}{infix}B", base ** (i + 1))
    for i, p in reversed(list(enumerate(_PREFIXES)))
    for infix, base in (("i", 1024), ("", 1000))
)
_SIZE_EXPECTED = (
    "expected a whole number of bytes >= 0, bare or with one of B, KB, MB, GB, TB "
    "(powers of 1000), KiB, MiB, GiB, TiB (powers of 1024)"
)

_DURATION_NS = {"ns": 1.0, "us": 1e3, "\u00b5s": 1e3, "\u03bcs": 1e3, "ms": 1e6, "s": 1e9}
_DURATION_EXPECTED = "expected a number >= 0 and one of ns, us, \u00b5s, ms, s"

# Rates: the prefix letter's case is free, but B (bytes) and b/bit (bits) differ.
_RATE_UNIT = re.compile(
    r"^(?P<prefix>[kKmMgGtT](?P<binary>[iI])?)?(?P<what>B|b|bits?|Bytes?|bytes?)(?:/s|ps)$"
)
_RATE_EXPECTED = (
    "expected a number >= 0 and a rate unit such as B/s, KB/s, MB/s, GB/s, MiB/s, GiB/s "
    "(bytes) or Kbit/s, Mbit/s, Gbit/s, Mb/s, Gbps (bits)"
)


def _size_error(value: object, why: str = "") -> UnitError:
    because = f" ({why})" if why else ""
    return UnitError(f"cannot read {value!r} as a size{because}: {_SIZE_EXPECTED}")


def _size_multiplier(unit: str) -> int | None:
    """Bytes per ``unit``, or None; the prefix letter's case is free, the ``B`` is not."""
    if unit == "B":
        return 1
    if len(unit) == 3 and unit[1] in "iI" and unit[2] in "bB":
        # "kib" cannot mean anything but kibibytes: a size has no bits.
        prefix, base = unit[0].upper(), 1024
    elif len(unit) == 2 and unit[1] == "B":
        prefix, base = unit[0].upper(), 1000
    else:
        return None
    if prefix not in _PREFIXES:
        return None
    return int(base ** (_PREFIXES.index(prefix) + 1))


def parse_size(value: str | int) -> int:
    """Read a message size in bytes: ``4B``, ``64KiB``, ``1.5 MB``, ``10KB``, ``4096``.

    A bare integer (or a string of digits) is a count of bytes. The result must be a whole
    number of bytes: ``1.5KiB`` is 1536, ``1.3B`` is an error.
    """
    if isinstance(value, bool):
        raise _size_error(value, "a bool is not a size")
    if isinstance(value, int):
        if value < 0:
            raise _size_error(value, "negative")
        return value
    if isinstance(value, float):
        if not math.isfinite(value) or value < 0 or not value.is_integer():
            raise _size_error(value)
        return int(value)
    if not isinstance(value, str):
        raise _size_error(value, f"a {type(value).__name__} is not a size")
    match = _QUANTITY.match(value)
    if match is None:
        raise _size_error(value)
    unit = match["unit"]
    multiplier = 1 if unit == "" else _size_multiplier(unit)
    if multiplier is None:
        if unit.lower().endswith("b") and not unit.endswith("B"):
            raise _size_error(value, f"{unit!r} would be bits: write bytes with a capital B")
        raise _size_error(value, f"unknown unit {unit!r}")
    try:
        amount = Decimal(match["num"]) * multiplier
    except InvalidOperation:  # pragma: no cover - the regex admits only valid numbers
        raise _size_error(value) from None
    if amount < 0:
        raise _size_error(value, "negative")
    if amount != amount.to_integral_value():
        raise _size_error(value, f"{amount.normalize()} bytes is not a whole number")
    return int(amount)


def parse_duration_ns(value: str) -> float:
    """Read a duration with a unit as nanoseconds: ``250ns``, ``500us``, ``500µs``, ``2ms``.

    A bare number is an error here: in a budget, ``2`` could mean anything.
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        raise UnitError(
            f"cannot read {value!r} as a duration: a bare number is ambiguous; "
            f"{_DURATION_EXPECTED}, e.g. '{value}ms'"
        )
    if not isinstance(value, str):
        raise UnitError(f"cannot read {value!r} as a duration: {_DURATION_EXPECTED}")
    match = _QUANTITY.match(value)
    if match is None:
        raise UnitError(f"cannot read {value!r} as a duration: {_DURATION_EXPECTED}")
    unit = match["unit"]
    if unit == "":
        raise UnitError(
            f"cannot read {value!r} as a duration: a bare number is ambiguous; "
            f"{_DURATION_EXPECTED}, e.g. '{value.strip()}ms'"
        )
    scale = _DURATION_NS.get(unit) or _DURATION_NS.get(unit.lower())
    if scale is None:
        raise UnitError(
            f"cannot read {value!r} as a duration: unknown unit {unit!r}; {_DURATION_EXPECTED}"
        )
    ns = float(match["num"]) * scale
    if not math.isfinite(ns) or ns < 0:
        raise UnitError(f"cannot read {value!r} as a duration: {_DURATION_EXPECTED}")
    return ns


def parse_seconds(value: str | float | int) -> float:
    """Read an option value in seconds: a bare number (``30``, ``"0.5"``) or a duration.

    The result must be finite and greater than zero.
    """
    expected = "expected a number of seconds > 0, or a duration such as '500ms'"
    if isinstance(value, bool):
        raise UnitError(f"cannot read {value!r} as seconds: {expected}")
    seconds: float
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        try:
            seconds = float(value.strip())
        except ValueError:
            try:
                seconds = parse_duration_ns(value) / 1e9
            except UnitError:
                raise UnitError(f"cannot read {value!r} as seconds: {expected}") from None
    else:
        raise UnitError(f"cannot read {value!r} as seconds: {expected}")
    if not math.isfinite(seconds) or seconds <= 0:
        raise UnitError(f"cannot read {value!r} as seconds: {expected}")
    return seconds


def parse_rate_Bps(value: str) -> float:
    """Read a rate as bytes per second: ``2 GB/s``, ``1.5 GiB/s``, ``10 Gbit/s``, ``10Gbps``.

    ``B`` is bytes and ``b``/``bit`` is bits (``100 Mb/s`` is 12.5 MB/s); the prefix letter's
    case is free. A bare number is an error.
    """
    if not isinstance(value, str) or isinstance(value, bool):
        raise UnitError(f"cannot read {value!r} as a rate: {_RATE_EXPECTED}")
    match = _QUANTITY.match(value)
    if match is None:
        raise UnitError(f"cannot read {value!r} as a rate: {_RATE_EXPECTED}")
    unit = match["unit"]
    if unit == "":
        raise UnitError(
            f"cannot read {value!r} as a rate: a bare number is ambiguous; {_RATE_EXPECTED}"
        )
    unit_match = _RATE_UNIT.match(unit)
    if unit_match is None:
        raise UnitError(f"cannot read {value!r} as a rate: unknown unit {unit!r}; {_RATE_EXPECTED}")
    scale = 1.0
    if unit_match["prefix"]:
        base = 1024.0 if unit_match["binary"] else 1000.0
        scale = base ** (_PREFIXES.index(unit_match["prefix"][0].upper()) + 1)
    if not unit_match["what"].lower().startswith("byte") and unit_match["what"] != "B":
        scale /= 8.0
    rate = float(match["num"]) * scale
    if not math.isfinite(rate) or rate < 0:
        raise UnitError(f"cannot read {value!r} as a rate: {_RATE_EXPECTED}")
    return rate


def size_label(n: int) -> str:
    """The canonical, reversible label of ``n`` bytes, as used in JUnit property names.

    The unit is the one in which ``n`` is a whole number with the smallest count (binary on
    ties); a size that no unit divides is written in bytes: ``1024 -> "1KiB"``,
    ``10000 -> "10KB"``, ``1536 -> "1536B"``. ``parse_size(size_label(n)) == n``.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise UnitError(f"cannot label {n!r} as a size: expected a whole number of bytes >= 0")
    best_count, best_unit = n, "B"
    for unit, multiplier in _SIZE_UNITS:  # binary first, so a tie keeps the binary unit
        if n and n % multiplier == 0 and n // multiplier < best_count:
            best_count, best_unit = n // multiplier, unit
    return f"{best_count}{best_unit}"


def _range_sizes(text: str, spec: object) -> list[int]:
    low_text, _, high_text = text.partition("..")
    low, high = parse_size(low_text), parse_size(high_text)
    if low <= 0 or low > high:
        raise UnitError(
            f"cannot read {spec!r} as sizes: a range LOW..HIGH needs 0 < LOW <= HIGH, "
            f"got {size_label(low)}..{size_label(high)}"
        )
    sizes = []
    size = low
    while size <= high:
        sizes.append(size)
        size *= 2
    return sizes


def parse_sizes(spec: str | int | Sequence[str | int]) -> tuple[int, ...]:
    """Read a list of message sizes, in the order given.

    ``spec`` is one size (``"64KiB"``, ``4096``), a comma-separated or real list of sizes
    (``"4B, 1KiB"``, ``["4B", "1KiB"]``), or a range ``"1KiB..64MiB"``: the sizes from the low
    end doubling while they do not pass the high end (``1KiB, 2KiB, ..., 64MiB``). Items of a
    list may be ranges too. Two items of the same size are an error, as their JUnit names
    would collide.
    """
    items: list[str | int]
    if isinstance(spec, (str, int)):
        items = list(spec.split(",")) if isinstance(spec, str) else [spec]
    elif isinstance(spec, Sequence):
        items = list(spec)
    else:
        raise UnitError(f"cannot read {spec!r} as sizes: expected a size, a list or LOW..HIGH")
    sizes: list[int] = []
    for item in items:
        if isinstance(item, str) and ".." in item:
            sizes.extend(_range_sizes(item, spec))
        elif isinstance(item, str) and not item.strip():
            raise UnitError(f"cannot read {spec!r} as sizes: an item is empty")
        else:
            sizes.append(parse_size(item))
    if not sizes:
        raise UnitError(f"cannot read {spec!r} as sizes: no size given")
    seen: set[int] = set()
    for size in sizes:
        if size in seen:
            raise UnitError(
                f"cannot read {spec!r} as sizes: {size_label(size)} is given twice "
                "(each size names its own JUnit properties)"
            )
        seen.add(size)
    return tuple(sizes)


def _three_digits(value: float, units: Sequence[tuple[str, float]]) -> str:
    """``value`` (in the first unit) with 3 significant digits in the largest fitting unit."""
    if not math.isfinite(value):
        return f"{value}{units[0][0]}"
    if value == 0:
        return f"0{units[0][0]}"
    sign = "-" if value < 0 else ""
    # Round before choosing the unit, so that 999.7 ns is written 1.00us rather than 1000ns.
    magnitude = float(f"{abs(value):.3g}")
    unit, scale = units[0]
    for candidate, candidate_scale in units[1:]:
        if magnitude >= candidate_scale:
            unit, scale = candidate, candidate_scale
    scaled = magnitude / scale
    if scaled >= 100:
        text = f"{scaled:.0f}"
    elif scaled >= 10:
        text = f"{scaled:.1f}"
    elif scaled >= 1:
        text = f"{scaled:.2f}"
    else:  # below one of the smallest unit
        text = f"{scaled:#.3g}"
    return f"{sign}{text}{unit}"


def format_duration(ns: float) -> str:
    """A duration for people, 3 significant digits: ``18.4us``, ``1.23ms``, ``2.50s``."""
    return _three_digits(ns, (("ns", 1.0), ("us", 1e3), ("ms", 1e6), ("s", 1e9)))


def format_rate(Bps: float) -> str:
    """A rate in decimal units, 3 significant digits: ``1.23 GB/s``, ``512 MB/s``."""
    return _three_digits(
        Bps, ((" B/s", 1.0), (" KB/s", 1e3), (" MB/s", 1e6), (" GB/s", 1e9), (" TB/s", 1e12))
    )


def format_size(n: float) -> str:
    """A size for summaries: its exact label when that is short (``64KiB``, ``10KB``, ``512B``),
    else 3 significant digits in decimal units with a space (``6.03 MB``), so that a rounded
    figure never looks like an exact one.
    """
    if isinstance(n, float) and n.is_integer():
        n = int(n)
    if isinstance(n, int) and not isinstance(n, bool) and n >= 0:
        label = size_label(n)
        count = int(label.rstrip("KMGTiB"))
        if count < 1000:  # "512B", "64KiB"; not "6030KB"
            return label
    return _three_digits(
        float(n), ((" B", 1.0), (" KB", 1e3), (" MB", 1e6), (" GB", 1e9), (" TB", 1e12))
    )


def counted(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1: ``1 pair``, ``0 pairs``, ``3 pairs``
    (``noun`` is the singular; its plural adds an ``s``)."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"


def align_columns(rows: Sequence[Sequence[str]], left: int, separator: str = "  ") -> list[str]:
    """Rows of cells as aligned text lines: the first ``left`` columns to the left, the others
    (figures) to the right, joined by ``separator``, trailing blanks cut. Short rows are padded
    with empty cells. The one table layout of the terminal, ``tfgrpc-compare``, budgets and
    ``tfgrpc-model``."""
    width = max((len(row) for row in rows), default=0)
    table = [[*row, *([""] * (width - len(row)))] for row in rows]
    widths = [max(len(row[i]) for row in table) for i in range(width)]
    return [
        separator.join(
            cell.ljust(w) if i < left else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in table
    ]
