from __future__ import annotations

import re
from collections import Counter

import pytest

from pytest_tfgrpc.wire.schemes import (
    SIZE_CLASSES,
    Payload,
    PayloadSpec,
    SizeClass,
    generate,
    payload_message,
    payload_spec,
)
from pytest_tfgrpc.wire.tensors import DEFAULT_SEED

S, M, L = 10, 10_000, 1_000_000


def test_size_classes_are_table_1_in_decimal_units() -> None:
    assert list(SIZE_CLASSES.values()) == [
        SizeClass("small", 10, 1, 999),
        SizeClass("medium", 10_000, 1_000, 999_999),
        SizeClass("large", 1_000_000, 1_000_000, 10_000_000),
    ]
    assert 999 in SIZE_CLASSES["small"] and 1000 not in SIZE_CLASSES["small"]
    assert 10_000_000 in SIZE_CLASSES["large"] and 10_000_001 not in SIZE_CLASSES["large"]
    assert SIZE_CLASSES["medium"].describe_range() == "1KB..999999B"


def test_uniform_default_cycles_all_three_classes_at_default_sizes() -> None:
    payload = generate(payload_spec())
    assert payload.sizes == (S, M, L, S, M, L, S, M, L, S)
    assert payload.buffer_classes == ("small", "medium", "large") * 3 + ("small",)
    assert payload.total_bytes == 3_030_040
    assert payload.counts() == {"small": 4, "medium": 3, "large": 3}
    assert payload.description == "uniform-10x"


def test_uniform_keeps_the_order_of_the_classes_given() -> None:
    payload = generate(payload_spec("uniform", classes=("large", "small"), buffers=5))
    assert payload.sizes == (L, S, L, S, L)
    assert payload.description == "uniform-large+small-5x"
    single = generate(payload_spec("uniform", classes="large"))
    assert single.sizes == (L,) * 10
    assert single.total_bytes == 10_000_000
    assert single.description == "uniform-large-10x"


def test_skew_default_is_60_30_10_at_10_buffers() -> None:
    payload = generate(payload_spec("skew"))
    assert payload.sizes == (S,) + (M,) * 3 + (L,) * 6
    assert payload.counts() == {"small": 1, "medium": 3, "large": 6}
    assert payload.total_bytes == 6_030_010
    assert payload.spec.bias == "large"
    assert payload.description == "skew-10x"


@pytest.mark.parametrize(
    ("bias", "counts", "label"),
    [
        ("small", {"small": 6, "medium": 3, "large": 1}, "skew-small-biased-10x"),
        ("medium", {"small": 2, "medium": 6, "large": 2}, "skew-medium-biased-10x"),
    ],
)
def test_skew_biased_variants(bias: str, counts: dict[str, int], label: str) -> None:
    payload = generate(payload_spec("skew", bias=bias))
    assert payload.counts() == counts
    assert payload.description == label


@pytest.mark.parametrize(
    ("buffers", "small", "medium", "large"),
    [
        (3, 1, 1, 1),  # quotas 0.3/0.9/1.8: every class still appears
        (4, 1, 1, 2),  # 0.4/1.2/2.4: the spare goes to large (ties to the larger share),
        #                then small takes one from large
        (5, 1, 2, 2),  # 0.5/1.5/3: the spare to medium, small takes one from large
        (7, 1, 2, 4),  # 0.7/2.1/4.2: the spare to small (largest remainder)
        (20, 2, 6, 12),
        (16, 1, 5, 10),  # 1.6/4.8/9.6: spares to medium then large
        (100, 10, 30, 60),
    ],
)
def test_skew_rounds_by_largest_remainder(
    buffers: int, small: int, medium: int, large: int
) -> None:
    payload = generate(payload_spec("skew", buffers=buffers))
    assert payload.counts() == {"small": small, "medium": medium, "large": large}
    assert len(payload.sizes) == buffers


def test_skew_with_fewer_buffers_than_classes_may_leave_a_class_out() -> None:
    assert generate(payload_spec("skew", buffers=1)).counts() == {
        "small": 0,
        "medium": 0,
        "large": 1,
    }
    assert generate(payload_spec("skew", buffers=2)).counts() == {
        "small": 0,
        "medium": 1,
        "large": 1,
    }


@pytest.mark.parametrize(
    ("classes", "bias", "counts"),
    [
        # The missing class's share dropped, the rest renormalised: 30:60 = 1:2.
        (("medium", "large"), None, {"medium": 3, "large": 7}),
        # 10:60: quotas 1.43/8.57.
        (("small", "large"), None, {"small": 1, "large": 9}),
        # Without large, the largest chosen class is the default bias: medium-biased 20:60,
        # quotas 2.5/7.5, the tie going to the larger share.
        (("small", "medium"), None, {"small": 2, "medium": 8}),
        (("small", "medium"), "small", {"small": 7, "medium": 3}),
        # Medium-biased over (medium, large): 60:20.
        (("large", "medium"), "medium", {"large": 2, "medium": 8}),
    ],
)
def test_skew_with_two_classes(
    classes: tuple[str, str], bias: str | None, counts: dict[str, int]
) -> None:
    payload = generate(payload_spec("skew", classes=classes, bias=bias))
    assert payload.counts() == counts
    assert list(payload.counts()) == list(classes)


