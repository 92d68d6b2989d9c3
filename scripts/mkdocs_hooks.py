"""MkDocs hook: the reference tables, made from the code that defines them, so they cannot
drift. A page names a table with a line ``<!-- tfgrpc:NAME -->`` (options, markers, metrics,
commands)."""

from __future__ import annotations

import importlib
from importlib.metadata import distribution
from typing import Any

from pytest_tfgrpc.metrics import METRICS, Metric
from pytest_tfgrpc.plugin import options


class _Recorder:
    """What ``pytest_addoption`` calls, kept: (flags, dest, help, metavar, default)."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str, str]] = []
        self.ini: dict[str, Any] = {}

    def getgroup(self, *args: Any, **kwargs: Any) -> _Recorder:
        return self

    def addoption(self, *flags: str, **kwargs: Any) -> None:
        metavar = kwargs.get("metavar") or ""
        if not metavar and kwargs.get("choices"):
            metavar = "|".join(map(str, kwargs["choices"]))
        text = str(kwargs.get("help", "")).replace("%%", "%")
        self.rows.append((" ".join(flags), str(metavar), kwargs.get("dest", ""), text))

    def addini(self, name: str, help: str, **kwargs: Any) -> None:
        self.ini[name] = kwargs.get("default")


def _cell(text: object) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def options_table() -> str:
    recorder = _Recorder()
    options.pytest_addoption(recorder)  # type: ignore[arg-type]
    lines = ["| option | value | ini key (default) | what |", "|---|---|---|---|"]
    for flags, metavar, dest, text in recorder.rows:
        default = recorder.ini.get(dest)
        ini = f"`{dest}`" + (f" (`{_cell(default)}`)" if default not in (None, [], "") else "")
        value = f"`{_cell(metavar)}`" if metavar else ""
        lines.append(f"| `{flags}` | {value} | {ini} | {_cell(text)} |")
    return "\n".join(lines)


def markers_table() -> str:
    lines = ["| marker | what |", "|---|---|"]
    for name, text in options.MARKERS.items():
        lines.append(f"| `{name}` | {_cell(text)} |")
    return "\n".join(lines)


def _budget_cell(metric: Metric) -> str:
    return f"yes ({', '.join(metric.recorded_by)})" if metric.budget else "no"


def metrics_table() -> str:
    lines = [
        "| metric | JUnit suffix | unit | better | budget (recorded by) | gate | what |",
        "|---|---|---|---|---|---|---|",
    ]
    for metric in METRICS.values():
        gate = metric.gate.value if metric.gated else f"no: {metric.not_gated}"
        lines.append(
            f"| `{metric.name}` | `{metric.property_suffix}` | {_cell(metric.unit.name)} | "
            f"{'higher' if metric.higher_is_better else 'lower'} | "
            f"{_budget_cell(metric)} | {_cell(gate)} | {_cell(metric.description)} |"
        )
    return "\n".join(lines)


def commands_table() -> str:
    """The package's console scripts, each with its module docstring's first line."""
    scripts = [
        entry
        for entry in distribution("pytest-tfgrpc").entry_points
        if entry.group == "console_scripts"
    ]
    lines = ["| command | what |", "|---|---|"]
    for entry in sorted(scripts, key=lambda e: e.name):
        module = importlib.import_module(entry.value.split(":")[0])
        first = (module.__doc__ or "").strip().split("\n\n")[0]
        lines.append(f"| `{entry.name}` | {_cell(first)} |")
    return "\n".join(lines)


TABLES = {
    "options": options_table,
    "markers": markers_table,
    "metrics": metrics_table,
    "commands": commands_table,
}


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    for name, make in TABLES.items():
        marker = f"<!-- tfgrpc:{name} -->"
        if marker in markdown:
            markdown = markdown.replace(marker, make())
    return markdown
