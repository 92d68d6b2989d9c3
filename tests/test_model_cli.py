"""``tfgrpc-model``'s contract for calibration and honest projections: CSV input, --pairs,
--json, --engine and the warnings."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_tfgrpc.cli.model import main, read_scaling_points
from pytest_tfgrpc.model.scaling import ClusterTerms, ps_step

PROFILE = "resnet50_tf_cnn"
TRUTH = ClusterTerms(compute_s=0.25, bandwidth_Bps=1.2e9, alpha_s=50e-6, overlap=0.5, fixed=0.04)
#: The plugin's sync_sgd_step exchanges without computing: nothing to overlap with.
EXCHANGE = replace(TRUTH, overlap=0.0, fixed=0.0)
GRID = [(1, 1), (2, 1), (4, 2), (8, 2), (8, 4), (16, 4), (16, 8), (32, 8)]


def _csv(tmp_path: Path, percent: bool = False, name: str = "points.csv") -> Path:
    lines = ["# synthetic, from known terms", "workers,ps,efficiency"]
    for w, p in GRID:
        e = ps_step(PROFILE, w, p, TRUTH).efficiency
        lines.append(f"{w},{p},{e * 100:.4f}%" if percent else f"{w},{p},{e:.6f}")
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_calibrate_csv_prints_fit_residuals_and_projection(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--profile", PROFILE, "--calibrate", str(_csv(tmp_path)), "--compute", "250ms"]
    code, out, err = _run([*argv, "--pairs", "64:16,512:64"], capsys)
    assert code == 0, err
    assert re.search(r"bandwidth\s+1[12]\d\d(\.\d+)? MB/s \+- ", out)
    assert re.search(r"overlap\s+0\.(4|5)\d* \+- ", out)
    assert "NOT PINNED" not in out
    # one residual line per measured point, naming its line in the file
    assert len(re.findall(r"points\.csv:\d+", out)) == len(GRID)
    table = out.split("ring efficiency\n")[1].splitlines()
    assert [line.split()[:2] for line in table] == [["64", "16"], ["512", "64"]]


def test_percent_and_fraction_read_alike(tmp_path: Path) -> None:
    fraction = read_scaling_points(_csv(tmp_path))
    percent = read_scaling_points(_csv(tmp_path, percent=True, name="pct.csv"))
    assert [round(p.efficiency, 5) for p in fraction.points] == [
        round(p.efficiency, 5) for p in percent.points
    ]
    bare = tmp_path / "bare.csv"
    bare.write_text("workers,ps,efficiency\n1,1,100\n8,2,92.5\n", encoding="utf-8")
    assert [p.efficiency for p in read_scaling_points(bare).points] == [1.0, 0.925]


def test_step_times_need_a_baseline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    steps = tmp_path / "steps.csv"
    steps.write_text("workers,ps,step_ms\n1,1,250\n4,1,300\n8,2,400\n", encoding="utf-8")
    points = read_scaling_points(steps)
    assert points.compute_s == pytest.approx(0.25)
    assert [p.efficiency for p in points.points] == pytest.approx([1.0, 250 / 300, 250 / 400])
    steps.write_text("workers,ps,step_ms\n4,1,300\n8,2,400\n", encoding="utf-8")
    code, _, err = _run(["--profile", PROFILE, "--calibrate", str(steps)], capsys)
    assert code == 1
    assert "one-worker row or --compute" in err and len(err.splitlines()) == 1


def test_json_contract(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--profile", PROFILE, "--calibrate", str(_csv(tmp_path)), "--compute", "250ms"]
    code, out, _ = _run([*argv, "--pairs", "8:2,128:32", "--json"], capsys)
    assert code == 0
    document = json.loads(out)
    assert set(document) >= {"fit", "points"}
    assert set(document["fit"]["fitted"]) == {"bandwidth", "overlap", "fixed"}
    assert len(document["fit"]["measured"]) == len(GRID)
    points = document["points"]
    assert [(p["workers"], p["ps"]) for p in points] == [(8, 2), (128, 32)]
    for p in points:
        assert 0 < p["efficiency"] <= 1  # a fraction, not a percent
        assert 0 < p["allreduce"]["efficiency"] <= 1
    # the link mode prints the same shape
    code, out, _ = _run(
        [
            *("--profile", PROFILE, "--alpha", "50us", "--bandwidth", "1GB/s"),
            *("--compute", "250ms", "--pairs", "4:2,16:4", "--json"),
        ],
        capsys,
    )
    document = json.loads(out)
    assert [(p["workers"], p["ps"]) for p in document["points"]] == [(4, 2), (16, 4)]
    assert document["fit"]["link"]["bandwidth_Bps"] == pytest.approx(1e9)


def test_pairs_in_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--profile", "hep_cnn", "--alpha", "5us", "--bandwidth", "1GB/s"]
    code, out, _ = _run([*argv, "--pairs", "4:1,64:2"], capsys)
    assert code == 0
    ps_table, allreduce_table = out.split("\n\n")[1:3]
    rows = [line.split()[:2] for line in ps_table.splitlines()[1:]]
    assert rows == [["4", "1"], ["64", "2"]]
    # the all-reduce beside PS, per worker count, over the same link
    assert allreduce_table.startswith("ring all-reduce of the profile over the same link")
    assert [line.split()[0] for line in allreduce_table.splitlines()[2:]] == ["4", "64"]
    with pytest.raises(SystemExit):
        main([*argv, "--pairs", "4-1"])
    assert "is not WORKERS:PS" in capsys.readouterr().err


def _junit(cases: dict[str, dict[str, str]]) -> str:
    body = "".join(
        f'<testcase classname="t" name="{name}" time="1"><properties>'
        + "".join(f'<property name="{k}" value="{v}"/>' for k, v in props.items())
        + "</properties></testcase>"
        for name, props in cases.items()
    )
    return (
        f'<?xml version="1.0"?><testsuites><testsuite name="pytest">{body}</testsuite></testsuites>'
    )


def _p2p(engine: str, fabric: str, seconds_per_byte: float, sizes: int = 4) -> dict[str, str]:
    props = {
        "tfgrpc.fabric": fabric,
        "tfgrpc.p2p_bandwidth.settings": f"engine={engine};iterations=10",
    }
    for size in (1 << 10, 1 << 16, 1 << 20, 1 << 24)[:sizes]:
        micros = (30e-6 + size * seconds_per_byte) * 1e6
        props[f"tfgrpc.p2p_bandwidth.{size >> 10}KiB.p50_us"] = repr(micros)
    return props


def test_engine_is_chosen_not_mixed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "perf.xml"
    path.write_text(
        _junit(
            {
                "a[eth0]": _p2p("grpcio", "eth0", 1 / 1e8),
                "b[eth0]": _p2p("native", "eth0", 1 / 1e9),
            }
        ),
        encoding="utf-8",
    )
    argv = ["--profile", "hep_cnn", "--from-junit", str(path), "--pairs", "4:1"]
    code, _, err = _run(argv, capsys)
    assert code == 1
    assert "several engines (grpcio, native)" in err and "--engine" in err
    code, out, err = _run([*argv, "--engine", "native"], capsys)
    assert code == 0 and "bandwidth 1.00 GB/s" in out and "warning" not in err
    code, out, _ = _run([*argv, "--engine", "grpcio"], capsys)
    assert code == 0 and "bandwidth 100 MB/s" in out
    code, _, err = _run([*argv, "--engine", "tensorflow"], capsys)
    assert code == 1 and "(it has: grpcio, native)" in err


def test_allreduce_cpu_read_from_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # An allreduce test records its model's inputs beside each point (model.cpu_step_us,
    # model.cpu_MBps); --from-junit projects the all-reduce with them, as with them typed.
    reduced = {
        "tfgrpc.fabric": "eth0",
        "tfgrpc.allreduce.4MiB.p50_us": "40000.0",
        "tfgrpc.allreduce.4MiB.model.cpu_step_us": "1000.0",
        "tfgrpc.allreduce.4MiB.model.cpu_MBps": "800.0",
    }
    path = tmp_path / "perf.xml"
    path.write_text(
        _junit({"p2p[eth0]": _p2p("grpcio", "eth0", 1 / 1e9), "allreduce[eth0]": reduced}),
        encoding="utf-8",
    )
    argv = ["--profile", "resnet50", "--compute", "200ms", "--pairs", "8:8,512:64", "--json"]

    def allreduce_rows(*extra: str) -> tuple[list[dict[str, object]], object]:
        code, out, err = _run([*argv, "--from-junit", str(path), *extra], capsys)
        assert code == 0, err
        document = json.loads(out)
        return [p["allreduce"] for p in document["points"]], document["fit"]["allreduce_cpu"]

    read, source = allreduce_rows()
    typed, typed_source = allreduce_rows("--allreduce-cpu", "1ms,800MB/s")
    assert read == typed
    assert [r["limit"] for r in read] == ["worker cpu", "worker cpu"]
    assert source == {
        "step_s": pytest.approx(1e-3),
        "byte_s": pytest.approx(1 / 8e8),
        "from": "file",
    }
    assert isinstance(typed_source, dict) and typed_source["from"] == "--allreduce-cpu"
    # typed inputs win over the recorded ones
    other, _ = allreduce_rows("--allreduce-cpu", "5ms")
    assert other[1]["comm_s"] != read[1]["comm_s"]
    code, out, _ = _run(["--profile", "resnet50", "--from-junit", str(path)], capsys)
    assert code == 0 and "a worker's CPU 1000 us per all-reduce step" in out
    assert "recorded by the file's allreduce test" in out


def test_warnings_for_loopback_and_few_points(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "lo.xml"
    path.write_text(_junit({"a[lo]": _p2p("grpcio", "lo", 1 / 1e9, sizes=2)}), encoding="utf-8")
    code, out, err = _run(["--profile", "hep_cnn", "--from-junit", str(path)], capsys)
    assert code == 0
    assert "measured over a loopback" in err
    assert "fewer than 4" in err
    # two sizes: the line goes through both, and no r^2 is printed to suggest otherwise
    assert "r^2" not in out and "an exact fit" in out


def test_calibrate_from_sync_sgd_step_results(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = {}
    for w, p in GRID:
        # the plugin's steps are the exchange alone, without compute
        step = ps_step(PROFILE, w, p, EXCHANGE).step_s - TRUTH.compute_s
        cases[f"step_{w}_{p}"] = {
            "tfgrpc.sync_sgd_step.topology": f"{p}ps_{w}workers_round_robin",
            f"tfgrpc.sync_sgd_step.{PROFILE}.step_p50_us": repr(step * 1e6),
        }
    path = tmp_path / "steps.xml"
    path.write_text(_junit(cases), encoding="utf-8")
    measured = read_scaling_points(path, compute_s=0.25)
    assert sorted((p.workers, p.ps) for p in measured.points) == sorted(GRID)
    code, out, err = _run(
        ["--profile", PROFILE, "--calibrate", str(path), "--compute", "250ms", "--pairs", "8:2"],
        capsys,
    )
    assert code == 0, err
    assert "calibrated on 8 measured points (sync_sgd_step steps added to --compute)" in out
    truth = {(w, p): ps_step(PROFILE, w, p, EXCHANGE).efficiency for w, p in GRID}
    for point in measured.points:
        assert point.efficiency == pytest.approx(truth[point.workers, point.ps], rel=1e-6)
    code, _, err = _run(["--profile", PROFILE, "--calibrate", str(path)], capsys)
    assert code == 1 and "without computing" in err


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("workers,efficiency\n1,1\n", "expected a header 'workers,ps,efficiency'"),
        ("workers,ps,efficiency\n1,x,1\n", "line 2"),
        ("workers,ps,efficiency\n", "no points below the header"),
        ("workers,ps,efficiency\n0,1,1\n", "must be >= 1"),
    ],
)
def test_bad_scaling_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(text, encoding="utf-8")
    code, _, err = _run(["--profile", PROFILE, "--calibrate", str(path), "--compute", "1s"], capsys)
    assert code == 1
    assert err.startswith("tfgrpc-model: error: ") and len(err.splitlines()) == 1
    assert message in err


def test_calibration_warns_of_few_points(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "two.csv"
    path.write_text("workers,ps,efficiency\n1,1,0.99\n8,2,0.9\n", encoding="utf-8")
    code, out, err = _run(
        ["--profile", PROFILE, "--calibrate", str(path), "--compute", "1s", "--pairs", "64:8"],
        capsys,
    )
    assert code == 0
    assert "fewer than 4" in err and "could not pin down" in err
    assert "NOT PINNED DOWN" in out


def test_a_model_miss_is_shown_in_the_summary(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        def test_step(tfgrpc, record_property):
            prefix = "tfgrpc.sync_sgd_step.resnet50"
            record_property(prefix + ".p50_us", "10000")
            record_property(prefix + ".model.step_us", "3000")
            record_property(prefix + ".model.error_pct", "-70")
            record_property(prefix + ".model.links", "PS 0 for all")

        def test_close(tfgrpc, record_property):
            prefix = "tfgrpc.sync_sgd_step.hep_cnn"
            record_property(prefix + ".p50_us", "10000")
            record_property(prefix + ".model.step_us", "9000")
            record_property(prefix + ".model.error_pct", "-10")
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        [
            "tfgrpc: model missed test_a_model_miss_is_shown_in_the_summary.py::test_step "
            "sync_sgd_step.resnet50: predicted 3 ms, -70% off the measured p50 "
            "(links: PS 0 for all)"
        ]
    )
    assert "hep_cnn: predicted" not in result.stdout.str()


def test_cluster_options_need_calibrate(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--profile", "hep_cnn", "--alpha", "5us", "--bandwidth", "1GB/s", "--colocated"])
    assert exit_info.value.code == 2
    assert "--colocated apply to the cluster-scale model: give --calibrate" in (
        capsys.readouterr().err
    )


def test_the_allreduce_cpu_term_beside_ps(capsys: pytest.CaptureFixture[str]) -> None:
    link = ["--profile", "resnet50", "--alpha", "50us", "--bandwidth", "1.2GB/s"]
    grid = ["--compute", "200ms", "--pairs", "8:8,512:64", "--json"]
    code, out, _ = _run([*link, *grid], capsys)
    assert code == 0
    bare = [p["allreduce"] for p in json.loads(out)["points"]]
    code, out, _ = _run([*link, *grid, "--allreduce-cpu", "1ms,800MB/s"], capsys)
    assert code == 0
    with_cpu = [p["allreduce"] for p in json.loads(out)["points"]]
    # ResNet-50's 102 MB at 1.2 GB/s: the link sets the step; with a worker's CPU per step
    # and per byte, the CPU does, and at 512 workers the ring's 1022 steps cost a second
    assert [r["limit"] for r in bare] == ["ring", "ring"]
    assert [r["limit"] for r in with_cpu] == ["worker cpu", "worker cpu"]
    assert with_cpu[1]["comm_s"] > bare[1]["comm_s"] + 1.0
    assert all(w["efficiency"] < b["efficiency"] for w, b in zip(with_cpu, bare, strict=True))
    with pytest.raises(SystemExit):
        main([*link, "--allreduce-cpu", "fast"])
