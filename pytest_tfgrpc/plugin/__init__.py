"""pytest glue (the ``pytest11`` entry point ``tfgrpc``): options, markers, fixtures, hooks.
It decides and registers; the work is done by modules that do not import pytest.

Cheap until used: this module and the ones it names import neither grpc nor numpy and set
nothing up; ``activation`` wakes the rest when the run first uses the plugin.

- ``options``: command-line options, ini twins, markers
- ``engines``: the hook specifications (``hookspecs``), the plugin's engines (grpcio, native,
  tensorflow, registered through the hooks like any other), a test's engines and its server's
- ``activation``: when the plugin wakes up (a tfgrpc option, fixture or marker)
- ``session``: the run's state (fabrics, allocator, metadata, gate) and per-test hooks
- ``markers``: a test's markers read into specs
- ``fixtures``: ``fabric``, ``tfgrpc_engine``, ``tfgrpc_streams``, ``tensor_server``,
  ``ps_cluster``, ``tfgrpc``
- ``streams``: a test's default stream count (``tfgrpc_streams``, ``--tfgrpc-streams``)
- ``summary``: the summary table, results file, plots and baseline verdicts
- ``agents``: node agents, cluster specs and honest paths (used by the fixtures and the
  session once awake; their options are in ``options``)
- ``emulated``: the ``tfgrpc_emulated_hosts`` fixture (emulated hosts with agents)

Layer: the top; may import every layer below it, and is the only package that imports pytest.
"""

from __future__ import annotations

pytest_plugins = (
    "pytest_tfgrpc.plugin.options",
    "pytest_tfgrpc.plugin.engines",
    "pytest_tfgrpc.plugin.activation",
    "pytest_tfgrpc.plugin.fixtures",
    "pytest_tfgrpc.plugin.emulated",
)
