from __future__ import annotations

import random

import pytest

from pytest_tfgrpc.units import (
    UnitError,
    counted,
    format_duration,
    format_rate,
    format_size,
    parse_duration_ns,
    parse_rate_Bps,
    parse_seconds,
    parse_size,
    parse_sizes,
    size_label,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4B", 4),
        ("64KiB", 65536),
        ("1.5 MB", 1_500_000),
        ("10KB", 10_000),
        ("64kib", 65536),
        ("64 KIB", 65536),
        ("10kB", 10_000),
        ("1.5KiB", 1536),
        ("2GiB", 2 * 1024**3),
        ("1TB", 10**12),
        ("0.1MB", 100_000),
        (" 4096 ", 4096),
        ("0", 0),
        ("0B", 0),
        ("1e3B", 1000),
        (4096, 4096),
        (0, 0),
    ],
)
def test_parse_size_reads_sizes_as_people_write_them(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    ("value", "piece"),
    [
        ("1.3B", "1.3 bytes is not a whole number"),
        ("0.0005KB", "0.5 bytes is not a whole number"),
        ("-4B", "negative"),
        (-4, "negative"),
        ("64kb", "'kb' would be bits"),
        ("4b", "'b' would be bits"),
        ("64K", "unknown unit 'K'"),
        ("5 parsecs", "unknown unit 'parsecs'"),
        ("nan", "cannot read 'nan' as a size"),
        ("", "cannot read '' as a size"),
        (True, "a bool is not a size"),
        (float("nan"), "cannot read nan as a size"),
        (1.5, "cannot read 1.5 as a size"),
    ],
)
def test_parse_size_rejects_with_the_value_and_what_was_expected(value: object, piece: str) -> None:
    with pytest.raises(UnitError) as info:
        parse_size(value)  # type: ignore[arg-type]
    assert piece in str(info.value)
    assert "expected a whole number of bytes >= 0" in str(info.value)
    assert "KiB" in str(info.value)


@pytest.mark.parametrize(
    ("text", "ns"),
    [
        ("250ns", 250.0),
        ("500us", 500_000.0),
        ("500\u00b5s", 500_000.0),
        ("500\u03bcs", 500_000.0),
        ("2ms", 2_000_000.0),
        ("2 MS", 2_000_000.0),
        ("1.5s", 1.5e9),
        ("0s", 0.0),
    ],
)
def test_parse_duration_ns(text: str, ns: float) -> None:
    assert parse_duration_ns(text) == pytest.approx(ns)


def test_parse_duration_quotes_the_value_and_lists_the_units() -> None:
    with pytest.raises(UnitError) as info:
        parse_duration_ns("5 parsecs")
    assert str(info.value) == (
        "cannot read '5 parsecs' as a duration: unknown unit 'parsecs'; "
        "expected a number >= 0 and one of ns, us, \u00b5s, ms, s"
    )


@pytest.mark.parametrize("value", ["2", "2.5", 2, 2.5])
def test_parse_duration_refuses_a_bare_number(value: str | float) -> None:
    with pytest.raises(UnitError, match=r"a bare number is ambiguous.*e\.g\. '2(\.5)?ms'"):
        parse_duration_ns(value)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["-1ms", "infs", "1 min", "ms", "abc"])
def test_parse_duration_rejects(value: str) -> None:
    with pytest.raises(UnitError, match=f"cannot read '{value}' as a duration"):
        parse_duration_ns(value)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [(30, 30.0), (0.5, 0.5), ("30", 30.0), (" 0.25 ", 0.25), ("500ms", 0.5), ("2s", 2.0)],
)
def test_parse_seconds(value: str | float, seconds: float) -> None:
    assert parse_seconds(value) == pytest.approx(seconds)


@pytest.mark.parametrize("value", [0, "0", "0ms", -1, "-2s", "nan", "inf", float("inf"), True, "x"])
def test_parse_seconds_wants_a_finite_positive_time(value: object) -> None:
    with pytest.raises(UnitError, match="expected a number of seconds > 0"):
        parse_seconds(value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "Bps"),
    [
        ("2 GB/s", 2e9),
        ("2gB/s", 2e9),
        ("1.5 GiB/s", 1.5 * 1024**3),
        ("500 MB/s", 500e6),
        ("500MBps", 500e6),
        ("10 Gbit/s", 1.25e9),
        ("10Gbps", 1.25e9),
        ("100 Mbit/s", 12.5e6),
        ("100 Mb/s", 12.5e6),
        ("8 Kib/s", 1024.0),
        ("64 KB/s", 64e3),
        ("12 B/s", 12.0),
        ("80 bit/s", 10.0),
    ],
)
def test_parse_rate_tells_bits_from_bytes(text: str, Bps: float) -> None:
    assert parse_rate_Bps(text) == pytest.approx(Bps)


@pytest.mark.parametrize(
    ("value", "piece"),
    [
        ("2", "a bare number is ambiguous"),
        ("2 GB", "unknown unit 'GB'"),
        ("2 parsecs/s", "unknown unit 'parsecs/s'"),
        ("-2 GB/s", "cannot read '-2 GB/s' as a rate"),
        (2e9, "cannot read 2000000000.0 as a rate"),
    ],
)
def test_parse_rate_rejects(value: object, piece: str) -> None:
    with pytest.raises(UnitError) as info:
        parse_rate_Bps(value)  # type: ignore[arg-type]
    assert piece in str(info.value)
    assert "expected a number >= 0 and a rate unit" in str(info.value)


