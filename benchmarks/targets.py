"""The measuring path's speed targets (benchmarks/RESULTS.md) read from one run of the harness
(``run.py --json``): met or not.

    python benchmarks/targets.py RUN.json [--overhead overhead.json]

Each verdict uses figures of that one run: medians over rounds, and for the latency targets
also the median of per-round ratios (each round measures both contenders back to back, so the
paired ratio is less exposed to drift on a shared machine than the ratio of medians).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MiB = 1 << 20
KiB = 1 << 10


@dataclass(frozen=True)
class Verdict:
    target: str
    met: bool | None  # None: not assessed
    figures: str


def _rows(doc: dict[str, Any]) -> dict[tuple[str, int], dict[str, Any]]:
    return {(r["contender"], r["size"]): r for r in doc["rows"]}


def _paired(a: dict[str, Any], b: dict[str, Any]) -> float:
    ratios: list[float] = [
        float(x) / float(y) for x, y in zip(a["round_figures"], b["round_figures"], strict=True)
    ]
    return statistics.median(ratios)


def verdicts(doc: dict[str, Any], overhead: dict[str, Any] | None) -> list[Verdict]:
    rows = _rows(doc)
    out: list[Verdict] = []
    big = [
        s for s in (4 * MiB, 8 * MiB, 16 * MiB, 32 * MiB, 64 * MiB) if ("tcp push+ack", s) in rows
    ]
    for name in ("p2p_bandwidth raw/stream", "p2p_bandwidth raw/unary"):
        ratios = [(s, rows[name, s]["floor_ratio"]) for s in big if (name, s) in rows]
        if not ratios:
            continue
        text = ", ".join(f"{s // MiB} MiB {r:.2f}" for s, r in ratios)
        out.append(
            Verdict(
                f"{name}: >= 0.6 x tcp push+ack for 4-64 MiB",
                all(r >= 0.6 for _, r in ratios),
                text,
            )
        )
        if (name, 4 * MiB) in rows and (name, 64 * MiB) in rows:
            four, sixty = rows[name, 4 * MiB]["figure"], rows[name, 64 * MiB]["figure"]
            out.append(
                Verdict(
                    f"{name}: 64 MiB within 10% of 4 MiB",
                    sixty >= 0.9 * four,
                    f"4 MiB {four / 1e9:.3f} GB/s, 64 MiB {sixty / 1e9:.3f} GB/s "
                    f"({sixty / four:.2f})",
                )
            )
    out += parity(rows, big, doc)
    for rpc, bares in (
        ("unary", ("grpc sync unary", "grpc aio unary")),
        ("stream", ("grpc aio stream", "grpc aio stream/sync srv")),
    ):
        plugin = rows.get((f"p2p_latency raw/{rpc}", KiB))
        present = [rows[b, KiB] for b in bares if (b, KiB) in rows]
        if plugin is None or not present:
            continue
        best = min(present, key=lambda r: r["figure"])
        ratio = plugin["figure"] / best["figure"]
        paired = _paired(plugin, best)
        out.append(
            Verdict(
                f"1 KiB {rpc} echo p50: plugin <= 1.05 x best bare ({best['contender']})",
                ratio <= 1.05,
                f"plugin {plugin['figure'] / 1e3:.1f} us, bare {best['figure'] / 1e3:.1f} us: "
                f"x{ratio:.3f} (median of per-round ratios x{paired:.3f})",
            )
        )
    for rpc in ("stream", "unary"):
        raw = rows.get((f"p2p_bandwidth raw/{rpc}", 4 * MiB))
        pb = rows.get((f"p2p_bandwidth protobuf/{rpc}", 4 * MiB))
        if raw and pb:
            ratio = pb["figure"] / raw["figure"]
            out.append(
                Verdict(
                    f"protobuf >= 0.8 x raw at 4 MiB ({rpc})",
                    ratio >= 0.8,
                    f"protobuf {pb['figure'] / 1e9:.3f} GB/s, raw {raw['figure'] / 1e9:.3f} GB/s: "
                    f"x{ratio:.2f}",
                )
            )
    if overhead is not None:
        worst = max(loop["overhead_ns"] for loop in overhead["loops"])
        out.append(
            Verdict("bookkeeping < 1 us per sample", worst < 1000, f"at most {worst:.0f} ns")
        )
        held = overhead["memory"]["held_bytes"]
        out.append(
            Verdict(
                "10^6 samples held in < 10 MiB",
                held < 10 * MiB,
                f"{held} B ({held / MiB:.2f} MiB) for {overhead['memory']['samples']} samples",
            )
        )
    return out


TF = "tf RecvTensor pull"
TF_NET = "tf RecvTensor pull - step"
PLUGIN_BANDWIDTH = (
    "p2p_bandwidth raw/stream",
    "p2p_bandwidth protobuf/stream",
    "p2p_bandwidth raw/unary",
    "p2p_bandwidth protobuf/unary",
    # Pulls: TensorFlow's direction and (unary) RecvTensor's shape.
    "p2p_bandwidth raw/stream pull",
    "p2p_bandwidth protobuf/stream pull",
    "p2p_bandwidth raw/unary pull",
    "p2p_bandwidth protobuf/unary pull",
)


def parity(
    rows: dict[tuple[str, int], dict[str, Any]], big: Sequence[int], doc: dict[str, Any]
) -> list[Verdict]:
    """Each plugin bandwidth mode against TensorFlow's gRPC runtime, 4-64 MiB, same run.

    Met when the plugin's median is at least TensorFlow's at every size. Beside each ratio of
    medians: the median of per-round ratios, and the ratio to TF's steps less its per-step cost.
    """
    sizes = [s for s in big if (TF, s) in rows]
    if not sizes:
        tf = (doc.get("environment") or {}).get("tensorflow")
        why = "no TensorFlow rows in this run" + ("" if tf else " (tensorflow not run)")
        return [Verdict("on par with TensorFlow's gRPC runtime", None, why)]
    version = ((doc.get("environment") or {}).get("tensorflow") or {}).get("worker", {})
    tf_label = f"TF {version.get('tensorflow', '?')}"
    out = []
    for name in PLUGIN_BANDWIDTH:
        parts, ok = [], True
        for s in sizes:
            if (name, s) not in rows:
                continue
            mine, theirs = rows[name, s], rows[TF, s]
            ratio = mine["figure"] / theirs["figure"]
            ok = ok and ratio >= 1.0
            text = (
                f"{s // MiB} MiB {mine['figure'] / 1e9:.3f} vs {theirs['figure'] / 1e9:.3f} GB/s "
                f"x{ratio:.2f} (paired x{_paired(mine, theirs):.2f}"
            )
            if (TF_NET, s) in rows:
                text += f", vs TF less step x{mine['figure'] / rows[TF_NET, s]['figure']:.2f}"
            parts.append(text + ")")
        if parts:
            out.append(
                Verdict(f"{name}: on par with {tf_label}'s gRPC runtime", ok, "; ".join(parts))
            )
    return out


def render(vs: Sequence[Verdict]) -> str:
    lines = ["| target | verdict | figures (this run) |", "|---|---|---|"]
    for v in vs:
        verdict = "not assessed" if v.met is None else ("met" if v.met else "NOT met")
        lines.append(f"| {v.target} | {verdict} | {v.figures} |")
    return "\n".join(lines)


def _fig(kind: str, value: float) -> str:
    return f"{value / 1e3:.1f} us" if kind == "latency" else f"{value / 1e9:.3f} GB/s"


def _size(size: int) -> str:
    return f"{size // MiB} MiB" if size >= MiB else f"{size // KiB} KiB"


def table(doc: dict[str, Any], sizes: Sequence[int] | None = None) -> str:
    """The run's rows as a markdown table: median, x floor, and the spread over rounds."""
    lines = [
        "| kind | size | contender | shape | median | x floor | rounds min..max | ops |",
        "|---|---:|---|---|---:|---:|---:|---:|",
    ]
    for r in doc["rows"]:
        if sizes is not None and r["size"] not in sizes:
            continue
        ratio = "-" if r["floor_ratio"] is None else f"{r['floor_ratio']:.2f}"
        lo, hi = min(r["round_figures"]), max(r["round_figures"])
        spread = f"{_fig(r['kind'], lo)}..{_fig(r['kind'], hi)}"
        lines.append(
            f"| {r['kind']} | {_size(r['size'])} | {r['contender']} | {r['shape']} | "
            f"{_fig(r['kind'], r['figure'])} | {ratio} | {spread} | {r['samples']} |"
        )
    for r in doc.get("ps_rows", []):
        unit = "ms/step" if r["unit"] == "ms/step" else "rpc/s"
        fig = f"{r['figure']:.1f} {unit}" if unit == "ms/step" else f"{r['figure']:.0f} {unit}"
        lines.append(
            f"| ps | {r['key']} | {r['pattern']} | {r['shape']} | {fig} | - | "
            f"{min(r['round_figures']):.4g}..{max(r['round_figures']):.4g} | {r['samples']} |"
        )
    return "\n".join(lines)


