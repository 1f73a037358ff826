"""ART's ``art.types``: the message type aliases, ``TrainConfig``, and what ``backend.train`` returns.

``from art.types import Messages, TrainConfig`` becomes ``from dgrpo.types import Messages, TrainConfig``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from openai.types.chat.chat_completion import Choice as OpenAIChoice
from openai.types.chat.chat_completion_message_param import ChatCompletionMessageParam
from openai.types.chat.chat_completion_tool_param import ChatCompletionToolParam
from pydantic import BaseModel, Field, model_validator

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


class TrainConfig(config.TrainConfig):
    """dgrpo's per-step ``TrainConfig``, also taking ART's ``beta`` (the KL coefficient, ``kl_coef`` here)."""

    @model_validator(mode="before")
    @classmethod
    def _art_beta(cls, data: Any) -> Any:
        if not isinstance(data, dict) or "beta" not in data:
            return data
        data = dict(data)
        beta = data.pop("beta")
        if "kl_coef" in data and data["kl_coef"] != beta:
            raise ValueError(
                f"TrainConfig got beta={beta} and kl_coef={data['kl_coef']}: they are the same setting "
                "(ART calls it beta); pass one"
            )
        data["kl_coef"] = beta
        return data


class TrainSFTConfig(BaseModel):
    """ART's ``art.TrainSFTConfig``: the learning rate (one, or one per batch) and the examples per batch."""

    learning_rate: float | list[float] = 5e-5
    """One learning rate for every batch, or a list with one per batch (ART's schedules)."""
    batch_size: int | Literal["auto"] = Field("auto")
    """Examples per optimizer step; ``"auto"`` is 2, as in ART's local backend."""
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
