"""``dgrpo.local.backend``: where ``from art.local(.backend) import LocalBackend`` points, with ART 0.5's
``backend.train`` on top of the embedded stack's backend (dgrpo/local/stack.py).

with LocalBackend() as backend:            # or ``async with``
    await model.register(backend)
    result = await backend.train(model, groups, learning_rate=1e-5)
    await model.log(groups, metrics=result.metrics, step=result.step, split="train")
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from dgrpo.art_config import train_config_fields
from dgrpo.errors import NotRegisteredError
from dgrpo.local import stack
from dgrpo.metrics import group_metrics, train_result_metrics
from dgrpo.trainable_model import TrainableModel
from dgrpo.types import LocalTrainResult
from schemas.trajectory import TrajectoryGroup


class LocalBackend(stack.LocalBackend):
    """``dgrpo.LocalBackend`` with ART's ``train(model, groups, ...)`` and a plain ``with`` block."""

    async def train(
        self,
        model: TrainableModel,
        trajectory_groups: Iterable[TrajectoryGroup],
        *,
        learning_rate: float = 5e-6,
        beta: float = 0.0,
        epsilon: float | None = None,
        epsilon_high: float | None = None,
        scale_rewards: bool = True,
        **art_options: Any,
    ) -> LocalTrainResult:
        """Train one GRPO step (a durable ``TrainStep``) and return the new step and its metrics.

        As in ART 0.5 it logs nothing itself beyond the step's record; ``art_options`` are ART's other
        keywords, accepted at ART's defaults and refused (with the reason) where dgrpo has no equivalent.
        """
        if model.backend() is not self:
            raise NotRegisteredError(
                f"model {model.name!r} is registered with another backend; train it there, or register it here"
            )
        options = {
            "learning_rate": learning_rate,
            "beta": beta,
            "epsilon": epsilon,
            "epsilon_high": epsilon_high,
            "scale_rewards": scale_rewards,
            **art_options,
        }
        config = model.step_config(None, train_config_fields("backend.train", options))
        groups = list(trajectory_groups)
        result = await model.train(groups, config)
        data = {k: v for k, v in group_metrics(groups, "train").items() if k.startswith("data/")}
        metrics = {**data, **train_result_metrics(result)}
        return LocalTrainResult(step=result.step, metrics=metrics, checkpoint_path=result.checkpoint.uri)

    def __enter__(self) -> LocalBackend:
        return self  # started by the first ``register``

    def __exit__(self, *exc: object) -> None:
        self.close_sync()


__all__ = ["LocalBackend", "LocalTrainResult"]
