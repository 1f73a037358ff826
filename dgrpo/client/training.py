"""ART 0.5's training calls on a backend: ``backend.train(model, groups, ...)`` and
``backend.train_sft(model, trajectories, config)``, shared by ``LocalBackend`` and ``TemporalBackend``.

result = await backend.train(model, groups, learning_rate=1e-5)
await model.log(groups, metrics=result.metrics, step=result.step, split="train")

Each returns once the new step is served; as in ART 0.5 neither logs beyond the step's own record (the
caller logs with ``model.log``). ``model.train`` / ``model.train_sft`` stay available: as in ART, the model
asks its backend (``train_step``, ``_train_sft``, ``_get_step`` here), and the work goes one way from here:
the backend runs the durable step (dgrpo/client/train_step.py, dgrpo/client/sft.py), records its numbers
(``model.record_step``) and routes the model to the step served (``model.use_served``).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, cast

from temporalio.client import Client

from activities.object_store import ObjectStore
from activities.retention import complete_checkpoint_steps, delete_checkpoints
from activities.rollout_model import own_server_api_key
from dgrpo.art_compat.options import train_config_fields
from dgrpo.art_compat.settings_rule import check_server_config, warn_ignored
from dgrpo.capture.exchange_training import PolicyNames, trainable_groups
from dgrpo.client.backends import Backend
from dgrpo.client.model_base import ModelBase
from dgrpo.client.sft import batch_metrics, run_train_sft, sft_config, train_result
from dgrpo.client.train_step import check_trainable, log_skipped, run_train_step
from dgrpo.errors import NotRegisteredError
from dgrpo.metrics_taxonomy import average_metric_samples, trainable
from dgrpo.model import TrainableModel
from dgrpo.model_log.run_metrics import group_metrics, train_result_metrics
from dgrpo.types import LocalTrainResult, TrainResult, TrainSFTConfig
from schemas.config import TaskQueues, TrainConfig
from schemas.run_state import TrainSFTResult, TrainStepResult
from schemas.trajectory import Trajectory, TrajectoryGroup


def trained_tokens(groups: list[TrajectoryGroup], policy: PolicyNames) -> float:
    """The sampled tokens of the policy's choices in the groups a step learns from (rewards that differ)."""
    return float(
        sum(
            len(choice.token_ids or [])
            for group in trainable_groups(groups, policy)
            if trainable(group)
            for trajectory in group.trajectories
            for choice in trajectory.choices()
        )
    )


class ArtBackend(Backend, Protocol):
    """A backend with ART's ``train``: ``LocalBackend`` and ``TemporalBackend``."""

    async def train(
        self, model: TrainableModel, trajectory_groups: Iterable[TrajectoryGroup], **options: Any
    ) -> LocalTrainResult: ...