def test_skew_with_two_classes_labels_only_a_non_default_bias() -> None:
    assert payload_spec("skew", classes=("small", "medium")).label == "skew-small+medium-10x"
    assert (
        payload_spec("skew", classes=("small", "medium"), bias="small").label
        == "skew-small+medium-small-biased-10x"
    )


def test_random_default_is_reproducible_and_mixes_all_classes() -> None:
    spec = payload_spec("random")
    first, second = generate(spec), generate(spec)
    assert first == second
    assert generate(payload_spec("random", seed=DEFAULT_SEED)) == first
    assert len(first.sizes) == 10
    assert all(count >= 1 for count in first.counts().values())
    for size, name in zip(first.sizes, first.buffer_classes, strict=True):
        assert size == SIZE_CLASSES[name].default
    assert first.total_bytes == sum(
        SIZE_CLASSES[name].default * count for name, count in first.counts().items()
    )
    assert first.description == "random-10x"


def test_random_differs_between_seeds() -> None:
    payloads = {generate(payload_spec("random", seed=seed)).buffer_classes for seed in range(10)}
    assert len(payloads) >= 8


def test_random_draws_classes_evenly() -> None:
    drawn: Counter[str] = Counter()
    for seed in range(300):
        drawn.update(generate(payload_spec("random", seed=seed)).buffer_classes)
    for name in ("small", "medium", "large"):
        assert 0.29 < drawn[name] / 3000 < 0.38, drawn


def test_random_over_two_classes_uses_only_those() -> None:
    payload = generate(payload_spec("random", classes=("small", "large"), buffers=6, seed=3))
    assert set(payload.sizes) == {S, L}
    assert set(payload.counts()) == {"small", "large"}
    assert payload.description == "random-small+large-6x-seed3"


def test_random_with_as_many_buffers_as_classes_has_one_of_each() -> None:
    for seed in range(20):
        payload = generate(payload_spec("random", buffers=3, seed=seed))
        assert sorted(payload.sizes) == [S, M, L]


def test_size_range_draws_within_each_class_and_log_uniformly() -> None:
    spec = payload_spec("uniform", classes="medium", buffers=3000, size_range=True)
    payload = generate(spec)
    assert all(size in SIZE_CLASSES["medium"] for size in payload.sizes)
    assert generate(spec) == payload
    # Log-uniform over 1 KB..1 MB puts a third under 10 KB; a linear draw would put 1 %.
    under_10k = sum(size < 10_000 for size in payload.sizes) / len(payload.sizes)
    assert 0.29 < under_10k < 0.38
    assert payload.description == "uniform-medium-3000x-range"


def test_size_range_keeps_the_scheme_placement() -> None:
    payload = generate(payload_spec("skew", size_range=True, seed=5))
    assert payload.counts() == {"small": 1, "medium": 3, "large": 6}
    for size, name in zip(payload.sizes, payload.buffer_classes, strict=True):
        assert size in SIZE_CLASSES[name]
    assert len(set(payload.sizes)) == 10
    assert payload != generate(payload_spec("skew", size_range=True, seed=6))
    assert payload.description == "skew-10x-range-seed5"


def test_small_range_reaches_its_ends() -> None:
    payload = generate(payload_spec("uniform", classes="small", buffers=5000, size_range=True))
    assert min(payload.sizes) == 1
    assert max(payload.sizes) == 999


def test_seed_does_not_change_payloads_without_randomness() -> None:
    assert generate(payload_spec("skew", seed=1)).sizes == generate(payload_spec("skew")).sizes
    assert payload_spec("uniform", seed=1).label == "uniform-10x"


@pytest.mark.parametrize(
    ("sizes", "expected"),
    [
        ({"large": "4MiB"}, 4 * 1024**2),
        ({"large": "1.5 MB"}, 1_500_000),
        ({"large": 2_000_000}, 2_000_000),
        ({"large": "10MB"}, 10_000_000),
    ],
)
def test_class_size_overrides_read_units(sizes: dict[str, str | int], expected: int) -> None:
    payload = generate(payload_spec("uniform", classes="large", sizes=sizes))
    assert payload.sizes == (expected,) * 10


def test_overrides_apply_to_their_class_only_and_show_in_the_label() -> None:
    spec = payload_spec("skew", sizes={"medium": "10KiB", "large": "1MiB"})
    payload = generate(spec)
    assert payload.sizes == (S,) + (10_240,) * 3 + (1_048_576,) * 6
    assert payload.total_bytes == 10 + 3 * 10_240 + 6 * 1_048_576
    assert payload.description == "skew-small+medium=10KiB+large=1MiB-10x"


def test_payload_message_is_one_message_of_the_total_size() -> None:
    payload = generate(payload_spec("skew"))
    message = payload_message(payload)
    assert len(message) == payload.total_bytes == 6_030_010
    assert payload_message(payload) == message
    assert payload_message(payload, seed=1) != message
    assert payload_message(payload, seed=1)[:1000] == payload_message(payload, seed=1)[:1000]
    # Random content: far from compressible runs.
    assert len(set(message[:4096])) > 200


