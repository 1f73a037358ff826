"""ART's ``art.utils.deployment``: its configuration and result types, so ART's programs import; deploying is
refused when called (``deploy_model``, ``deploy_wandb``), saying what to do instead.

ART uploads a local checkpoint directory to a hosted inference service (Together, W&B). dgrpo serves every
step itself (``model.get_inference_name(step)``), and ``await backend._experimental_pull_model_checkpoint(model,
step=N, local_path=...)`` gives the PEFT adapter directory to upload with the provider's own tools.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal, NoReturn

from pydantic import BaseModel

from dgrpo.errors import UnsupportedArtFeature

Provider = Literal["together", "wandb"]

WHY = (
    "deploying a checkpoint to a hosted inference service (Together, W&B) is not supported: dgrpo's server "
    "serves every step as `<name>@<step>` (model.get_inference_name(step)); for a provider of your own, "
    "`path = await backend._experimental_pull_model_checkpoint(model, step=N, local_path=...)` gives the PEFT "
    "adapter directory to upload with its tools"
)


class DeploymentConfig(BaseModel):
    """ART's base of the providers' deployment settings."""


class DeploymentResult(BaseModel):
    """ART's deployment result: the name to ask the provider's endpoint for."""

    inference_model_name: str


class TogetherDeploymentConfig(DeploymentConfig):
    """ART's Together settings (the bucket its upload goes through, and whether to wait)."""

    s3_bucket: str | None = None
    prefix: str | None = None
    wait_for_completion: bool = True


class WandbDeploymentConfig(DeploymentConfig):
    """ART's W&B settings: the training provenance recorded with the artifact."""

    provenance: list[str]


class LoRADeploymentProvider(StrEnum):
    """ART's older name for a provider."""

    TOGETHER = "together"
    WANDB = "wandb"


class LoRADeploymentJob(BaseModel):
    """ART's older deployment result."""

    status: str
    job_id: str
    model_name: str
    failure_reason: str | None


async def deploy_model(
    model: Any,
    checkpoint_path: str,
    step: int,
    provider: Provider,
    config: DeploymentConfig | None = None,
    verbose: bool = False,
) -> NoReturn:
    """Refused: ``UnsupportedArtFeature`` saying what to use instead."""
    raise UnsupportedArtFeature(f"deploy_model(provider={provider!r}): {WHY}")


def deploy_wandb(
    model: Any,
    checkpoint_path: str,
    step: int,
    config: WandbDeploymentConfig | None = None,
    verbose: bool = False,
) -> NoReturn:
    """Refused: ``UnsupportedArtFeature`` saying what to use instead."""
    raise UnsupportedArtFeature(f"deploy_wandb: {WHY}")


__all__ = [
    "DeploymentConfig",
    "DeploymentResult",
    "LoRADeploymentJob",
    "LoRADeploymentProvider",
    "Provider",
    "TogetherDeploymentConfig",
    "WandbDeploymentConfig",
    "deploy_model",
    "deploy_wandb",
]
