"""ART's ``record_provenance``: a note on the W&B artifact of a model's newest LoRA adapter. dgrpo uploads no
adapter artifacts to W&B (each step's adapter is in the object store), so there is nothing to annotate: it is
refused saying so."""

from __future__ import annotations

from typing import Any

from dgrpo.art_compat.refusals import DEPLOY
from dgrpo.errors import UnsupportedArtFeature


def record_provenance(run: Any, provenance: str) -> None:
    """Refused: see the module's docstring."""
    raise UnsupportedArtFeature(
        f"art.utils.record_provenance: dgrpo uploads no LoRA artifacts to W&B; {DEPLOY}"
    )
