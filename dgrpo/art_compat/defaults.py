"""ART's training defaults, which an ART program (``import dgrpo as art``) trains with where it sets nothing: each
read from the ART 0.5.23 wheel (ART 0.5.17's are the same unless said). A ``RunSpec`` (the temporal CLI,
``dgrpo train``) keeps dgrpo's own defaults (schemas/config.py); docs/art-examples.md shows both.

Where they come from in ART:

- the loss: ``LocalBackend.train(loss_fn="cispo")``, and ``model.train``'s empty ``_config`` (``ppo`` False);
  CISPO's clip ``epsilon=1.0``, ``epsilon_high=4.0``, PPO's ``0.2`` and ``epsilon`` (``art/loss.py``);
- the learning rate: ``TrainConfig.learning_rate`` and ``backend.train(learning_rate=)``, 5e-6;
- the LoRA: ``r=8``, ``lora_alpha=16`` (``art/unsloth/service.py``; 0.5.17's ``get_model_config``), dropout 0
  (Unsloth's), the target modules per architecture (``art/megatron/model_support/registry.py``): for every dense
  architecture dgrpo trains (llama, mistral, qwen2, qwen3) the seven attention and MLP projections, which is
  dgrpo's ``all-linear`` (activities/lora_targets.py);
- the optimizer: ``trainer_args`` of ``get_model_config``: ``optim="paged_adamw_8bit"``, ``adam_beta1=0.9``,
  ``adam_beta2=0.99``, ``max_grad_norm=0.1``, ``lr_scheduler_type="constant"`` (a step's rate is constant here
  too), ``weight_decay=0.1`` (which the RL step sets again on every call, ``art/unsloth/train.py``), Adam's
  epsilon Hugging Face's 1e-8;
- the weighting: each trajectory's tokens weigh ``1 / its trainable tokens`` (``art/preprocessing/tokenize.py``):
  every trajectory counts equally, dgrpo's ``length_weighting``;
- the longest sequence: 0.5.17's ``max_seq_length=32768`` (0.5.23 reads the base model's context length, which
  a client does not have); dgrpo drops a longer sequence, as it always does, rather than truncating it.
"""

from __future__ import annotations

from typing import Any

from schemas.config import LoraConfig

ART_LORA = LoraConfig(rank=8, alpha=16.0, dropout=0.0, target_modules="all-linear")
"""An ART program's LoRA where it gives none; a partial ``lora_config`` or ``peft_args`` fills the rest from it."""

ART_TRAIN: dict[str, Any] = {
    "learning_rate": 5e-6,
    "importance_sampling": "cispo",
    "epsilon": 1.0,
    "epsilon_high": 4.0,
    "max_grad_norm": 0.1,
    "weight_decay": 0.1,
    "optimizer": "paged_adamw_8bit",
    "adam_beta1": 0.9,
    "adam_beta2": 0.99,
    "adam_epsilon": 1e-8,
    "length_weighting": True,
    "max_seq_len": 32768,
}
"""An ART program's ``TrainConfig`` fields where neither it nor its model's ``_internal_config`` sets them."""

ART_PPO_CLIP: dict[str, Any] = {"epsilon": 0.2, "epsilon_high": None}
"""The clip ART's PPO loss (``loss_fn="ppo"``) has where the program sets none."""

ART_0523_FIELDS = (
    "kl_penalty_coef",
    "kl_penalty_source",
    "grad_accumulation_sequences",
    "optimizer_save_interval",
    "final_training_step",
)
"""ART 0.5.23's ``TrainConfig`` fields, which ``art.TrainConfig`` takes (a real ART client sends them all)."""
