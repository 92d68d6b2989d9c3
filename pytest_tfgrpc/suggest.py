"""Suggestions ("did you mean ...?") for a name the user gave that is none of the known ones:
one rule for every error that names an unknown metric, marker, marker argument, engine or
option value.

Layer: the bottom; imports nothing of the package.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["closest", "did_you_mean"]


def closest(name: str, known: Iterable[str], cutoff: float = 0.6) -> str | None:
    """The known name ``name`` most likely meant, or None: the same name in another case
    (``GRPCIO`` for ``grpcio``), else the one known name that is ``name`` with a word
    added or dropped before or after an underscore (``p50`` for ``step_p50``), else the closest by
    :func:`difflib.get_close_matches` (case folded, at least ``cutoff`` alike), else None.
    An empty name suggests nothing."""
    names = list(dict.fromkeys(known))
    folded = name.strip().casefold()
    if not folded:
        return None
    by_fold = {n.casefold(): n for n in names}
    if folded in by_fold and by_fold[folded] != name:
        return by_fold[folded]
    affixed = [
        n
        for f, n in by_fold.items()
        if any(a.endswith(f"_{b}") or a.startswith(f"{b}_") for a, b in ((f, folded), (folded, f)))
    ]
    if len(affixed) == 1:
        return affixed[0]
    close = difflib.get_close_matches(folded, list(by_fold), n=1, cutoff=cutoff)
    return by_fold[close[0]] if close and by_fold[close[0]] != name else None


def did_you_mean(name: str, known: Iterable[str], cutoff: float = 0.6) -> str:
    """``"; did you mean 'x'?"`` for :func:`closest`'s answer, or ``""`` when there is none:
    appended to a message that already says ``name`` is unknown."""
    close = closest(name, known, cutoff)
    return f"; did you mean {close!r}?" if close else ""
