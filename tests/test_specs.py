"""Markers and options -> specs, and the errors for bad ones."""

from __future__ import annotations

import pytest

from pytest_tfgrpc.bench.specs import (
    RUN_SETTINGS,
    SpecError,
    budget_spec,
    message_spec,
    resolve_run,
    run_layer,
    run_marker_spec,
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
    options = run_layer("--tfgrpc-{flag}", {"iterations": "20", "max_seconds": "2s"})
    call = run_layer("p2p_latency()", {"iterations": 7, "warmup": None})
    run = resolve_run(BASE, [options, call])
    assert (run.iterations, run.warmup, run.max_seconds) == (7, 5, 2.0)
    ini = run_layer("ini tfgrpc_{name}", {"warmup": "9", "iterations": ""})
    assert resolve_run(BASE, [ini, options]).warmup == 9  # an option over the ini file


def test_a_duration_makes_the_run_time_based() -> None:
    run = resolve_run(BASE, [run_layer("here", {"duration": 10.0})])
    assert run.duration == 10.0 and run.time_limit_s == 10.0 and run.iterations == 1_000_000


def test_one_spelling_per_setting_everywhere() -> None:
    from pytest_tfgrpc.plugin.options import MARKERS, RUN_HELP

    assert list(RUN_HELP) == list(RUN_SETTINGS)
    assert RUN_SETTINGS == ("iterations", "warmup", "max_seconds", "warmup_seconds", "duration")
    assert all(f"{name}=None" in MARKERS["tfgrpc_run"] for name in RUN_SETTINGS)


@pytest.mark.parametrize(
    ("source", "given", "message"),
    [
        ("--tfgrpc-{flag}", {"iterations": "x"}, "iterations='x' from --tfgrpc-iterations: "),
        ("ini tfgrpc_{name}", {"max_seconds": "0"}, "max_seconds='0' from ini tfgrpc_max_seconds"),
        ("p2p_latency()", {"iterations": 0}, "iterations=0 from p2p_latency(): expected a whole"),
        ("p2p_latency()", {"max_time": 1}, "unknown run setting 'max_time' from p2p_latency()"),
    ],
)
def test_bad_run_settings_name_their_source(
    source: str, given: dict[str, object], message: str
) -> None:
    with pytest.raises(SpecError) as info:
        run_layer(source, given)
    assert str(info.value).startswith(message)


def test_a_run_marker_reads_counts_and_durations() -> None:
    _, spec = run_marker_spec((), {"iterations": 20, "duration": "2s", "warmup_seconds": 0.5})
    assert (spec["iterations"], spec["duration"], spec["warmup_seconds"]) == (20, 2.0, 0.5)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"iterations": 0},
            "iterations=0 from @pytest.mark.tfgrpc_run: expected a whole number >= 1",
        ),
        ({"warmup": 1.5}, "warmup=1.5 from @pytest.mark.tfgrpc_run: expected a whole number >= 0"),
        ({"duration": "soon"}, "duration='soon' from @pytest.mark.tfgrpc_run"),
        ({"rounds": 3}, "unknown run setting 'rounds' from @pytest.mark.tfgrpc_run"),
    ],
)
def test_bad_run_markers_name_the_argument(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(SpecError) as info:
        run_marker_spec((), kwargs)
    assert message in str(info.value)


def test_a_marker_duration_outranks_option_counts() -> None:
    options = run_layer("options", {"iterations": 30, "warmup": 3, "max_seconds": 2.0})
    marker = run_layer("marker", {"duration": 1.0})
    run = resolve_run(BASE, [options, marker])
    assert run.duration == 1.0 and run.iterations == 1_000_000 and run.warmup == 1_000_000
    long = resolve_run(BASE, [options, run_layer("marker", {"duration": 20.0})])
    assert long.time_limit_s == 20.0  # the options' 2 s cap does not cut a closer duration
    counted = resolve_run(BASE, [options, run_layer("marker", {"iterations": 5})])
    assert counted.iterations == 5
