"""Markers, options and defaults -> frozen specs: one pure function per spec.

Nothing here imports pytest: markers arrive as their positional and keyword arguments, and
errors are :class:`SpecError` with a message that names the marker and the argument; the
plugin puts the test's node id in front.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from types import MappingProxyType
from typing import Any

from pytest_tfgrpc.bench.timing import RunSpec
from pytest_tfgrpc.model.placement import Topology
from pytest_tfgrpc.model.profiles import Profile, list_profiles, load_profile
from pytest_tfgrpc.report.budget import Budget, BudgetError, parse_budget
from pytest_tfgrpc.suggest import did_you_mean
from pytest_tfgrpc.units import UnitError, parse_seconds, parse_sizes
from pytest_tfgrpc.wire import grpc_settings
from pytest_tfgrpc.wire.schemes import Payload, generate, payload_spec


class SpecError(ValueError):
    """A marker or argument that cannot be turned into a spec."""


@dataclass(frozen=True)
class MessageSpec:
    """The messages a test sends: sizes in bytes, and where they came from.

    With a model profile, ``profile`` holds its tensors and ``sizes`` the distinct tensor
    sizes, smallest first (what a point-to-point sweep over the model measures).
    """

    sizes: tuple[int, ...]
    scheme: str = "uniform"
    source: str = "sizes"
    profile: Profile | None = None
    payload: Payload | None = None

    @property
    def messages(self) -> tuple[int, ...] | tuple[Payload]:
        """What a point-to-point benchmark sends: the payload, or each size."""
        return (self.payload,) if self.payload is not None else self.sizes


_PAYLOAD_ARGS = ("buffers", "classes", "bias", "seed", "size_range")
_MESSAGE_ARGS = ("name", "sizes", "scheme", "scale", "max_tensors", "name_filter", *_PAYLOAD_ARGS)


def _unknown_argument(where: str, name: str, known: Sequence[str]) -> SpecError:
    """The error of a marker given an argument it does not take, suggesting the one meant."""
    return SpecError(
        f"{where}: unknown argument {name!r}; it takes {', '.join(known)}"
        + did_you_mean(name, known)
    )


def _payload_spec(kwargs: Mapping[str, Any], where: str) -> MessageSpec:
    arguments = {k: kwargs[k] for k in ("scheme", *_PAYLOAD_ARGS) if k in kwargs}
    try:
        payload = generate(payload_spec(**arguments))
    except (ValueError, TypeError) as exc:
        raise SpecError(f"{where} argument {exc}") from None
    _check_carried((payload.total_bytes,), f"{where} payload ({payload.description}):")
    return MessageSpec(
        (payload.total_bytes,), scheme=payload.spec.scheme, source="payload", payload=payload
    )


def _profile_spec(name: Any, kwargs: Mapping[str, Any], where: str) -> MessageSpec:
    try:
        profile = load_profile(name)
    except (ValueError, TypeError, OSError) as exc:
        raise SpecError(f"{where} argument name={name!r}: {exc}") from None
    scaling = {k: kwargs[k] for k in ("scale", "max_tensors", "name_filter") if k in kwargs}
    # Each scaling argument is checked on its own first, so the one at fault is the one named.
    for argument, value in scaling.items():
        try:
            profile.scaled(**{argument: value})
        except (ValueError, TypeError) as exc:
            raise SpecError(f"{where} argument {argument}={value!r}: {exc}") from None
    if scaling:
        try:
            profile = profile.scaled(**scaling)
        except (ValueError, TypeError) as exc:
            arguments = ", ".join(f"{k}={v!r}" for k, v in scaling.items())
            raise SpecError(f"{where} arguments {arguments}: {exc}") from None
    sizes = tuple(sorted(set(profile.sizes)))
    _check_carried(sizes, f"{where} argument name={name!r}: profile {profile.name}:")
    return MessageSpec(sizes, source=f"profile {profile.name}", profile=profile)


def _check_carried(sizes: Sequence[int], where: str) -> None:
    """A size beyond what one gRPC message carries is the marker's error, found at setup
    before any server starts, not a benchmark's failure after."""
    for size in sizes:
        if size > grpc_settings.MAX_TENSOR_BYTES:
            raise SpecError(f"{where} {grpc_settings.too_large(size)}")


def _looks_like_sizes(value: Any) -> bool:
    if not isinstance(value, str):
        return True
    try:
        parse_sizes(value)
    except UnitError:
        return value[:1].isdigit() or ".." in value
    return True


