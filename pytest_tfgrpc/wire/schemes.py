"""Payloads as TensorFlow sends them: iovec buffers in size classes, by TF-gRPC-Bench's schemes.

TF-gRPC-Bench (Biswas, Lu, Panda, 2018) models one payload as a number of iovec buffers
(default 10), each from one of three size classes (its Table 1):

======  =======  ==============
class   default  range
======  =======  ==============
small   10 B     [1 B, 1 KB)
medium  10 KB    [1 KB, 1 MB)
large   1 MB     [1 MB, 10 MB]
======  =======  ==============

**KB and MB are decimal here** (1 KB = 1000 B, 1 MB = 1000000 B). The paper writes "KBytes" and
"MBytes" and never a binary unit, its benchmark code is not public, and :mod:`pytest_tfgrpc.units`
reads ``KB``/``MB`` as powers of 1000, so an override written ``"1MB"`` means the same bytes as
the default it replaces and labels stay exact (``10KB``, ``1MB``). Whoever wants binary sizes
writes them: ``sizes={"medium": "10KiB", "large": "1MiB"}`` (both lie within their ranges). A
class's range is stored with an inclusive ``high``: small is 1..999 B, medium 1000..999999 B,
large 1000000..10000000 B.

Three schemes place buffers among the chosen classes (``classes``, all three by default):

* **uniform**: buffer ``i`` is of class ``classes[i % len(classes)]``, so the classes cycle in
  the order given and their counts differ by at most one. TF-gRPC-Bench's default payload,
  "10 buffers from all three categories at default sizes", is therefore small, medium, large,
  small, ... : 4 x 10 B + 3 x 10 KB + 3 x 1 MB = 3030040 B.
* **random**: each buffer's class is drawn at random (seeded) among at least two classes. When
  there are at least as many buffers as classes the draw is repeated until every chosen class
  appears, so that a payload labelled with a mix of classes always holds that mix.
* **skew**: an uneven mix, by the proportions of the ``bias`` class (see :data:`SKEW_PROPORTIONS`;
  large-biased 60/30/10 by default), in at least two classes. Buffers come grouped in the order of
  ``classes``: only the counts matter for one message, and a fixed order keeps a skew payload
  independent of the seed.

Sizes are each class's default (TF-gRPC-Bench's default), or with ``size_range=True`` drawn at
random within the class's range, log-uniformly: the medium range spans three orders of
magnitude, and a linear draw would almost never give a medium buffer under 10 KB.

Everything is seeded with ``numpy.random.default_rng(seed)``: the same spec always gives the
same payload. TF-gRPC-Bench sends the N buffers of a payload as one RPC; so does the plugin,
with :func:`payload_message` as its bytes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from types import MappingProxyType

import numpy as np

from pytest_tfgrpc.units import UnitError, parse_size, size_label
from pytest_tfgrpc.wire.grpc_settings import MAX_MESSAGE_BYTES
from pytest_tfgrpc.wire.tensors import DEFAULT_SEED, make_content

__all__ = [
    "DEFAULT_BUFFERS",
    "SCHEMES",
    "SIZE_CLASSES",
    "SKEW_PROPORTIONS",
    "Payload",
    "PayloadSpec",
    "SizeClass",
    "generate",
    "payload_message",
    "payload_spec",
]

SCHEMES = ("uniform", "random", "skew")
DEFAULT_BUFFERS = 10


@dataclass(frozen=True)
class SizeClass:
    """One buffer-size class: its name, default size, and range ``low..high`` (both inclusive)."""

    name: str
    default: int
    low: int
    high: int

    def __post_init__(self) -> None:
        if not 1 <= self.low <= self.default <= self.high:
            raise ValueError(
                f"size class {self.name!r}: need 1 <= low <= default <= high, got "
                f"low={self.low}, default={self.default}, high={self.high}"
            )

    def __contains__(self, nbytes: object) -> bool:
        return isinstance(nbytes, int) and self.low <= nbytes <= self.high

    def describe_range(self) -> str:
        """The range as people read it: ``1B..999B``."""
        return f"{size_label(self.low)}..{size_label(self.high)}"


#: TF-gRPC-Bench's Table 1, in size order; half-open ranges there are closed ones here.
SIZE_CLASSES: Mapping[str, SizeClass] = MappingProxyType(
    {
        c.name: c
        for c in (
            SizeClass("small", 10, 1, 1_000 - 1),
            SizeClass("medium", 10_000, 1_000, 1_000_000 - 1),
            SizeClass("large", 1_000_000, 1_000_000, 10_000_000),
        )
    }
)
_CLASS_NAMES = tuple(SIZE_CLASSES)

#: Skew proportions per bias class, in percent. The paper gives only the large-biased one
#: (60 % large, 30 % medium, 10 % small) and says small- and medium-biased variants exist. The
#: small-biased one mirrors it (60 % small, 30 % medium, 10 % large); the medium-biased one gives
#: its two neighbours equal shares (60 % medium, 20 % each), as neither is nearer. With two
#: classes the missing class's share is dropped and the rest renormalised, keeping the ratio of
#: the two: large-biased over (medium, large) is 2:1, over (small, large) 6:1.
SKEW_PROPORTIONS: Mapping[str, Mapping[str, int]] = MappingProxyType(
    {
        "large": MappingProxyType({"small": 10, "medium": 30, "large": 60}),
        "medium": MappingProxyType({"small": 20, "medium": 60, "large": 20}),
        "small": MappingProxyType({"small": 60, "medium": 30, "large": 10}),
    }
)


@dataclass(frozen=True)
class PayloadSpec:
    """What payload to generate; build it with :func:`payload_spec`, which reads user values.

    ``classes`` are the chosen size classes in the order given, each with its default size (or
    the user's override). ``bias`` is the skew scheme's bias class (by default ``"large"``, or
    the largest class chosen) and None for the others.
    Constructing a spec validates it, raising :class:`ValueError` naming the argument.
    """

    scheme: str = "uniform"
    buffers: int = DEFAULT_BUFFERS
    classes: tuple[SizeClass, ...] = tuple(SIZE_CLASSES.values())
    bias: str | None = None
    seed: int = DEFAULT_SEED
    size_range: bool = False

    def __post_init__(self) -> None:
        if self.scheme not in SCHEMES:
            raise ValueError(f"scheme={self.scheme!r}: unknown scheme; known: {', '.join(SCHEMES)}")
        if isinstance(self.buffers, bool) or not isinstance(self.buffers, int) or self.buffers < 1:
            raise ValueError(f"buffers={self.buffers!r}: expected a whole number of buffers >= 1")
        names = self.class_names
        if not names:
            raise ValueError("classes=(): expected at least one size class")
        for name in names:
            if name not in SIZE_CLASSES:
                raise ValueError(
                    f"classes={names!r}: unknown class {name!r}; known: {', '.join(_CLASS_NAMES)}"
                )
            if names.count(name) > 1:
                raise ValueError(f"classes={names!r}: {name} is given twice")
        if self.scheme in ("random", "skew") and len(names) < 2:
            raise ValueError(f"classes={names!r}: {self.scheme} needs at least two classes")
        for size_class in self.classes:
            base = SIZE_CLASSES[size_class.name]
            if (size_class.low, size_class.high) != (base.low, base.high):
                raise ValueError(
                    f"classes={names!r}: the {size_class.name} range is "
                    f"{base.describe_range()} (TF-gRPC-Bench Table 1); only its size changes"
                )
        if self.scheme == "skew":
            if self.bias is None:
                object.__setattr__(self, "bias", _default_bias(names))
            if self.bias not in names:
                raise ValueError(
                    f"bias={self.bias!r}: the bias must be one of the classes {names!r}"
                )
        elif self.bias is not None:
            raise ValueError(
                f"bias={self.bias!r}: only the skew scheme takes a bias, not {self.scheme}"
            )
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed={self.seed!r}: expected a whole number >= 0")
        smallest = min(c.low if self.size_range else c.default for c in self.classes)
        if self.buffers * smallest > MAX_MESSAGE_BYTES - 64:
            raise ValueError(
                f"buffers={self.buffers}: {self.buffers} buffers of at least "
                f"{size_label(smallest)} exceed gRPC's 2 GiB message limit"
            )

    @property
    def class_names(self) -> tuple[str, ...]:
        """The chosen classes' names, in the order given."""
        return tuple(c.name for c in self.classes)

    @property
    def label(self) -> str:
        """A compact, JUnit-friendly name of the spec: ``uniform-10x``, ``skew-10x``,
        ``uniform-large-10x``, ``random-small+large-20x-range``, ``uniform-large=4MiB-10x``.

        Classes appear when they are not all three in size order, or when one has a size of its
        own; a bias when it is not the default; the seed when the payload depends on it and it is
        not the default.
        """
        names = self.class_names
        parts = [self.scheme]
        overridden = [c for c in self.classes if c.default != SIZE_CLASSES[c.name].default]
        if names != _CLASS_NAMES or overridden:
            parts.append(
                "+".join(
                    c.name
                    if c.default == SIZE_CLASSES[c.name].default
                    else f"{c.name}={size_label(c.default)}"
                    for c in self.classes
                )
            )
        if self.bias is not None and self.bias != _default_bias(names):
            parts.append(f"{self.bias}-biased")
        parts.append(f"{self.buffers}x")
        if self.size_range:
            parts.append("range")
        if self.seed != DEFAULT_SEED and (self.scheme == "random" or self.size_range):
            parts.append(f"seed{self.seed}")
        return "-".join(parts)


@dataclass(frozen=True)
class Payload:
    """One generated payload: the exact size and class of every buffer, in order."""

    spec: PayloadSpec
    sizes: tuple[int, ...]
    buffer_classes: tuple[str, ...] = field(repr=False)

    def __post_init__(self) -> None:
        if len(self.sizes) != len(self.buffer_classes):
            raise ValueError(
                f"a payload of {len(self.sizes)} sizes names {len(self.buffer_classes)} classes"
            )

    @property
    def total_bytes(self) -> int:
        """The bytes of all buffers together: the size of the one message that carries them."""
        return sum(self.sizes)

    @property
    def description(self) -> str:
        """The spec's compact label, for JUnit properties and test ids (see PayloadSpec.label)."""
        return self.spec.label

    def counts(self) -> dict[str, int]:
        """Buffers per chosen class, in the spec's class order (a class with none counts 0)."""
        return {name: self.buffer_classes.count(name) for name in self.spec.class_names}


def _default_bias(names: Sequence[str]) -> str:
    """TF-gRPC-Bench biases skew to large; without large, to the largest class chosen."""
    return max(names, key=_CLASS_NAMES.index)


def _names(classes: str | Sequence[str]) -> tuple[str, ...]:
    if isinstance(classes, str):
        return tuple(name.strip() for name in classes.split(","))
    if not isinstance(classes, Sequence):
        raise ValueError(f"classes={classes!r}: expected class names such as ('small', 'large')")
    for name in classes:
        if not isinstance(name, str):
            raise ValueError(f"classes={tuple(classes)!r}: {name!r} is not a class name")
    return tuple(classes)


def payload_spec(
    scheme: str = "uniform",
    *,
    buffers: int = DEFAULT_BUFFERS,
    classes: str | Sequence[str] | None = None,
    sizes: Mapping[str, str | int] | None = None,
    bias: str | None = None,
    seed: int | None = None,
    size_range: bool = False,
) -> PayloadSpec:
    """Read a payload as users declare it into a :class:`PayloadSpec`.

    ``classes`` are class names (``("small", "large")`` or ``"small,large"``), all three in size
    order by default. ``sizes`` overrides class default sizes, in any unit
    :func:`~pytest_tfgrpc.units.parse_size` reads (``{"large": "4MiB"}``); each must lie in its
    class's range. ``bias`` (skew only) defaults to ``"large"``, or to the largest chosen class.
    ``seed`` defaults to :data:`~pytest_tfgrpc.wire.tensors.DEFAULT_SEED`. ``size_range=True`` draws
    each buffer's size within its class's range instead of using the class's size.

    Raises :class:`ValueError` whose message starts with the offending argument.
    """
    names = _CLASS_NAMES if classes is None else _names(classes)
    chosen: list[SizeClass] = []
    for name in names:
        if name not in SIZE_CLASSES:
            raise ValueError(
                f"classes={names!r}: unknown class {name!r}; known: {', '.join(_CLASS_NAMES)}"
            )
        chosen.append(SIZE_CLASSES[name])
    if sizes is not None:
        if not isinstance(sizes, Mapping):
            raise ValueError(f"sizes={sizes!r}: expected a mapping such as {{'large': '4MiB'}}")
        for name, value in sizes.items():
            if name not in SIZE_CLASSES:
                raise ValueError(
                    f"sizes={dict(sizes)!r}: unknown class {name!r}; "
                    f"known: {', '.join(_CLASS_NAMES)}"
                )
            if name not in names:
                raise ValueError(
                    f"sizes={dict(sizes)!r}: {name} is not among the classes {names!r}"
                )
            try:
                nbytes = parse_size(value)
            except UnitError as exc:
                raise ValueError(f"sizes={dict(sizes)!r}: {exc}") from None
            if nbytes not in SIZE_CLASSES[name]:
                raise ValueError(
                    f"sizes={dict(sizes)!r}: outside the {name} range "
                    f"{SIZE_CLASSES[name].describe_range()} (TF-gRPC-Bench Table 1)"
                )
            position = names.index(name)
            chosen[position] = replace(chosen[position], default=nbytes)
    if not isinstance(size_range, bool):
        raise ValueError(f"size_range={size_range!r}: expected True or False")
    return PayloadSpec(
        scheme=scheme,
        buffers=buffers,
        classes=tuple(chosen),
        bias=bias,
        seed=DEFAULT_SEED if seed is None else seed,
        size_range=size_range,
    )


def _apportion(buffers: int, weights: Sequence[Fraction]) -> list[int]:
    """Split ``buffers`` by ``weights`` (summing to 1) with the largest-remainder method.

    Each class first gets the whole part of its quota; the buffers left go one each to the
    largest fractional parts, ties to the larger weight, then to the earlier class. If there are
    at least as many buffers as classes, a class left with none then takes one from the class
    holding most (ties: the one with the smaller weight), so that every chosen class appears.
    """
    quotas = [buffers * w for w in weights]
    counts = [math.floor(q) for q in quotas]
    order = sorted(range(len(weights)), key=lambda i: (-(quotas[i] - counts[i]), -weights[i], i))
    for i in order[: buffers - sum(counts)]:
        counts[i] += 1
    if buffers >= len(weights):
        for i, count in enumerate(counts):
            if count == 0:
                donor = max(range(len(counts)), key=lambda j: (counts[j], -weights[j], -j))
                counts[donor] -= 1
                counts[i] = 1
    return counts


def _class_indices(spec: PayloadSpec, rng: np.random.Generator) -> list[int]:
    """Which chosen class each buffer is of, as indices into ``spec.classes``."""
    k, n = len(spec.classes), spec.buffers
    if spec.scheme == "uniform":
        return [i % k for i in range(n)]
    if spec.scheme == "random":
        while True:
            drawn = rng.integers(0, k, size=n)
            if n < k or len(set(drawn.tolist())) == k:
                return [int(i) for i in drawn]
    assert spec.bias is not None  # a skew spec always has one (PayloadSpec checks)
    table = SKEW_PROPORTIONS[spec.bias]
    total = sum(table[name] for name in spec.class_names)
    weights = [Fraction(table[name], total) for name in spec.class_names]
    return [i for i, count in enumerate(_apportion(n, weights)) for _ in range(count)]


def _draw_sizes(size_class: SizeClass, count: int, rng: np.random.Generator) -> list[int]:
    """``count`` sizes log-uniform in ``size_class``'s range (both ends inclusive)."""
    logs = rng.uniform(math.log(size_class.low), math.log(size_class.high + 1), size=count)
    return [min(max(int(math.exp(x)), size_class.low), size_class.high) for x in logs.tolist()]


def generate(spec: PayloadSpec) -> Payload:
    """The payload ``spec`` describes: the same spec always gives the same sizes.

    Raises :class:`ValueError` (naming ``buffers``) if the payload would not fit in one gRPC
    message, which only a ``size_range`` draw of many large buffers can reach.
    """
    rng = np.random.default_rng(spec.seed)
    indices = _class_indices(spec, rng)
    if spec.size_range:
        # One draw per class, in class order, so a class's sizes do not depend on the others'.
        drawn = {i: iter(_draw_sizes(c, indices.count(i), rng)) for i, c in enumerate(spec.classes)}
        sizes = tuple(next(drawn[i]) for i in indices)
    else:
        sizes = tuple(spec.classes[i].default for i in indices)
    payload = Payload(spec, sizes, tuple(spec.classes[i].name for i in indices))
    if payload.total_bytes > MAX_MESSAGE_BYTES - 64:
        raise ValueError(
            f"buffers={spec.buffers}: the payload {spec.label} holds {payload.total_bytes} bytes, "
            "over gRPC's 2 GiB message limit"
        )
    return payload


def payload_message(payload: Payload, *, seed: int | None = None) -> bytes:
    """The bytes that carry ``payload`` as one message: ``payload.total_bytes`` of seeded random
    content (random so that nothing on the path can compress it), the spec's seed by default.
    """
    return make_content(
        payload.total_bytes, dtype="uint8", seed=payload.spec.seed if seed is None else seed
    )[0]
