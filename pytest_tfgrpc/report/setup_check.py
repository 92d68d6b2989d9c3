"""Setup mismatches: how a run's setup (host, libraries, fabrics) differs from its baseline's.

A baseline from another host, fabric, MTU or grpcio version is not a like-for-like comparison;
the gate and ``tfgrpc-compare`` report what differs, and their policy decides what it costs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from pytest_tfgrpc.report.junit import Baseline
from pytest_tfgrpc.report.metadata import EXTRA

__all__ = ["META_CHECKED", "Mismatch", "SetupSplit", "check_metadata", "split_by_setup"]

#: Run metadata (``tfgrpc.meta.<key>``) that must agree between baseline and current run;
#: ``fabric.<name>.<attribute>`` keys are checked too for every fabric both runs used.
META_CHECKED = (
    "host", "kernel", "cpu_model", "cpus", "cpus_usable", "python", "plugin", "grpcio",
    "protobuf", "numpy", "allocator", "cpu_placement", "server_delay",
)  # fmt: skip
#: Metadata key prefixes checked wherever either run records them: the allocator's settings.
META_CHECKED_PREFIXES = ("env.MALLOC_", "mallopt.")


@dataclass(frozen=True)
class Mismatch:
    """Something that differs between the baseline's setup and the current run's."""

    what: str
    baseline: str
    current: str

    def describe(self) -> str:
        return f"{self.what}: baseline {self.baseline}, current {self.current}"


_NOT_RECORDED = "(not recorded)"


def check_metadata(
    baseline: Baseline, meta: Mapping[str, str], fabrics: Iterable[str]
) -> tuple[Mismatch, ...]:
    """How the current run's setup (``meta`` as in :attr:`Baseline.meta`, and the fabrics it
    measured on) differs from the baseline's: a fabric the baseline never measured, and any of
    :data:`META_CHECKED`, the allocator's settings (:data:`META_CHECKED_PREFIXES`),
    ``fabric.<name>.*`` (MTU, speed, IPoIB mode) or ``extra.*`` (added by
    ``pytest_tfgrpc_run_metadata`` hooks) that differs or is recorded by one run only. A baseline
    without metadata is itself a mismatch (only its host, from pytest's ``hostname``, can then be
    checked): nothing says it comes from the same setup. The caller decides what a mismatch
    costs."""
    out = []
    fabrics = frozenset(fabrics)
    for fabric in sorted(fabrics - baseline.fabrics):
        known = ", ".join(sorted(baseline.fabrics)) or "none"
        out.append(Mismatch("fabric", f"measured on {known}", f"measures on {fabric}"))
    old_setup = baseline.setup()
    keys = {"host"}
    if baseline.meta:
        keys.update(META_CHECKED)
        # Match by known names: a fabric name may hold dots itself (IPoIB child ib0.8001).
        prefixes = tuple(f"fabric.{name}." for name in fabrics & baseline.fabrics)
        # The allocator's settings, and what pytest_tfgrpc_run_metadata hooks added.
        prefixes += (*META_CHECKED_PREFIXES, EXTRA)
        keys.update(key for key in old_setup.keys() | meta.keys() if key.startswith(prefixes))
    else:
        recorded = "recorded" if set(meta) - {"host"} else _NOT_RECORDED
        out.append(Mismatch("run metadata", _NOT_RECORDED, recorded))
    for key in sorted(keys):
        old, new = old_setup.get(key), meta.get(key)
        if old != new:
            out.append(Mismatch(key, old or _NOT_RECORDED, new or _NOT_RECORDED))
    return tuple(out)


#: Mismatches that do not make a run's setup another one: a fabric a run did not measure, and
#: no metadata at all (then only the host can tell).
_NOT_A_SETUP = ("fabric", "run metadata")


def _differences(run: Baseline, meta: Mapping[str, str], fabrics: Iterable[str]) -> list[str]:
    return [m.describe() for m in check_metadata(run, meta, fabrics) if m.what not in _NOT_A_SETUP]


@dataclass(frozen=True)
class SetupSplit:
    """A history split by setup: ``runs`` (oldest first) share one setup, this run's when
    any does, else the most recent run's; ``note`` says what was left out and why ("" when
    nothing was)."""

    runs: tuple[Baseline, ...]
    note: str


def split_by_setup(
    history: Sequence[Baseline], meta: Mapping[str, str], fabrics: Iterable[str]
) -> SetupSplit:
    """The runs of ``history`` to compare the current run (its ``meta`` and ``fabrics``, as
    for :func:`check_metadata`) with: those whose setup (every key :func:`check_metadata`
    checks, ``extra.*`` from ``pytest_tfgrpc_run_metadata`` hooks included) is the current
    run's, never pooled with runs of another setup, whose spread would hide a regression.
    When no run shares the current setup, the runs of the most recent run's setup (the caller
    reports the mismatch). Raises ValueError for an empty history."""
    if not history:
        raise ValueError("no baseline run to split by setup")
    fabrics = frozenset(fabrics)
    own = tuple(run for run in history if not _differences(run, meta, fabrics))
    whose = "this run's"
    reference: tuple[Mapping[str, str], frozenset[str]] = (meta, fabrics)
    if not own:
        latest = history[-1]
        reference = (latest.setup(), latest.fabrics)
        own = tuple(run for run in history if not _differences(run, *reference))
        whose = "the most recent baseline run's"
    if len(own) == len(history):
        return SetupSplit(tuple(history), "")
    left = [run for run in history if all(run is not kept for kept in own)]
    why = sorted({d for run in left for d in _differences(run, *reference)})
    shown = "; ".join(why[:4]) + (f"; {len(why) - 4} more" if len(why) > 4 else "")
    return SetupSplit(
        own,
        f"baseline history split by setup: comparing with the {len(own)} of {len(history)} "
        f"runs of {whose} setup, not pooling the {len(left)} of another ({shown})",
    )
