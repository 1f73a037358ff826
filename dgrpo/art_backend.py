"""ART 0.5's training calls on a backend: ``backend.train(model, groups, ...)`` and
``backend.train_sft(model, trajectories, config)``, shared by ``LocalBackend`` and ``TemporalBackend``.

result = await backend.train(model, groups, learning_rate=1e-5)
await model.log(groups, metrics=result.metrics, step=result.step, split="train")

Each returns once the new step is served; as in ART 0.5 neither logs beyond the step's own record (the
caller logs with ``model.log``). ``model.train`` / ``model.train_sft`` stay available.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any, Protocol

from dgrpo.art_config import train_config_fields
from dgrpo.backends import Backend, ClusterBackend
from dgrpo.errors import NotRegisteredError
from dgrpo.metrics import group_metrics, train_result_metrics
from dgrpo.metrics_taxonomy import average_metric_samples
from dgrpo.sft import batch_metrics
from dgrpo.trainable_model import TrainableModel
from dgrpo.types import LocalTrainResult, TrainResult, TrainSFTConfig
from schemas.config import TrainConfig
from schemas.trajectory import Trajectory, TrajectoryGroup


class ArtBackend(Backend, Protocol):
    """A backend with ART's ``train``: ``LocalBackend`` and ``TemporalBackend``."""

    async def train(
        self, model: TrainableModel, trajectory_groups: Iterable[TrajectoryGroup], **options: Any
    ) -> LocalTrainResult: ...


class ArtTraining:
    """``train`` and ``train_sft`` for a backend a ``TrainableModel`` registers with."""

    def check_registered(self, model: TrainableModel) -> None:
        if model.backend() is not self:
            raise NotRegisteredError(
                f"model {model.name!r} is registered with another backend; train it there, or register it here"
            )

    async def train(
        self,
        model: TrainableModel,
        trajectory_groups: Iterable[TrajectoryGroup],
        *,
        learning_rate: float = 5e-6,
        loss_fn: str | None = None,
        normalize_advantages: bool = True,
        beta: float = 0.0,
        epsilon: float | None = None,
        epsilon_high: float | None = None,
        scale_rewards: bool = True,
        save_checkpoint: bool = True,
        verbose: bool = False,
        **art_options: Any,
    ) -> LocalTrainResult:
        """Train one GRPO step (a durable ``TrainStep``) and return the new step and its metrics.

        ``loss_fn`` (ART 0.5: ``"cispo"`` or ``"ppo"``) picks ``TrainConfig.importance_sampling`` (None: its
        default); ``normalize_advantages=False`` is ``scale_rewards=False``, as in ART. ``art_options`` are ART's
        other keywords, accepted at ART's defaults and refused (with the reason) where dgrpo has no equivalent.
        As ART's, the step goes through the backend's ``_train_model`` seam, whose numbers are averaged into the
        result, at the step ``_get_step`` then reports. ``save_checkpoint=False`` leaves ``checkpoint_path``
        None, as ART 0.5's ``LocalBackend`` does; the step's checkpoint is published either way, since the next
        step and a resumed run start from it.
        """
        options = {
            "learning_rate": learning_rate,
            "loss_fn": loss_fn,
            "normalize_advantages": normalize_advantages,
            "beta": beta,
            "epsilon": epsilon,
            "epsilon_high": epsilon_high,
            "scale_rewards": scale_rewards,
            **art_options,
        }
        config = model.step_config(None, train_config_fields("backend.train", options))
        groups = list(trajectory_groups)
        started = time.monotonic()
        rows = [m async for m in self._train_model(model, groups, config, {}, verbose)]
        metrics = average_metric_samples(rows)
        metrics.setdefault("time/step_trainer_s", time.monotonic() - started)
        for name, value in group_metrics(groups, "train").items():
            if name.startswith("data/"):
                metrics.setdefault(name, value)
        step = await self._get_step(model)
        trained = model.trained_checkpoint
        path = trained.uri if save_checkpoint and trained is not None and trained.step == step else None
        return LocalTrainResult(step=step, metrics=metrics, checkpoint_path=path)

    async def train_sft(
        self,
        model: TrainableModel,
        trajectories: Iterable[Trajectory],
        config: TrainSFTConfig | None = None,
        verbose: bool = False,
    ) -> TrainResult:
        """Fine-tune on the trajectories' assistant turns (a durable ``TrainSFT``); the new step and its
        metrics, logged by the caller (``model.train_sft`` logs them itself)."""
        self.check_registered(model)
        return await model.fine_tune(trajectories, config)

    # ART's seam of ``model.get_step`` and ``model.train_sft`` (``art.Backend``'s names).
    async def _get_step(self, model: TrainableModel) -> int:
        """The newest step the model's workflows trained and served (``model.served_step``)."""
        self.check_registered(model)
        return model.served_step

    async def _train_model(
        self,
        model: TrainableModel,
        trajectory_groups: list[TrajectoryGroup],
        config: TrainConfig,
        dev_config: Mapping[str, Any],
        verbose: bool = False,
    ) -> AsyncIterator[dict[str, float]]:
        """One durable ``TrainStep`` as the model's next step, then its numbers (``backend.train``'s result
        metrics); ``config`` is the step's, with ART's options already mapped (``dev_config`` holds none)."""
        self.check_registered(model)
        if dev_config:
            raise ValueError(
                f"dgrpo's _train_model takes its options in config, not in dev_config {dict(dev_config)}"
            )
        # The program's model.log writes the history rows, as in ART 0.5.
        result = await model.train_step(trajectory_groups, config, history=False)
        yield train_result_metrics(result)

    async def _train_sft(
        self,
        model: TrainableModel,
        trajectories: Iterable[Trajectory],
        config: TrainSFTConfig,
        dev_config: Mapping[str, Any],
        verbose: bool = False,
    ) -> AsyncIterator[dict[str, float]]:
        """One durable ``TrainSFT`` as the model's next step, then each of its batches' numbers (the
        trainer reports them when the step is served; ``dgrpo.sft.batch_metrics``)."""
        self.check_registered(model)
        for metrics in batch_metrics(await model.run_sft(trajectories, config, dev_config)):
            yield metrics


class TemporalBackend(ArtTraining, ClusterBackend):
    """An existing Temporal cluster with ``dgrpo worker`` processes running there (e.g. on a GPU box).

    S3 settings come from ``DGRPO_S3_*`` and the server URL from ``inference_url`` or ``DGRPO_INFERENCE_URL``,
    as the client reaches them (a tunnel or load balancer in front of the GPU box's vLLM).
    """

    async def __aenter__(self) -> TemporalBackend:
        await self.start()
        return self
