"""The cluster-scale model (``pytest_tfgrpc.model.scaling``) against published scaling curves of
PS-over-gRPC TensorFlow. Pure computation: no timing, so the machine's load does not matter.

    python benchmarks/model_validation.py [--json out.json]

For every curve with points at both W <= 32 and W > 32:

- **calibrated**: the terms ``tfgrpc-model --calibrate`` fits by default (fan-in bandwidth,
  overlap, fixed loss) are fitted to the points with W <= 32, and every point is predicted;
  the same with the network core's capacity fitted too;
- **a priori**: the terms are taken from the source and other cited documents (stated with
  each curve), nothing fitted.

Every point's error is ``predicted - published`` in efficiency points (percentage points of
efficiency). A point published as a bound (">80%") counts 0 when the prediction satisfies it,
else its distance to the bound.

Each data point below is copied from its source, and how it was read is stated. Curves found
but not usable (no PS counts, no figures in readable text) are listed with the reason.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace

from pytest_tfgrpc.model.placement import Placement, place_profile
from pytest_tfgrpc.model.profiles import load_profile
from pytest_tfgrpc.model.scaling import (
    ClusterTerms,
    MeasuredPoint,
    allreduce_step,
    calibrate,
    ps_step,
)

CALIBRATE_UP_TO = 32

#: tf_cnn_benchmarks' ``--variable_update`` modes a point can have run in, and how each
#: places the PS copies (:func:`_placement`).
#:
#: Each row of Bugliarello's tables (``_CSCS``) names its mode (synthetic-data rows: Piz Daint
#: W = 4 and p2.xlarge W = 2-16 ``distributed_replicated``, every other ``parameter_server``;
#: the TensorFlow benchmarks page: ``distributed_replicated`` throughout), and the two modes
#: place the PS copies differently. The tf_cnn_benchmarks the source ran (its copy,
#: google-benchmarks/tf_cnn_benchmarks at a0d3d61, is tensorflow/benchmarks caabd6b with one
#: line commented out; variable_mgr.py is that of fd87986-caabd6b, the page's 9165a70
#: included):
#:
#: - ``parameter_server`` (VariableMgrDistributedFetchFromPS.get_devices): the model's variables
#:   go through ``replica_device_setter(ps_strategy=GreedyLoadBalancingStrategy(num_ps,
#:   byte_size_load_fn))`` in creation order: greedy by bytes;
#: - ``distributed_replicated`` (VariableMgrDistributedReplicated): the model's variables are
#:   the workers' local variables; the PS copies are made in get_gradients_to_apply
#:   (``ps_var/...``, one per trainable variable, in the gradients' order) under
#:   ``param_server_device = replica_device_setter(worker_device=..., cluster=...)``
#:   (tf_cnn_benchmarks.py), whose strategy is the default round robin and which has already
#:   placed ``global_step`` (``_build_model``) on PS 0.
PARAMETER_SERVER = "parameter_server"
DISTRIBUTED_REPLICATED = "distributed_replicated"
#: Each mode's placement, as the output names it.
SHARDING = {PARAMETER_SERVER: "greedy", DISTRIBUTED_REPLICATED: "round_robin"}


@dataclass(frozen=True)
class Point:
    workers: int
    ps: int
    efficiency: float
    bound: str = ""  # ">" when the source gives a lower bound only
    mode: str = PARAMETER_SERVER  # the --variable_update the source ran the point in


@dataclass(frozen=True)
class Curve:
    name: str
    source: str
    read: str
    profile: str
    points: tuple[Point, ...]
    apriori: ClusterTerms | None
    apriori_inputs: str


def _from_throughput(rows: Sequence[tuple[int, int, float, str]]) -> tuple[Point, ...]:
    base = rows[0][2]
    assert rows[0][0] == 1
    return tuple(Point(w, p, x / (w * base), mode=mode) for w, p, x, mode in rows)


def _placement(profile: str, point: Point) -> Placement:
    """Where tf_cnn_benchmarks put the PS copies in the point's mode (the comment on the
    modes above): greedy by bytes in ``parameter_server`` mode; in ``distributed_replicated``
    mode the default round robin of ``replica_device_setter``, which there places
    ``global_step`` (slot 0) and then one copy of each trainable variable in creation order
    (slots 1..M): the batch-norm statistics are the workers' local variables."""
    model = load_profile(profile)
    if point.mode == DISTRIBUTED_REPLICATED:
        model = replace(model, slots=tuple(range(1, model.num_tensors + 1)))
    return place_profile(model, point.ps, SHARDING[point.mode])


