"""Markers, options and defaults -> frozen specs: one pure function per spec.

Nothing here imports pytest: markers arrive as their positional and keyword arguments, and
errors are :class:`SpecError` with a message that names the marker and the argument; the
plugin puts the test's node id in front.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pytest_tfgrpc.bench.timing import RunSpec
from pytest_tfgrpc.budget import Budget, BudgetError, parse_budget
from pytest_tfgrpc.units import UnitError, parse_sizes

SCHEMES = ("uniform",)


class SpecError(ValueError):
    """A marker or argument that cannot be turned into a spec."""


@dataclass(frozen=True)
class MessageSpec:
    """The messages a test sends: sizes in bytes, and where they came from."""

    sizes: tuple[int, ...]
    scheme: str = "uniform"
    source: str = "sizes"


def message_spec(args: Sequence[Any], kwargs: Mapping[str, Any]) -> MessageSpec:
    """``@message_profile(name_or_sizes=None, *, sizes=None, scheme="uniform")`` -> spec."""
    where = "@pytest.mark.message_profile"
    unknown = sorted(set(kwargs) - {"name", "sizes", "scheme"})
    if unknown:
        raise SpecError(f"{where}: unknown argument {unknown[0]!r}; it takes name, sizes, scheme")
    if len(args) > 1:
        raise SpecError(f"{where} takes one positional argument (sizes), not {len(args)}")
    scheme = kwargs.get("scheme", "uniform")
    if scheme not in SCHEMES:
        known = ", ".join(SCHEMES)
        raise SpecError(
            f"{where} argument scheme={scheme!r}: unknown payload scheme; known: {known}"
        )
    positional = args[0] if args else kwargs.get("name")
    sizes = kwargs.get("sizes")
    if positional is not None and sizes is not None:
        raise SpecError(f"{where}: give sizes either positionally or as sizes=, not both")
    spec = sizes if sizes is not None else positional
    argument = "sizes" if sizes is not None else ("name" if "name" in kwargs else "argument 1")
    if spec is None:
        raise SpecError(f"{where}: no sizes given; e.g. message_profile(['4B', '64KiB'])")
    try:
        return MessageSpec(parse_sizes(spec), scheme=scheme, source="sizes")
    except UnitError as exc:
        raise SpecError(f"{where} {argument}={spec!r}: {exc}") from None


def budget_spec(args: Sequence[Any], kwargs: Mapping[str, Any]) -> Budget:
    """``@budget(**limits)`` -> Budget."""
    if args:
        raise SpecError(
            f"@pytest.mark.budget takes keyword limits such as p99='2ms', not {args[0]!r}"
        )
    try:
        return parse_budget(kwargs)
    except BudgetError as exc:
        raise SpecError(f"@pytest.mark.budget: {exc}") from None


@dataclass(frozen=True)
class RunOverrides:
    """Run settings given on the command line or in the ini file; None = not given."""

    iterations: int | None = None
    warmup: int | None = None
    max_seconds: float | None = None
    warmup_seconds: float | None = None
    duration: float | None = None


def run_spec(
    default: RunSpec, options: RunOverrides, arguments: Mapping[str, Any], where: str
) -> RunSpec:
    """The run spec of one call: the benchmark's default, then options, then arguments."""
    values: dict[str, Any] = {}
    for layer in (options.__dict__, arguments):
        values.update({key: value for key, value in layer.items() if value is not None})
    if values.get("duration") is not None and "iterations" not in values:
        # A time-based run is bounded by its duration; the count only guards memory.
        values["iterations"] = 1_000_000
        values.setdefault("max_seconds", max(default.max_seconds, values["duration"]))
    try:
        return replace(default, **values)
    except (TypeError, ValueError) as exc:
        raise SpecError(f"{where}: {exc}") from None
