"""The side-by-side table of a JUnit file from ``pytest benchmarks/engines``: per benchmark
and size, each engine's p50 and throughput (MB/s), and TensorFlow's over grpcio's.

    python benchmarks/engines/table.py benchmarks/results/engines_1.xml
"""

from __future__ import annotations

import re
import sys
from collections import defaultdict

from junitparser.xunit2 import JUnitXml

ENGINES = ("grpcio", "tensorflow")
FIGURE = re.compile(r"^tfgrpc\.(?P<label>[^.]+)\.(?P<size>.+)\.(?P<metric>p50_us|throughput_MBps)$")


def main(path: str) -> int:
    rows: dict[tuple[str, str], dict[str, dict[str, float]]] = defaultdict(dict)
    for suite in JUnitXml.fromfile(path):
        for case in suite:
            engine = case.name.rsplit("-", 1)[-1].rstrip("]")
            for prop in case.properties():
                m = FIGURE.match(prop.name)
                if m and engine in ENGINES:
                    key = (m["label"], m["size"])
                    rows[key].setdefault(engine, {})[m["metric"]] = float(prop.value)
    columns = ["benchmark", "size", "grpcio p50", "tensorflow p50", "grpcio MB/s"]
    columns += ["tensorflow MB/s", "tf/grpcio p50"]
    print("| " + " | ".join(columns) + " |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for (label, size), by in rows.items():
        g, t = by.get("grpcio", {}), by.get("tensorflow", {})
        cells = [f"{e.get('p50_us', float('nan')):.0f} us" for e in (g, t)]
        cells += [f"{e['throughput_MBps']:.0f}" if "throughput_MBps" in e else "-" for e in (g, t)]
        ratio = t.get("p50_us", float("nan")) / g.get("p50_us", float("nan"))
        print(f"| {label} | {size} | " + " | ".join(cells) + f" | {ratio:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