def message_spec(args: Sequence[Any], kwargs: Mapping[str, Any]) -> MessageSpec:
    """``@message_profile(name_or_sizes=None, *, sizes=None, scheme="uniform", ...)`` -> spec.

    The messages come from one of three sources: sizes (``["4B", "64KiB"]``,
    ``"1KiB..64MiB"``); a model profile (a built-in name such as ``"resnet50"`` or a JSON
    file, scalable with ``scale``, ``max_tensors``, ``name_filter``); or a TF-gRPC-Bench
    payload (``scheme`` = uniform, random or skew, with ``buffers``, ``classes``, ``bias``,
    ``seed``, ``size_range``; see :mod:`pytest_tfgrpc.wire.schemes`).
    """
    where = "@pytest.mark.message_profile"
    unknown = sorted(set(kwargs) - set(_MESSAGE_ARGS))
    if unknown:
        raise _unknown_argument(where, unknown[0], _MESSAGE_ARGS)
    if len(args) > 1:
        raise SpecError(f"{where} takes one positional argument (sizes), not {len(args)}")
    positional = args[0] if args else kwargs.get("name")
    sizes = kwargs.get("sizes")
    payload_args = [k for k in ("scheme", *_PAYLOAD_ARGS) if k in kwargs]
    if payload_args and positional is None and sizes is None:
        return _payload_spec(kwargs, where)
    if [k for k in payload_args if k != "scheme" or kwargs[k] != "uniform"]:
        raise SpecError(
            f"{where}: {payload_args[0]}= describes a TF-gRPC-Bench payload, which is given "
            "instead of sizes or a profile, not with them"
        )
    if sizes is None and positional is not None and not _looks_like_sizes(positional):
        return _profile_spec(positional, kwargs, where)
    scaling = sorted(set(kwargs) & {"scale", "max_tensors", "name_filter"})
    if scaling:
        raise SpecError(f"{where}: {scaling[0]} applies to a model profile, not to sizes")
    if positional is not None and sizes is not None:
        raise SpecError(f"{where}: give sizes either positionally or as sizes=, not both")
    spec = sizes if sizes is not None else positional
    argument = "sizes" if sizes is not None else ("name" if "name" in kwargs else "argument 1")
    if spec is None:
        raise SpecError(
            f"{where}: no sizes given; e.g. message_profile(['4B', '64KiB']) or "
            f"message_profile('resnet50') (profiles: {', '.join(list_profiles())})"
        )
    try:
        parsed = parse_sizes(spec)
    except UnitError as exc:
        raise SpecError(f"{where} {argument}={spec!r}: {exc}") from None
    _check_carried(parsed, f"{where} {argument}={spec!r}:")
    return MessageSpec(parsed, source="sizes")


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


#: The run settings, one spelling each: ``--tfgrpc-<name>`` (dashes) and its ini twin
#: ``tfgrpc_<name>``, the ``tfgrpc_run`` marker's and the benchmark calls' keywords; the
#: fields of :class:`~pytest_tfgrpc.bench.timing.RunSpec` a user sets (``rounds`` is each
#: benchmark's own).
RUN_SETTINGS = tuple(f.name for f in fields(RunSpec) if f.name != "rounds")
#: The counts among them, with their least value; the others are seconds (> 0).
_LEAST = {"iterations": 1, "warmup": 0}

#: One source's run settings, parsed: where they come from (for errors) and their values.
RunLayer = tuple[str, Mapping[str, float]]


def _where(source: str, name: str) -> str:
    return source.format(name=name, flag=name.replace("_", "-"))


