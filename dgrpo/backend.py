"""ART's ``art.backend`` module path: ``Backend``, what a model needs from where it trains
(dgrpo/client/backends.py; ART's ``_get_step``/``_train_sft`` seam included)."""

from __future__ import annotations

from dgrpo.client.backends import Backend

__all__ = ["Backend"]
