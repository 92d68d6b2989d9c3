"""Markers and options -> specs, and the errors for bad ones."""

from __future__ import annotations

import pytest

from pytest_tfgrpc.bench.specs import (
    RunOverrides,
    SpecError,
    budget_spec,
    message_spec,
    run_marker_spec,
    run_spec,
)
from pytest_tfgrpc.bench.timing import RunSpec
from pytest_tfgrpc.model.profiles import load_profile


def test_sizes_positionally_by_keyword_and_as_a_range() -> None:
    assert message_spec((["4B", "64KiB"],), {}).sizes == (4, 65536)
    assert message_spec((), {"sizes": "1KiB..8KiB"}).sizes == (1024, 2048, 4096, 8192)
    assert message_spec(("4096",), {}).sizes == (4096,)


def test_a_model_profile_gives_its_distinct_tensor_sizes() -> None:
    spec = message_spec(("resnet50",), {})
    profile = load_profile("resnet50")
    assert spec.profile is not None and spec.profile.num_parameters == profile.num_parameters
    assert spec.sizes == tuple(sorted(set(profile.sizes)))
    assert spec.source == "profile resnet50"


def test_a_model_profile_can_be_scaled_down() -> None:
    spec = message_spec(("resnet50",), {"max_tensors": 3})
    assert spec.profile is not None and spec.profile.num_tensors == 3
    assert "max_tensors=3" in spec.source


def test_a_payload_scheme_gives_one_message_of_its_buffers() -> None:
    spec = message_spec((), {"scheme": "skew"})
    assert spec.payload is not None
    assert spec.payload.sizes == (10,) + (10_000,) * 3 + (1_000_000,) * 6
    assert spec.sizes == (6_030_010,) and spec.messages == (spec.payload,)
    assert spec.scheme == "skew" and spec.source == "payload"


def test_uniform_sizes_stay_plain_sizes() -> None:
    spec = message_spec((["1KiB"],), {"scheme": "uniform"})
    assert spec.payload is None and spec.messages == (1024,)


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((), {}, "no sizes given"),
        (("nosuchmodel",), {}, "argument name='nosuchmodel'"),
        (("4Q",), {}, "argument 1='4Q': cannot read '4Q'"),
        ((["1KiB", "1KiB"],), {}, "1KiB is given twice"),
        ((["1KiB"],), {"scale": 0.5}, "scale applies to a model profile"),
        ((["1KiB"],), {"sizes": ["2KiB"]}, "either positionally or as sizes="),
        ((["1KiB"],), {"scheme": "skew"}, "scheme= describes a TF-gRPC-Bench payload"),
        ((), {"scheme": "zipf"}, "argument scheme='zipf': unknown scheme"),
        ((), {"scheme": "random", "classes": ["small"]}, "random needs at least two classes"),
        ((["1KiB"], ["2KiB"]), {}, "takes one positional argument"),
    ],
)
def test_bad_message_profiles(
    args: tuple[object, ...], kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(SpecError, match=r"@pytest\.mark\.message_profile") as info:
        message_spec(args, kwargs)
    assert message in str(info.value)


def test_budget_marker_takes_keywords_only() -> None:
    assert [limit.metric for limit in budget_spec((), {"p99": "2ms"}).limits] == ["p99"]
    with pytest.raises(SpecError, match="takes keyword limits"):
        budget_spec(("2ms",), {})


BASE = RunSpec(iterations=100, warmup=5, max_seconds=5.0, warmup_seconds=1.0)


def test_run_settings_layer_default_options_arguments() -> None:
    options = RunOverrides(iterations=20, max_seconds=2.0)
    run = run_spec(BASE, options, {"iterations": 7, "warmup": None}, "here")
    assert (run.iterations, run.warmup, run.max_seconds) == (7, 5, 2.0)


def test_a_duration_makes_the_run_time_based() -> None:
    run = run_spec(BASE, RunOverrides(), {"duration": 10.0}, "here")
    assert run.duration == 10.0 and run.time_limit_s == 10.0 and run.iterations == 1_000_000


def test_bad_run_settings_name_the_call() -> None:
    with pytest.raises(SpecError, match=r"test_x: p2p_latency.*iterations must be at least 1"):
        run_spec(BASE, RunOverrides(), {"iterations": 0}, "test_x: p2p_latency()")


def test_a_run_marker_reads_counts_and_durations() -> None:
    spec = run_marker_spec((), {"iterations": 20, "duration": "2s", "warmup_seconds": 0.5})
    assert (spec.iterations, spec.duration, spec.warmup_seconds) == (20, 2.0, 0.5)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"iterations": 0}, "iterations=0: a whole number >= 1"),
        ({"warmup": 1.5}, "warmup=1.5: a whole number >= 0"),
        ({"duration": "soon"}, "duration='soon'"),
        ({"rounds": 3}, "unknown argument 'rounds'"),
    ],
)
def test_bad_run_markers_name_the_argument(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(SpecError, match=r"@pytest\.mark\.tfgrpc_run") as info:
        run_marker_spec((), kwargs)
    assert message in str(info.value)


def test_a_marker_duration_outranks_option_counts() -> None:
    options = RunOverrides(iterations=30, warmup=3, max_seconds=2.0)
    merged = options.merged(RunOverrides(duration=1.0))
    run = run_spec(BASE, merged, {}, "here")
    assert run.duration == 1.0 and run.iterations == 1_000_000 and run.warmup == 1_000_000
    long = run_spec(BASE, options.merged(RunOverrides(duration=20.0)), {}, "here")
    assert long.time_limit_s == 20.0  # the options' 2 s cap does not cut a closer duration
    argued = run_spec(BASE, options, {"duration": 20.0}, "here")
    assert argued.time_limit_s == 20.0 and argued.iterations == 1_000_000
    counted = options.merged(RunOverrides(iterations=5))
    assert run_spec(BASE, counted, {}, "here").iterations == 5