_CSCS = (
    "Bugliarello, 'Distributed TensorFlow: a performance evaluation' (CSCS, Aug 2017), "
    "github.com/e-bug/distributed-tensorflow-benchmarks at a0d3d61, "
    "report/source/benchmarks.tex"
)
#: gRPC's P2P bandwidth in TF-gRPC-Bench (Biswas et al., 2018), as /work/shared/reference
#: (field-and-peers.md, Figs. 11-12) reads it: the TF-era rate of one gRPC stream.
_TFGRPC_IPOIB = 2.6e9  # Cluster A, IPoIB EDR, uniform payload
_TFGRPC_10GBE = 1.1e9  # Cluster B, 10 GbE, uniform payload

_CSCS_AND_CORI: tuple[Curve, ...] = (
    Curve(
        name="Piz Daint, InceptionV3 (1 P100 per node)",
        source=_CSCS + ", table tab:peak-perf-daint",
        read=(
            "images/s with synthetic data, the PS count and the variable_update mode of each "
            "row of the table; "
            "efficiency = images/s / (W x 138.23); PS tasks on the workers' nodes (the report: "
            "'nodes running Workers also run Parameter Servers'); tf_cnn_benchmarks, TF 1.1, "
            "batch 64 per GPU"
        ),
        profile="inception3_tf_cnn",
        points=_from_throughput(
            [
                (1, 1, 138.23, PARAMETER_SERVER),
                (2, 1, 264.57, PARAMETER_SERVER),
                (4, 3, 523.38, DISTRIBUTED_REPLICATED),
                (8, 2, 1018.18, PARAMETER_SERVER),
                (16, 4, 2001.00, PARAMETER_SERVER),
                (32, 12, 3840.35, PARAMETER_SERVER),
                (64, 40, 7118.31, PARAMETER_SERVER),
                (128, 116, 9219.70, PARAMETER_SERVER),
            ]
        ),
        apriori=ClusterTerms(
            compute_s=64 / 138.23,
            bandwidth_Bps=_TFGRPC_IPOIB,
            alpha_s=50e-6,
            overlap=0.5,
            colocated=True,
        ),
        apriori_inputs=(
            "compute 64/138.23 s (the source's 1-GPU rate); bandwidth 2.6 GB/s (gRPC P2P over "
            "IPoIB in TF-gRPC-Bench: Aries carries TCP/IP as IPoIB does); alpha 50 us; overlap "
            "0.5; PS colocated (the source)"
        ),
    ),
    Curve(
        name="AWS p2.xlarge, InceptionV3 (1 K80 per node)",
        source=_CSCS + ", table tab:peak-perf-p2",
        read=(
            "images/s with synthetic data, the PS count and the variable_update mode of each "
            "row; efficiency = images/s / (W x 30.55); PS tasks on the workers' nodes; same "
            "software as above"
        ),
        profile="inception3_tf_cnn",
        points=_from_throughput(
            [
                (1, 1, 30.55, PARAMETER_SERVER),
                (2, 2, 57.45, DISTRIBUTED_REPLICATED),
                (4, 4, 114.57, DISTRIBUTED_REPLICATED),
                (8, 8, 228.41, DISTRIBUTED_REPLICATED),
                (16, 12, 431.64, DISTRIBUTED_REPLICATED),
                (32, 32, 825.64, PARAMETER_SERVER),
                (64, 64, 996.32, PARAMETER_SERVER),
                (128, 128, 1077.59, PARAMETER_SERVER),
            ]
        ),
        apriori=ClusterTerms(
            compute_s=64 / 30.55,
            bandwidth_Bps=_TFGRPC_10GBE,
            alpha_s=50e-6,
            overlap=0.5,
            colocated=True,
        ),
        apriori_inputs=(
            "compute 64/30.55 s (the source's 1-GPU rate); bandwidth 1.1 GB/s (gRPC P2P over "
            "10 GbE in TF-gRPC-Bench; AWS rates p2.xlarge's network only as 'High'); alpha "
            "50 us; overlap 0.5; PS colocated (the source)"
        ),
    ),
    Curve(
        name="Cori KNL, ResNet-50 (Mathuriya et al.)",
        source="Mathuriya et al., arXiv:1712.09388, abstract",
        read=(
            "'>80% scaling efficiency on up to 128 workers, using 32 parameter servers' (a "
            "bound) and '23% for 512 workers using 64 PS tasks'"
        ),
        profile="resnet50_tf_cnn",
        points=(Point(128, 32, 0.80, ">"), Point(512, 64, 0.23)),
        apriori=None,
        apriori_inputs=(
            "not computed: the text we could read (the abstract) gives no single-node step "
            "time, and the efficiency depends on the bytes per second of compute"
        ),
    ),
    Curve(
        name="Cori KNL, HEP-CNN (Mathuriya et al.)",
        source="Mathuriya et al., arXiv:1712.09388, abstract",
        read="'>80% weak scaling efficiency for up to 256 nodes with only 1 PS task' (a bound)",
        profile="hep_cnn",
        points=(Point(256, 1, 0.80, ">"),),
        apriori=None,
        apriori_inputs="not computed: no step time in the abstract",
    ),
)