@pytest.mark.parametrize(
    ("n", "label"),
    [
        (4, "4B"),
        (1024, "1KiB"),
        (10_000, "10KB"),
        (1_048_576, "1MiB"),
        (1_000_000, "1MB"),
        (1536, "1536B"),
        (0, "0B"),
        (2_048_000, "2000KiB"),
        (3 * 1024**4, "3TiB"),
        (64 * 1024**5, "65536TiB"),
    ],
)
def test_size_label(n: int, label: str) -> None:
    assert size_label(n) == label


def _label_round_trip_cases() -> list[int]:
    # Every small size, every multiple of every unit up to a few thousand, and seeded random
    # large sizes: the places where a unit might be chosen wrongly or lose bytes.
    cases = list(range(0, 5000))
    for multiplier in (1000, 1024, 1000**2, 1024**2, 1000**3, 1024**3, 1000**4, 1024**4):
        cases += [k * multiplier for k in range(1, 3000)]
    rng = random.Random(20240601)
    cases += [rng.randrange(0, 2**63) for _ in range(5000)]
    cases += [rng.randrange(1, 10**6) * 1000 ** rng.randrange(1, 4) for _ in range(2000)]
    return cases


def test_size_label_is_reversible_and_minimal() -> None:
    for n in _label_round_trip_cases():
        label = size_label(n)
        assert parse_size(label) == n, label
        # No unit gives a smaller whole count than the chosen one.
        count = int(label.rstrip("KMGTiB"))
        for multiplier in (1000, 1024, 1000**2, 1024**2, 1000**3, 1024**3, 1000**4, 1024**4):
            if n and n % multiplier == 0:
                assert count <= n // multiplier, (n, label)


@pytest.mark.parametrize("n", [-1, True, 1.5])
def test_size_label_rejects_what_is_not_a_size(n: object) -> None:
    with pytest.raises(UnitError, match="expected a whole number of bytes >= 0"):
        size_label(n)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("spec", "sizes"),
    [
        ("64KiB", (65536,)),
        (4096, (4096,)),
        (["4B", "64KiB", 1000], (4, 65536, 1000)),
        (("1KiB", "4B"), (1024, 4)),
        ("4B, 1KiB", (4, 1024)),
        ("1KiB..8KiB", (1024, 2048, 4096, 8192)),
        ("1KiB..10KiB", (1024, 2048, 4096, 8192)),
        ("3B..100B", (3, 6, 12, 24, 48, 96)),
        ("4B..4B", (4,)),
        (["1B..4B", "1MiB"], (1, 2, 4, 1048576)),
    ],
)
def test_parse_sizes(spec: str | int | list[str | int], sizes: tuple[int, ...]) -> None:
    assert parse_sizes(spec) == sizes


def test_parse_sizes_range_to_64MiB_has_17_sizes() -> None:
    sizes = parse_sizes("1KiB..64MiB")
    assert len(sizes) == 17
    assert sizes[-1] == 64 * 1024**2


@pytest.mark.parametrize(
    ("spec", "piece"),
    [
        ([], "no size given"),
        ("", "an item is empty"),
        (["1KiB", "1024B"], "1KiB is given twice"),
        (["1KiB..4KiB", "2KiB"], "2KiB is given twice"),
        ("0B..4KiB", "needs 0 < LOW <= HIGH, got 0B..4KiB"),
        ("8KiB..4KiB", "needs 0 < LOW <= HIGH, got 8KiB..4KiB"),
        ("1KiB..big", "cannot read 'big' as a size"),
        (None, "expected a size, a list or LOW..HIGH"),
    ],
)
def test_parse_sizes_rejects(spec: object, piece: str) -> None:
    with pytest.raises(UnitError) as info:
        parse_sizes(spec)  # type: ignore[arg-type]
    assert piece in str(info.value)


@pytest.mark.parametrize(
    ("ns", "text"),
    [
        (18_400, "18.4us"),
        (1_234_567, "1.23ms"),
        (512, "512ns"),
        (2.5e9, "2.50s"),
        (999.7, "1.00us"),
        (999_999.9, "1.00ms"),
        (0.5, "0.500ns"),
        (0, "0ns"),
        (12_345e9, "12300s"),
    ],
)
def test_format_duration(ns: float, text: str) -> None:
    assert format_duration(ns) == text


@pytest.mark.parametrize(
    ("Bps", "text"),
    [
        (1.234e9, "1.23 GB/s"),
        (512e6, "512 MB/s"),
        (18e3, "18.0 KB/s"),
        (5, "5.00 B/s"),
        (0, "0 B/s"),
    ],
)
def test_format_rate(Bps: float, text: str) -> None:
    assert format_rate(Bps) == text
    if Bps:
        assert parse_rate_Bps(text) == pytest.approx(Bps, rel=5e-3)


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (65536, "64KiB"),
        (10_000, "10KB"),
        (512, "512B"),
        (0, "0B"),
        (1024.0, "1KiB"),
        (6_030_000, "6.03 MB"),
        (2_048_000, "2.05 MB"),
        (1536, "1.54 KB"),
        (1234.5, "1.23 KB"),
    ],
)
def test_format_size(n: float, text: str) -> None:
    assert format_size(n) == text


@pytest.mark.parametrize(
    ("n", "noun", "text"),
    [(0, "pair", "0 pairs"), (1, "pair", "1 pair"), (2, "usable pair", "2 usable pairs"),
     (1, "more broken pair", "1 more broken pair"), (1200, "segment", "1,200 segments")],
)  # fmt: skip
def test_a_count_is_singular_only_for_one(n: int, noun: str, text: str) -> None:
    assert counted(n, noun) == text