def run_layer(source: str, given: Mapping[str, object]) -> RunLayer:
    """The run settings one source gives (``None`` or ``""``: not given), parsed: counts as
    whole numbers, seconds as numbers or durations (``"2s"``, ``"500ms"``).

    ``source`` says where they come from, formatted with the setting's ``{name}`` and its
    dashed ``{flag}``: ``"--tfgrpc-{flag}"``, ``"ini tfgrpc_{name}"``,
    ``"@pytest.mark.tfgrpc_run"``, ``"p2p_latency() arguments"``. Raises :class:`SpecError`
    naming the setting, the value and its source (``iterations=0 from --tfgrpc-iterations:
    ...``), as pytest-timeout's errors do.
    """
    values: dict[str, float] = {}
    for name, value in given.items():
        if value is None or value == "":
            continue
        where = _where(source, name)
        if name not in RUN_SETTINGS:
            raise SpecError(
                f"unknown run setting {name!r} from {where}; the settings are "
                f"{', '.join(RUN_SETTINGS)}{did_you_mean(name, RUN_SETTINGS)}"
            )
        if name in _LEAST:
            least = _LEAST[name]
            number = value
            if isinstance(value, str) and value.strip().isdigit():
                number = int(value)
            if isinstance(number, bool) or not isinstance(number, int) or number < least:
                raise SpecError(
                    f"{name}={value!r} from {where}: expected a whole number >= {least}"
                )
            values[name] = number
            continue
        try:
            seconds = parse_seconds(value)  # type: ignore[arg-type]
        except (UnitError, TypeError) as exc:
            raise SpecError(f"{name}={value!r} from {where}: {exc}") from None
        if not seconds > 0:
            raise SpecError(f"{name}={value!r} from {where}: expected seconds > 0")
        values[name] = seconds
    return source, MappingProxyType(values)


def resolve_run(default: RunSpec, layers: Sequence[RunLayer]) -> RunSpec:
    """The run of one benchmark call: its ``default``, then each layer, farthest first (the
    ini file, the options, the ``tfgrpc_run`` marker, the call's keywords), a closer value
    winning.

    A closer ``duration`` makes the run time-based, as TF-gRPC-Bench's: the counts and the
    time cap of farther layers no longer bound it; it warms up for ``warmup_seconds`` and
    measures for ``duration``, the counts only guarding memory. Pure: the layers were
    checked by :func:`run_layer`.
    """
    values: dict[str, Any] = {}
    for _, closer in layers:
        if "duration" in closer:
            for key in ("iterations", "warmup", "max_seconds"):
                if key not in closer:
                    values.pop(key, None)
        values.update(closer)
    if values.get("duration") is not None:
        values.setdefault("iterations", 1_000_000)
        values.setdefault("warmup", 1_000_000)
        values.setdefault("max_seconds", max(default.max_seconds, values["duration"]))
    return replace(default, **values)


def run_marker_spec(args: Sequence[Any], kwargs: Mapping[str, Any]) -> RunLayer:
    """``@tfgrpc_run(iterations=None, warmup=None, duration=None, max_seconds=None,
    warmup_seconds=None)`` -> the test's run settings (seconds as numbers or ``"2s"``)."""
    where = "@pytest.mark.tfgrpc_run"
    if args:
        raise SpecError(f"{where} takes keyword settings such as duration='10s', not {args[0]!r}")
    return run_layer(where, kwargs)


_TOPOLOGY_MARKER = "@pytest.mark.ps_topology"
_TOPOLOGY_ARGUMENTS = ("ps", "workers", "sharding")


def topology_spec(args: Sequence[Any], kwargs: Mapping[str, Any]) -> Topology:
    """``@ps_topology(ps=1, workers=1, sharding="round_robin")`` -> :class:`Topology`.

    Arguments may also be given positionally in that order. Raises
    :class:`SpecError` naming the marker and the argument.
    """
    unknown = sorted(set(kwargs) - set(_TOPOLOGY_ARGUMENTS))
    if unknown:
        raise _unknown_argument(_TOPOLOGY_MARKER, unknown[0], _TOPOLOGY_ARGUMENTS)
    if len(args) > len(_TOPOLOGY_ARGUMENTS):
        raise SpecError(
            f"{_TOPOLOGY_MARKER} takes at most {len(_TOPOLOGY_ARGUMENTS)} positional arguments "
            f"({', '.join(_TOPOLOGY_ARGUMENTS)}), not {len(args)}"
        )
    values: dict[str, Any] = {"ps": 1, "workers": 1, "sharding": "round_robin"}
    for name, value in zip(_TOPOLOGY_ARGUMENTS, args, strict=False):
        if name in kwargs:
            raise SpecError(f"{_TOPOLOGY_MARKER}: {name} given both positionally and as {name}=")
        values[name] = value
    values.update(kwargs)
    try:  # Topology checks ps, workers, sharding in this order
        return Topology(ps=values["ps"], workers=values["workers"], sharding=values["sharding"])
    except ValueError as exc:
        raise SpecError(f"{_TOPOLOGY_MARKER} argument {exc}") from None