_TF_PAGE = (
    "TensorFlow's benchmarks page, 'Details for Amazon EC2 Distributed (NVIDIA Tesla K80)' "
    "(tensorflow/docs, site/en/r1/guide/performance/benchmarks.md; tensorflow.org/performance/"
    "benchmarks, May 2017)"
)
_TF_READ = (
    "images/s with synthetic data at 8, 16, 32 and 64 GPUs = 1, 2, 4 and 8 p2.8xlarge "
    "instances of 8 K80s; distributed_replicated mode aggregates an instance's 8 GPUs "
    "locally, so a worker here is an instance (W = 1-8) and efficiency = images/s / (W x the "
    "one-instance rate); variable_update distributed_replicated (the page, for every model; "
    "benchmarks hash 9165a70); 'instances running worker servers also ran parameter servers', "
    "equal numbers of PS and workers except where the page says otherwise; no point above "
    "W = 32, so a priori only"
)


def _tf_page_curve(
    model: str, profile: str, batch: int, rows: Sequence[float], ps: Sequence[int]
) -> Curve:
    """A curve of the TensorFlow benchmarks page's EC2 distributed table (a priori only)."""
    one = rows[0]
    return Curve(
        name=f"AWS p2.8xlarge, {model} batch {batch} (TensorFlow benchmarks page)",
        source=_TF_PAGE,
        read=_TF_READ + f"; PS counts {', '.join(map(str, ps))}",
        profile=profile,
        points=_from_throughput(
            [
                (w, p, x, DISTRIBUTED_REPLICATED)
                for w, p, x in zip((1, 2, 4, 8), ps, rows, strict=True)
            ]
        ),
        apriori=ClusterTerms(
            compute_s=8 * batch / one,
            bandwidth_Bps=_TFGRPC_10GBE,
            alpha_s=50e-6,
            overlap=0.5,
            colocated=True,
        ),
        apriori_inputs=(
            f"compute 8 x {batch}/{one:g} s (the page's one-instance rate: 8 GPUs' step, "
            "their local aggregation included); bandwidth 1.1 GB/s (gRPC P2P over 10 GbE in "
            "TF-gRPC-Bench; AWS gives p2.8xlarge 10 Gigabit); alpha 50 us; overlap 0.5; PS "
            "colocated (the page); PS copies placed round robin, as the page's "
            "distributed_replicated mode places them"
        ),
    )


CURVES: tuple[Curve, ...] = (
    *_CSCS_AND_CORI,
    _tf_page_curve("InceptionV3", "inception3_tf_cnn", 64, (229, 459, 902, 1783), (1, 2, 4, 6)),
    _tf_page_curve("ResNet-50", "resnet50_tf_cnn", 64, (378, 751, 1388, 2744), (1, 2, 4, 8)),
    _tf_page_curve("InceptionV3", "inception3_tf_cnn", 32, (219, 427, 820, 1608), (1, 2, 4, 8)),
    _tf_page_curve("ResNet-50", "resnet50_tf_cnn", 32, (333, 667, 1180, 2315), (1, 2, 4, 4)),
)