def movement(a: dict[str, Any], b: dict[str, Any], sizes: Sequence[int]) -> str:
    """How much each figure and its ratio to the floor moved from run ``a`` to run ``b``."""
    ra, rb = _rows(a), _rows(b)
    lines = [
        "| size | contender | run A | run B | B/A | x floor A | x floor B |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for key, row in rb.items():
        if key[1] not in sizes or key not in ra:
            continue
        old = ra[key]
        fa = "-" if old["floor_ratio"] is None else f"{old['floor_ratio']:.2f}"
        fb = "-" if row["floor_ratio"] is None else f"{row['floor_ratio']:.2f}"
        lines.append(
            f"| {_size(key[1])} | {key[0]} | {_fig(row['kind'], old['figure'])} | "
            f"{_fig(row['kind'], row['figure'])} | {row['figure'] / old['figure']:.2f} | "
            f"{fa} | {fb} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("run", type=Path)
    p.add_argument("--overhead", type=Path, default=None)
    p.add_argument("--table", action="store_true", help="print the run's rows as markdown too")
    p.add_argument("--against", type=Path, default=None, help="an earlier run: print movement")
    p.add_argument("--table-sizes", default=None, help="only these sizes in bytes, e.g. 1024,")
    args = p.parse_args(argv)
    doc = json.loads(args.run.read_text())
    overhead = json.loads(args.overhead.read_text()) if args.overhead else None
    if args.table:
        only = [int(x) for x in args.table_sizes.split(",")] if args.table_sizes else None
        print(table(doc, only))
        print()
    if args.against is not None:
        sizes = [KiB, 4 * MiB, 16 * MiB, 64 * MiB]
        print(movement(json.loads(args.against.read_text()), doc, sizes))
        print()
    print(render(verdicts(doc, overhead)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
