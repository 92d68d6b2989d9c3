"""Statistics of samples: summaries and percentiles, sketches, significance and replicate tests.

Layer: the bottom, beside ``units`` (neither imports the other); imports nothing of the package
(but ``_compat``, which is outside the layers).
"""

from typing import TYPE_CHECKING

from pytest_tfgrpc._compat import forwarding_getattr

if not TYPE_CHECKING:  # the old module pytest_tfgrpc.stats's names, deprecated
    __getattr__ = forwarding_getattr(__name__)
