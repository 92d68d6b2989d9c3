"""Figures after the run: the metric registry, JUnit properties, budgets, the baseline gate and
its verdicts, run metadata, the results file, history, and the views (summary, HTML, plots).

Layer: beside ``hosts`` and ``ps`` (none imports another), below ``cli`` and ``bench``; may
import ``roles``, ``tuning``, ``native``, ``model``, ``wire``, ``results``, ``stats``, ``units``.
"""
