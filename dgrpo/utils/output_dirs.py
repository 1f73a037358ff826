"""ART's ``art.utils.output_dirs``: where a model's local files are, ``<art path>/<project>/models/<name>/``.

dgrpo's ``Model`` writes ART's local files of ``model.log`` there (dgrpo/model_log/local_files.py; its ``base_path`` is
the art path, ``.art`` unless given). Checkpoints are not local files here, so ``get_step_checkpoint_dir`` is
refused saying where they are.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dgrpo.art_compat.refusals import CHECKPOINTS_IN_STORE
from dgrpo.errors import UnsupportedArtFeature
from schemas import layout

if TYPE_CHECKING:
    from dgrpo.model import Model


def get_default_art_path() -> str:
    """``.art``, in the working directory: a model's default ``base_path`` (ART: ``.art`` in its checkout's root,
    the working directory for an installed ART)."""
    return layout.ART_BASE_PATH


def get_models_dir(project_name: str, art_path: str | None = None) -> str:
    """``<art path>/<project>/models``."""
    return str(layout.art_models_dir(art_path or get_default_art_path(), project_name))


def get_output_dir_from_model_properties(project: str, name: str, art_path: str | None = None) -> str:
    """``<art path>/<project>/models/<name>``: the model's local files (``history.jsonl``, ``trajectories/``)."""
    return str(layout.art_model_dir(art_path or get_default_art_path(), project, name))


def get_model_dir(model: Model, art_path: str | None = None) -> str:
    """``get_output_dir_from_model_properties`` of the model's project and name."""
    return get_output_dir_from_model_properties(model.project, model.name, art_path)


def get_trajectories_dir(model_output_dir: str) -> str:
    """Where ``model.log`` writes each call's trajectories, ``<split>/<step:04d>.parquet``."""
    return str(layout.art_trajectories_dir(model_output_dir))


def get_trajectories_split_dir(model_output_dir: str, split: str) -> str:
    return str(layout.art_trajectories_dir(model_output_dir) / split)


def get_step_checkpoint_dir(model_output_dir: str, step: int) -> str:
    """Refused: a step's checkpoint is in the object store, not under the model's directory."""
    raise UnsupportedArtFeature(f"art.utils.output_dirs.get_step_checkpoint_dir: {CHECKPOINTS_IN_STORE}")
