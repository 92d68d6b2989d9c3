"""Figures after the run: the record of each test (``record``: the ``tfgrpc.*`` JUnit namespace,
written and read there only), budgets, the baseline gate and its verdicts, run metadata, the
results file, history, and the views that render records (summary, HTML, plots).

Layer: beside ``hosts`` and ``ps`` (none imports another), below ``cli`` and ``bench``; may
import ``roles``, ``tuning``, ``native``, ``model``, ``wire``, ``results``, ``metrics``,
``stats``, ``units``.
"""
