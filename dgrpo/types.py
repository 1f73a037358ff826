"""ART's ``art.types``: the message type aliases, ``TrainConfig``, and what ``backend.train`` returns.

``from art.types import Messages, TrainConfig`` becomes ``from dgrpo.types import Messages, TrainConfig``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Literal

from openai.types.chat.chat_completion import Choice as OpenAIChoice
from openai.types.chat.chat_completion_message_param import ChatCompletionMessageParam
from openai.types.chat.chat_completion_tool_param import ChatCompletionToolParam
from pydantic import BaseModel, Field, model_validator

from dgrpo.art_compat.defaults import ART_0523_FIELDS, ART_PPO_CLIP, ART_TRAIN
from dgrpo.errors import UnsupportedArtOption
from schemas import config

Message = ChatCompletionMessageParam
"""One chat message (context), as the openai SDK types it."""
MessageOrChoice = Message | OpenAIChoice
Messages = list[Message]
"""What ``trajectory.messages()`` returns and ``chat.completions.create(messages=...)`` takes."""
MessagesAndChoices = list[MessageOrChoice]
"""A trajectory's turns: messages (context) and the policy's sampled choices (trainable)."""
Tools = list[ChatCompletionToolParam]
"""OpenAI tool definitions."""


def _art_default(name: str) -> Any:
    """dgrpo's ``TrainConfig`` field ``name`` (its bounds and doc) with ART's default (dgrpo/art_compat/defaults.py)."""
    info = copy.copy(config.TrainConfig.model_fields[name])
    info.default = ART_TRAIN[name]
    return info


class TrainConfig(config.TrainConfig):
    """ART's ``art.TrainConfig``: dgrpo's per-step ``TrainConfig`` with ART's defaults (an ART program trains as it
    did on ART: CISPO, learning rate 5e-6, gradients clipped at 0.1, weight decay 0.1, Adam's beta2 0.99, 8-bit
    paged AdamW on CUDA; dgrpo/art_compat/defaults.py), ART's ``beta`` (the KL coefficient, ``kl_coef`` here),
    and ART 0.5.23's fields: ``kl_penalty_coef`` above 0 and ``grad_accumulation_sequences`` are refused when the
    step is trained (``for_step``), the others change nothing here. A ``RunSpec``'s ``TrainConfig`` keeps
    dgrpo's defaults."""

    learning_rate: float = _art_default("learning_rate")
    importance_sampling: Literal["ppo_clip", "cispo"] = _art_default("importance_sampling")
    epsilon: float = _art_default("epsilon")
    epsilon_high: float | None = _art_default("epsilon_high")
    max_grad_norm: float = _art_default("max_grad_norm")
    weight_decay: float = _art_default("weight_decay")
    optimizer: Literal["adamw", "paged_adamw_8bit"] = _art_default("optimizer")
    adam_beta1: float = _art_default("adam_beta1")
    adam_beta2: float = _art_default("adam_beta2")
    adam_epsilon: float = _art_default("adam_epsilon")
    length_weighting: bool = _art_default("length_weighting")
    max_seq_len: int = _art_default("max_seq_len")

    kl_penalty_coef: float = Field(0.0, ge=0, le=1000)
    """ART 0.5.23's KL-penalized advantage (each token's advantage shifted by its KL to the base model, centred);
    above 0 refused: dgrpo's KL term is ``beta``, a penalty in the loss."""
    kl_penalty_source: Literal["current_learner", "sample"] = "current_learner"
    """Whose logprobs ART's KL penalty compares: it matters only with ``kl_penalty_coef`` above 0."""
    grad_accumulation_sequences: int | None = Field(None, ge=1)
    """ART 0.5.23's sequences per optimizer step; a number refused: dgrpo takes one step per ``epochs`` over
    the step's whole batch."""
    optimizer_save_interval: int = Field(5, ge=1)
    """How often ART saves the optimizer state; any value is met: every dgrpo checkpoint carries it."""
    final_training_step: int | None = Field(None, ge=1)
    """The step after which ART saves the optimizer state regardless; met as ``optimizer_save_interval``."""

    @model_validator(mode="before")
    @classmethod
    def _art_beta_and_ppo_clip(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if "beta" in data:
            beta = data.pop("beta")
            if "kl_coef" in data and data["kl_coef"] != beta:
                raise ValueError(
                    f"TrainConfig got beta={beta} and kl_coef={data['kl_coef']}: they are the same setting "
                    "(ART calls it beta); pass one"
                )
            data["kl_coef"] = beta
        if data.get("importance_sampling") == "ppo_clip":  # ART's PPO clip, unless given
            data = {**ART_PPO_CLIP, **data}
        return data

    def for_step(self) -> config.TrainConfig:
        """The ``TrainConfig`` the step's workflow trains with; ART 0.5.23's fields that would train otherwise
        than dgrpo can are refused, saying why."""
        if self.kl_penalty_coef > 0:
            raise UnsupportedArtOption(
                f"TrainConfig(kl_penalty_coef={self.kl_penalty_coef}) is not supported: ART's KL-penalized "
                "advantage needs the base model's logprobs of the whole step before it trains; dgrpo's KL term "
                "is a penalty in the loss, TrainConfig(beta=...). Remove it (docs/art-compat.md)"
            )
        if self.grad_accumulation_sequences is not None:
            raise UnsupportedArtOption(
                f"TrainConfig(grad_accumulation_sequences={self.grad_accumulation_sequences}) is not supported: "
                "dgrpo takes one optimizer step per TrainConfig.epochs over the step's whole batch "
                "(micro_batch_size only splits it for memory). Remove it (docs/art-compat.md)"
            )
        return config.TrainConfig.model_validate(self.model_dump(exclude=set(ART_0523_FIELDS)))


class TrainSFTConfig(BaseModel):
    """ART's ``art.TrainSFTConfig``: the learning rate (one, or one per batch) and the examples per batch."""

    learning_rate: float | list[float] = 5e-5
    """One learning rate for every batch, or a list with one per batch (ART's schedules)."""
    batch_size: int | Literal["auto"] = Field("auto")
    """Examples per optimizer step; ``"auto"`` is 2, as in ART's local backend."""
    assistant_turns: Literal["all", "last"] = "all"
    """The targets: every assistant turn, or only each chat's last, which must end it (ART 0.5.23's)."""
    megatron_topology: Any = None
    """ART's Megatron layout; refused unless None (dgrpo trains with torch + peft)."""


@dataclass
class TrainResult:
    """What ``backend.train`` returns, as in ART 0.5: the new step and the step's training metrics."""

    step: int
    """The model's step once this call finished (its new adapter is served)."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Training metrics of the step (``loss``, ...), ready for ``model.log(..., metrics=...)``."""


@dataclass
class LocalTrainResult(TrainResult):
    """``LocalBackend.train``'s result: also where the step's checkpoint was published."""

    checkpoint_path: str | None = None
    """The checkpoint's URI in the object store (``s3://.../checkpoints/<step>/``)."""


__all__ = [
    "LocalTrainResult",
    "Message",
    "MessageOrChoice",
    "Messages",
    "MessagesAndChoices",
    "Tools",
    "TrainConfig",
    "TrainResult",
    "TrainSFTConfig",
]