def test_spec_and_payload_are_frozen() -> None:
    spec = payload_spec()
    payload = generate(spec)
    with pytest.raises(AttributeError):
        spec.buffers = 3  # type: ignore[misc]
    with pytest.raises(AttributeError):
        payload.sizes = ()  # type: ignore[misc]


def test_direct_construction_is_validated_too() -> None:
    assert PayloadSpec() == payload_spec()
    assert PayloadSpec(scheme="skew") == payload_spec("skew")
    assert PayloadSpec(scheme="skew").bias == "large"
    with pytest.raises(ValueError, match=r"^bias='large': the bias must be one of the classes"):
        PayloadSpec(
            scheme="skew", classes=(SIZE_CLASSES["small"], SIZE_CLASSES["medium"]), bias="large"
        )
    with pytest.raises(ValueError, match="only its size changes"):
        PayloadSpec(classes=(SizeClass("small", 10, 1, 5000),))
    with pytest.raises(ValueError, match="names 1 classes"):
        Payload(PayloadSpec(), (1, 2), ("small",))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"scheme": "zipf"},
            "scheme='zipf': unknown scheme; known: uniform, random, skew",
        ),
        ({"buffers": 0}, "buffers=0: expected a whole number of buffers >= 1"),
        ({"buffers": -3}, "buffers=-3: expected a whole number of buffers >= 1"),
        ({"buffers": "10"}, "buffers='10': expected a whole number of buffers >= 1"),
        ({"buffers": True}, "buffers=True: expected a whole number of buffers >= 1"),
        (
            {"scheme": "random", "classes": ("small",)},
            "classes=('small',): random needs at least two classes",
        ),
        (
            {"scheme": "skew", "classes": "large"},
            "classes=('large',): skew needs at least two classes",
        ),
        (
            {"classes": ("small", "huge")},
            "classes=('small', 'huge'): unknown class 'huge'; known: small, medium, large",
        ),
        ({"classes": ("large", "large")}, "classes=('large', 'large'): large is given twice"),
        ({"classes": ()}, "classes=(): expected at least one size class"),
        ({"classes": ("small", 3)}, "classes=('small', 3): 3 is not a class name"),
        (
            {"classes": 3},
            "classes=3: expected class names such as ('small', 'large')",
        ),
        (
            {"sizes": {"huge": "1MB"}},
            "sizes={'huge': '1MB'}: unknown class 'huge'; known: small, medium, large",
        ),
        (
            {"classes": "large", "sizes": {"small": "5B"}},
            "sizes={'small': '5B'}: small is not among the classes ('large',)",
        ),
        (
            {"sizes": {"small": "64KiB"}},
            "sizes={'small': '64KiB'}: outside the small range 1B..999B (TF-gRPC-Bench Table 1)",
        ),
        (
            {"sizes": {"large": "10MiB"}},
            "sizes={'large': '10MiB'}: outside the large range 1MB..10MB (TF-gRPC-Bench Table 1)",
        ),
        (
            {"sizes": {"large": "4Mb"}},
            "sizes={'large': '4Mb'}: cannot read '4Mb' as a size ('Mb' would be bits",
        ),
        ({"sizes": ["4MB"]}, "sizes=['4MB']: expected a mapping such as {'large': '4MiB'}"),
        (
            {"scheme": "skew", "classes": ("small", "medium"), "bias": "large"},
            "bias='large': the bias must be one of the classes ('small', 'medium')",
        ),
        (
            {"scheme": "skew", "bias": "huge"},
            "bias='huge': the bias must be one of the classes ('small', 'medium', 'large')",
        ),
        (
            {"bias": "small"},
            "bias='small': only the skew scheme takes a bias, not uniform",
        ),
        ({"seed": -1}, "seed=-1: expected a whole number >= 0"),
        ({"seed": 1.5}, "seed=1.5: expected a whole number >= 0"),
        ({"size_range": "yes"}, "size_range='yes': expected True or False"),
        (
            {"classes": "large", "buffers": 3000},
            "buffers=3000: 3000 buffers of at least 1MB exceed gRPC's 2 GiB message limit",
        ),
    ],
)
def test_validation_errors_name_the_argument(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        payload_spec(**kwargs)  # type: ignore[arg-type]


def test_a_drawn_payload_over_the_message_limit_is_refused() -> None:
    # 700 large buffers fit at 1 MB each, but not drawn up to 10 MB (3.9 MB on average).
    spec = payload_spec("uniform", classes="large", buffers=700, size_range=True)
    assert spec.buffers * SIZE_CLASSES["large"].low < 2**31
    with pytest.raises(ValueError, match=r"^buffers=700: the payload uniform-large-700x-range "):
        generate(spec)


def test_classes_as_comma_separated_text() -> None:
    assert payload_spec(classes="small, large").class_names == ("small", "large")
    assert generate(payload_spec(classes="small,large")).total_bytes == 5 * S + 5 * L
