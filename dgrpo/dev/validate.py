"""ART's ``art.dev.validate``: the check of a model configuration's dedicated-mode keys, as ``register``
makes it here. dgrpo always trains and serves in separate workers; which GPUs each uses is its operator's
(``CUDA_VISIBLE_DEVICES``), so GPU ids on a model are refused with that reason rather than validated."""

from __future__ import annotations

from dgrpo.art_compat.options import GPU_IDS, given_sections, lora_from_internal_config, refuse_gpu_ids
from dgrpo.dev.model import InternalModelConfig


def is_dedicated_mode(config: InternalModelConfig) -> bool:
    """ART's: the configuration names both ``trainer_gpu_ids`` and ``inference_gpu_ids``."""
    return all(key in given_sections(config) for key in GPU_IDS)


def validate_dedicated_config(config: InternalModelConfig) -> None:
    """What ``register`` checks of a model's ``_internal_config``: every key maps to dgrpo's (or is refused
    with ``UnsupportedArtOption`` saying why), and GPU ids are refused: the workers' operator places GPUs."""
    lora_from_internal_config(config)
    refuse_gpu_ids(config)