NOT_USED = (
    (
        _TF_PAGE + ", ResNet-152",
        "no ResNet-152 profile in tf_cnn_benchmarks' variable order yet",
    ),
    (
        "Sergeev and Del Balso, Horovod (arXiv:1802.05799), Figs. 1 and 6",
        "the text says standard distributed TensorFlow 'left about half of 128 GPUs idle' "
        "(about 50% at 128 GPUs) but gives neither the curve's values nor its PS counts in "
        "readable text; a point without its PS count cannot be modelled",
    ),
    (
        _CSCS + ", table tab:peak-perf-p28 (p2.8xlarge)",
        "8 GPUs per node aggregate locally before the PS (the report), so W counts 1-16 "
        "nodes: no point above W = 32 to predict",
    ),
)


def _error(point: Point, predicted: float) -> float:
    """Predicted minus published, in efficiency points (0 when a bound is satisfied)."""
    if point.bound == ">":
        return 0.0 if predicted >= point.efficiency else 100 * (predicted - point.efficiency)
    return 100 * (predicted - point.efficiency)


def _published(point: Point) -> str:
    return f"{point.bound}{point.efficiency:.1%}"


def _evaluate(curve: Curve) -> dict[str, object]:
    small = [p for p in curve.points if p.workers <= CALIBRATE_UP_TO]
    large = [p for p in curve.points if p.workers > CALIBRATE_UP_TO]
    out: dict[str, object] = {
        "curve": curve.name,
        "source": curve.source,
        "read": curve.read,
        "profile": curve.profile,
        "apriori_inputs": curve.apriori_inputs,
    }
    placements = {p: _placement(curve.profile, p) for p in curve.points}
    rows: list[dict[str, object]] = [
        {
            "workers": p.workers,
            "ps": p.ps,
            "published": p.efficiency,
            "bound": p.bound,
            "mode": p.mode,
            "sharding": SHARDING[p.mode],
            "imbalance": placements[p].imbalance,
        }
        for p in curve.points
    ]
    fits: dict[str, object] = {}
    if len(small) >= 2 and large and curve.apriori is not None:
        measured = [
            MeasuredPoint(p.workers, p.ps, p.efficiency, placement=placements[p]) for p in small
        ]
        for label, free in (
            ("calibrated", ("bandwidth", "overlap", "fixed")),
            ("calibrated+core", ("bandwidth", "overlap", "fixed", "core")),
        ):
            start = replace(curve.apriori, overlap=0.0, core_Bps=None)
            fit = calibrate(measured, curve.profile, start, free=free)
            fits[label] = {
                "fitted": {t.name: t.as_dict() for t in fit.fitted},
                "unpinned": list(fit.unpinned()),
                "warnings": list(fit.warnings),
            }
            for row, point in zip(rows, curve.points, strict=True):
                e = ps_step(
                    curve.profile,
                    point.workers,
                    point.ps,
                    fit.terms,
                    placement=placements[point],
                ).efficiency
                row[label] = e
                row[f"{label}_error"] = _error(point, e)
    if curve.apriori is not None:
        for row, point in zip(rows, curve.points, strict=True):
            e = ps_step(
                curve.profile, point.workers, point.ps, curve.apriori, placement=placements[point]
            ).efficiency
            row["apriori"] = e
            row["apriori_error"] = _error(point, e)
            ring = allreduce_step(curve.profile, point.workers, curve.apriori)
            row["apriori_ring"] = ring.efficiency
    out["fits"] = fits
    out["points"] = rows
    return out


def _mean_abs(values: Sequence[float]) -> float | None:
    return sum(abs(v) for v in values) / len(values) if values else None