class ArtTraining:
    """``train`` and ``train_sft`` for a backend a ``TrainableModel`` registers with, and the seam the model
    asks (a mixin of ``LocalBackend`` and ``TemporalBackend``, whose other base is the ``Backend``)."""

    if TYPE_CHECKING:  # the Backend this mixes into
        task_queues: TaskQueues

        async def temporal_client(self) -> Client: ...

        def object_store(self) -> ObjectStore: ...

        def inference_url(self) -> str: ...

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
        # ART 0.5.23's inputs of throughput/avg_trainer_tok_per_s: this call's time, the tokens it trained.
        metrics.setdefault("time/step_backend_train_s", time.monotonic() - started)
        metrics.setdefault(
            "data/step_trainable_assistant_tokens", trained_tokens(groups, PolicyNames.of(model))
        )
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
        return train_result(await self.run_sft(model, trajectories, config, {}))

    # ART's hooks (``art.Backend``'s names), which the model calls, as does a server of ART's protocol.
    async def register(self, model: ModelBase) -> None:
        """Bind ``model`` here: a ``TrainableModel`` is recorded under its run (or checked against the record)
        and its newest step served (``TrainableModel.join``); any model's ``log`` then also writes the store."""
        await model.join(cast(Backend, self))

    async def _prepare_backend_for_training(
        self, model: TrainableModel, config: Mapping[str, Any] | None = None
    ) -> tuple[str, str]:
        """The inference server's OpenAI base URL and API key (the server's own, ``DGRPO_SERVE_API_KEY``, if it
        has one). ``config``, ART's ``dev.OpenAIServerConfig``, is checked by the settings rule: ART's server
        settings are the inference worker's operator's here, accepted with one warning, and what would
        change what is sampled is refused, saying why (dgrpo/art_compat/settings_rule.py)."""
        self.check_registered(model)
        warn_ignored(model.name, check_server_config(config or {}))
        return self.inference_url(), own_server_api_key()

    def _model_inference_name(self, model: ModelBase, step: int | None = None) -> str:
        """The name the server answers the model's ``step`` (None: the newest) under: a ``TrainableModel``'s
        ``served_name``, a ``Model``'s own name."""
        if isinstance(model, TrainableModel):
            return model.served_name(step)
        return model.get_inference_name(step)

    async def _delete_checkpoint_files(self, model: TrainableModel, steps_to_keep: list[int]) -> list[int]:
        """Delete the model's checkpoints but ``steps_to_keep`` and the step being served, each manifest first;
        returns the steps deleted."""
        self.check_registered(model)
        run_id, _ = model.check_identity()
        store = self.object_store()
        keep = {*steps_to_keep, model.served_step}
        doomed = [
            s for s in await asyncio.to_thread(complete_checkpoint_steps, store, run_id) if s not in keep
        ]
        await asyncio.to_thread(delete_checkpoints, store, run_id, doomed)
        return doomed

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
        metrics). ``config`` is the step's ``TrainConfig`` (what it leaves unset is ART's default);
        ``dev_config``'s keys are ART's ``dev.TrainConfig``, mapped into it as ``model.train(_config=)``'s are."""
        self.check_registered(model)
        config = model.step_config(config, train_config_fields("_train_model(dev_config=...)", dev_config))
        # The program's model.log writes the history rows, as in ART 0.5.
        result = await self.train_step(model, trajectory_groups, config, history=False)
        yield train_result_metrics(result)

    async def train_step(
        self,
        model: TrainableModel,
        trajectory_groups: Iterable[TrajectoryGroup],
        config: TrainConfig,
        *,
        history: bool,
    ) -> TrainStepResult:
        """One GRPO step as the model's next, a durable ``TrainStep`` (dgrpo/client/train_step.py); returns once
        its adapter is served, to which the model is routed. Its numbers go to the run's metrics Parquet, and
        with ``history`` (``model.train``'s) also to ``history.jsonl`` and W&B (``model.record_step``).

        As in ART >= 0.4.4, a batch with nothing to learn from (no groups, every rollout failed, or every
        group's rewards equal) trains nothing but still advances the step."""
        self.check_registered(model)
        groups = check_trainable(list(trajectory_groups), PolicyNames.of(model))
        store = self.object_store()
        step = model.served_step + 1
        if not any(trainable(g) for g in groups):
            log_skipped(step, groups)
        client = await self.temporal_client()
        record = functools.partial(model.record_step, history=history)
        run_id, spec = model.check_identity()  # what it registered with: its checkpoints are that model's
        result = await run_train_step(
            client, store, self.task_queues, spec, run_id, step, groups, config, record
        )
        model.use_served(result.step, result.adapter)
        model.trained_checkpoint = result.checkpoint
        return result

    async def run_sft(
        self,
        model: TrainableModel,
        trajectories: Iterable[Trajectory],
        config: TrainSFTConfig | None,
        dev_config: Mapping[str, Any],
    ) -> TrainSFTResult:
        """Run (or join) the model's next step as a durable ``TrainSFT`` and route the model to the adapter
        it served."""
        examples = list(trajectories)
        sft = sft_config(config, examples, model.max_seq_len, dev_config)
        self.check_registered(model)
        run_id, spec = model.check_identity()
        client = await self.temporal_client()
        result = await run_train_sft(
            client,
            self.object_store(),
            self.task_queues,
            spec,
            run_id,
            model.served_step + 1,
            examples,
            sft,
        )
        model.use_served(result.step, result.adapter)
        return result

    async def _train_sft(
        self,
        model: TrainableModel,
        trajectories: Iterable[Trajectory],
        config: TrainSFTConfig,
        dev_config: Mapping[str, Any],
        verbose: bool = False,
    ) -> AsyncIterator[dict[str, float]]:
        """One durable ``TrainSFT`` as the model's next step, then each of its batches' numbers (the
        trainer reports them when the step is served; ``dgrpo.client.sft.batch_metrics``)."""
        self.check_registered(model)
        for metrics in batch_metrics(await self.run_sft(model, trajectories, config, dev_config)):
            yield metrics
