"""Models of training traffic: architectures and profiles, PS placement, the analytic model.

Layer: beside ``tuning``, ``native`` and ``wire`` (none imports another); may import only
``results``, ``stats`` and ``units``.
"""

from typing import TYPE_CHECKING

from pytest_tfgrpc._compat import forwarding_getattr

if not TYPE_CHECKING:  # the old module pytest_tfgrpc.model's names, deprecated
    __getattr__ = forwarding_getattr(__name__)