def _format(result: dict[str, object]) -> str:
    lines = [f"## {result['curve']}", f"source: {result['source']}", f"read: {result['read']}"]
    lines.append(
        f"profile: {result['profile']}, PS copies placed as each point's mode places them "
        f"({', '.join(f'{mode} {how}' for mode, how in SHARDING.items())}); a priori: "
        f"{result['apriori_inputs']}"
    )
    fits = result["fits"]
    assert isinstance(fits, dict)
    for label, fit in fits.items():
        parts = []
        for name, term in fit["fitted"].items():
            value = term["value"]
            shown = f"{value / 1e6:.4g} MB/s" if name in ("bandwidth", "core") else f"{value:.3g}"
            parts.append(f"{name} {shown}{'' if term['pinned'] else ' (not pinned)'}")
        lines.append(f"{label} on W <= {CALIBRATE_UP_TO}: " + ", ".join(parts))
    points = result["points"]
    assert isinstance(points, list)
    columns = [("calibrated", "calibrated"), ("calibrated+core", "+core"), ("apriori", "a priori")]
    present = [(key, title) for key, title in columns if key in points[0]]
    header = f"{'W':>4} {'PS':>4} {'published':>10}"
    for _, title in present:
        header += f" {title:>11} {'err':>6}"
    if "apriori_ring" in points[0]:
        header += f" {'ring a priori':>13}"
    header += f" {'placement':>11} {'imbalance':>9}"
    lines += ["", header]
    for row in points:
        point = Point(int(row["workers"]), int(row["ps"]), float(row["published"]), row["bound"])
        line = f"{point.workers:>4} {point.ps:>4} {_published(point):>10}"
        for key, _ in present:
            line += f" {row[key]:>11.1%} {row[f'{key}_error']:>+6.1f}"
        if "apriori_ring" in row:
            line += f" {row['apriori_ring']:>13.1%}"
        line += f" {row['sharding']:>11} {row['imbalance']:>9.3f}"
        marker = "  (fitted)" if point.workers <= CALIBRATE_UP_TO and fits else ""
        lines.append(line + marker)
    summary = []
    for key, title in present:
        big = [r[f"{key}_error"] for r in points if int(r["workers"]) > CALIBRATE_UP_TO]
        every = [r[f"{key}_error"] for r in points]
        within = sum(1 for e in big if abs(e) <= 10)
        mean_big, mean_all = _mean_abs(big), _mean_abs(every)
        text = f"{title}: no point at W > {CALIBRATE_UP_TO}"
        if mean_big is not None:
            text = f"{title}: W > {CALIBRATE_UP_TO} within 10 points: {within} of {len(big)}"
            text += f", mean |error| there {mean_big:.1f}"
        if mean_all is not None:
            text += f"; mean |error| over all points {mean_all:.1f}"
        summary.append(text)
    lines += ["", *summary]
    return "\n".join(lines)


def _overall(results: Sequence[dict[str, object]]) -> str:
    """Every curve's larger-W points and a-priori errors, counted together."""
    big: dict[str, list[float]] = {}
    apriori: list[float] = []
    for result in results:
        points = result["points"]
        assert isinstance(points, list)
        for row in points:
            for key in ("calibrated", "calibrated+core"):
                if f"{key}_error" in row and int(row["workers"]) > CALIBRATE_UP_TO:
                    big.setdefault(key, []).append(float(row[f"{key}_error"]))
            if "apriori_error" in row:
                apriori.append(float(row["apriori_error"]))
    lines = ["## All curves"]
    for key, errors in big.items():
        within = sum(1 for e in errors if abs(e) <= 10)
        lines.append(
            f"{key}: {within} of {len(errors)} points at W > {CALIBRATE_UP_TO} within 10 points"
        )
    mean = _mean_abs(apriori)
    if mean is not None:
        lines.append(f"a priori: mean |error| {mean:.1f} points over {len(apriori)} points")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", help="also write the results as JSON to this file")
    args = parser.parse_args(argv)
    results = [_evaluate(curve) for curve in CURVES]
    blocks = [_format(result) for result in results]
    blocks.append(_overall(results))
    blocks.append(
        "## Curves found but not used\n"
        + "\n".join(f"- {source}: {reason}" for source, reason in NOT_USED)
    )
    print("\n\n".join(blocks))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"curves": results, "not_used": NOT_USED}, handle, indent=2)
            handle.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
