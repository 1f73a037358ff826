"""ART's ``art.utils.retry`` module path: the ``retry`` decorator (dgrpo/retries.py)."""

from __future__ import annotations

from dgrpo.retries import retry

__all__ = ["retry"]
