"""``PipelineTrainer``'s keywords as ART 0.5.23 takes them, resolved: the batch sizes from ``pipeline=`` or the
deprecated direct keywords (never both), ``autotune=`` (off only), and 0.5.23's training keywords, each
honoured, accepted where it changes nothing here, or refused saying why.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from typing import Any

from dgrpo.errors import UnsupportedArtOption
from dgrpo.pipeline_tuner.config import PipelineAutotuneConfig, PipelineRuntimeConfig

log = logging.getLogger(__name__)

SIZES = ("num_rollout_workers", "min_batch_size", "max_batch_size", "queue_maxsize")
"""The sizes ``PipelineRuntimeConfig`` holds, also ``PipelineTrainer`` keywords (deprecated in ART 0.5.23)."""

ACCEPTED_AS_NONE = ("grad_accumulation_sequences", "adam_params", "loss_fn_config", "rollout_executor")
"""0.5.23 keywords that change what is trained (or where rollouts run) unless None, their default."""


@dataclass(frozen=True)
class PipelineSizes:
    num_rollout_workers: int
    min_batch_size: int
    max_batch_size: int | None
    queue_maxsize: int | None


def pipeline_sizes(
    pipeline: PipelineRuntimeConfig | None, autotune: PipelineAutotuneConfig | None, direct: dict[str, Any]
) -> PipelineSizes:
    """The batch sizes: ``pipeline``'s, or the direct keywords given (with ART's ``DeprecationWarning``), or
    ART's defaults."""
    given = {k: v for k, v in direct.items() if v is not None}
    if autotune is not None and autotune.mode != "off":
        raise UnsupportedArtOption(
            f"autotune=PipelineAutotuneConfig(mode={autotune.mode!r}): ART's autotuner changes the batch sizes "
            "(what each step trains on) while the run goes, and dgrpo has none; give the sizes with "
            "pipeline=PipelineRuntimeConfig(...) and leave autotune off"
        )
    if pipeline is not None and given:
        raise ValueError(
            "Use either pipeline=PipelineRuntimeConfig(...) or the deprecated direct pipeline settings "
            f"({', '.join(sorted(given))}), not both."
        )
    if given:
        warnings.warn(
            f"PipelineTrainer({'=..., '.join(sorted(given))}=...) is deprecated in ART 0.5.23: pass "
            "pipeline=PipelineRuntimeConfig(...)",
            DeprecationWarning,
            stacklevel=3,
        )
    config = pipeline or PipelineRuntimeConfig(**given)
    return PipelineSizes(**{k: getattr(config, k) for k in SIZES})


def check_training_options(
    *,
    kl_penalty_coef: float,
    kl_penalty_step_lag: int | None,
    optimizer_save_interval: int,
    limit_mean_steps_off_policy: float | None,
    **as_none: Any,
) -> None:
    """ART 0.5.23's checks of its new keywords, and dgrpo's refusals of what it cannot train as asked."""
    if limit_mean_steps_off_policy is not None and limit_mean_steps_off_policy < 0:
        raise ValueError("limit_mean_steps_off_policy must be >= 0")
    if optimizer_save_interval <= 0:
        raise ValueError("optimizer_save_interval must be > 0")
    if kl_penalty_step_lag is not None and kl_penalty_step_lag < 1:
        raise ValueError("kl_penalty_step_lag must be >= 1")
    if kl_penalty_coef != 0.0:
        raise UnsupportedArtOption(
            f"kl_penalty_coef={kl_penalty_coef}: dgrpo's GRPO loss has no KL penalty against a reference "
            "checkpoint; leave it 0 (kl_penalty_step_lag then changes nothing)"
        )
    for name, value in as_none.items():
        if name not in ACCEPTED_AS_NONE:
            raise TypeError(f"PipelineTrainer got an unexpected keyword argument {name!r}")
        if value is not None:
            raise UnsupportedArtOption(
                f"PipelineTrainer({name}=...): it changes how ART's own trainer steps (or where its rollouts run) "
                "and has no equivalent in dgrpo's; leave it None"
            )
