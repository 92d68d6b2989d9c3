"""report."""

from typing import TYPE_CHECKING

from pytest_tfgrpc._compat import forwarding_getattr

if not TYPE_CHECKING:  # the old module pytest_tfgrpc.report's names, deprecated
    __getattr__ = forwarding_getattr(__name__)
