"""ART's ``art.utils.get_model_step``: a model's newest step read from its local checkpoint directories.
dgrpo keeps checkpoints in the object store, so counting local directories would always answer 0: both
functions are refused, pointing at ``await model.get_step()``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dgrpo.art_compat.refusals import CHECKPOINTS_IN_STORE
from dgrpo.errors import UnsupportedArtFeature

if TYPE_CHECKING:
    from dgrpo.model import Model


def get_step_from_dir(output_dir: str) -> int:
    """Refused: see the module's docstring."""
    raise UnsupportedArtFeature(f"art.utils.get_model_step.get_step_from_dir: {CHECKPOINTS_IN_STORE}")


def get_model_step(model: Model, art_path: str) -> int:
    """Refused: see the module's docstring."""
    raise UnsupportedArtFeature(f"art.utils.get_model_step.get_model_step: {CHECKPOINTS_IN_STORE}")
