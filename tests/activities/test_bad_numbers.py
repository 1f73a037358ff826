"""Numbers checked before they count (real S3, the real SmolLM2 trainer): a bad sampling logprob is refused
where trajectories enter, a non-finite update is never applied, and a non-finite adapter is never published."""

from __future__ import annotations

import math

import pytest
import torch
from temporalio.exceptions import ApplicationError

from activities import trajectory_store
from activities.advantages import AdvantagesActivities
from activities.checkpoints import TrainerState, stage_checkpoint, staging_dir
from activities.training import TrainerActivities
from schemas import layout
from schemas.activities import AdvantagesInput, InitialAdapterInput, PublishInput, TrainInput
from schemas.config import TrainConfig
from schemas.errors import BAD_LOGPROB, NonFiniteUpdateError
from schemas.trajectory import Choice, ChoiceLogprobs, TokenLogprob, Trajectory, TrajectoryGroup
from tests.activities.test_training import MODEL, synthetic_groups


def sampled(logprobs: list[float], reward: float) -> Trajectory:
    choice = Choice(
        message={"role": "assistant", "content": "ok"},
        token_ids=list(range(100, 100 + len(logprobs))),
        prompt_token_ids=[1, 2, 3],
        logprobs=ChoiceLogprobs(content=[TokenLogprob(token="x", logprob=v) for v in logprobs]),
    )
    return Trajectory(messages_and_choices=[{"role": "user", "content": "q"}, choice], reward=reward)


def uploaded_with(logprob: float) -> list[TrajectoryGroup]:
    """Two groups as a client uploads them; group 1's trajectory 1 sampled one token at ``logprob``."""
    return [
        TrajectoryGroup([sampled([-0.5, -1.0], 0.0), sampled([-2.0], 1.0)], metadata={"scenario_id": "fine"}),
        TrajectoryGroup(
            [sampled([-0.1], 1.0), sampled([-0.3, logprob, -0.2], 0.0)], metadata={"scenario_id": "broken"}
        ),
    ]


@pytest.mark.parametrize("logprob", [-9999.0, -200.0, math.nan, -math.inf, 0.5], ids=str)
def test_a_bad_sampling_logprob_is_refused_at_ingestion_naming_the_trajectory(object_store, logprob):
    run = "lp-run"
    ref = trajectory_store.upload_groups(object_store, uploaded_with(logprob), run, 1)
    acts = AdvantagesActivities(object_store)
    with pytest.raises(ApplicationError) as caught:
        acts.compute_advantages_sync(
            AdvantagesInput(run_id=run, step=1, trajectories=ref, train=TrainConfig())
        )
    err = caught.value
    assert err.type == BAD_LOGPROB and err.non_retryable
    assert "group 1 (scenario 'broken'), trajectory 1, choice 0, token 1" in err.message, err.message
    assert repr(logprob) in err.message and "placeholder" in err.message
    assert not object_store.exists(layout.advantages_key(run, 1))  # nothing it computed was stored


def test_a_real_low_logprob_passes(object_store):
    ref = trajectory_store.upload_groups(object_store, uploaded_with(-30.0), "lp-real", 1)
    out = AdvantagesActivities(object_store).compute_advantages_sync(
        AdvantagesInput(run_id="lp-real", step=1, trajectories=ref, train=TrainConfig())
    )
    assert out.n_trajectories == 4 and object_store.exists(layout.advantages_key("lp-real", 1))


def test_a_non_finite_update_is_refused_and_never_published(object_store, tmp_path, trainer):
    """The issue's case: one sampling logprob of -200 on a trajectory with a negative advantage made the
    loss inf and every adapter value NaN. The file is written as an older version's advantages activity
    wrote it (no logprob check), so only the trainer's own check stands between it and the adapter."""
    trainer.init_adapter(seed=0)
    groups = synthetic_groups(trainer, 1, 4, seed=3)
    poisoned = groups[0].trajectories[0].choices()[0]
    assert poisoned.logprobs is not None and poisoned.logprobs.content
    poisoned.logprobs.content[0].logprob = -200.0
    advantages = [[-1.0, 1.0, 0.5, -0.5]]
    ref = trajectory_store.upload_groups(
        object_store, groups, "nan-run", 1, key=layout.advantages_key("nan-run", 1), advantages=advantages
    ).ref

    acts = TrainerActivities(object_store, tmp_path / "w", "worker-nan")
    start = acts.publish_initial_sync(InitialAdapterInput(run_id="nan-run", model=MODEL, seed=7))
    assert acts.trainer is not None
    before = acts.trainer.adapter_state()
    config = TrainConfig(learning_rate=1e-3, micro_batch_size=4)
    inp = TrainInput(run_id="nan-run", step=1, model=MODEL, advantages=ref, train=config, start_from=start)
    with pytest.raises(
        NonFiniteUpdateError, match=r"step 1: loss inf, gradient norm (nan|inf); .* not applied"
    ):
        acts.train_sync(inp, micro_batch=4)
    assert not NonFiniteUpdateError("x").retryable
    after = acts.trainer.adapter_state()
    for name, value in before.items():  # the update was never applied
        assert torch.equal(after[name], value), name
    assert object_store.latest_checkpoint("nan-run") == start  # nothing past step 0 was published
    assert not (tmp_path / "w" / "nan-run" / layout.step_name(1)).exists()  # nor staged


def test_an_adapter_with_non_finite_weights_is_never_published(object_store, tmp_path):
    acts = TrainerActivities(object_store, tmp_path / "w", "worker-pub")
    start = acts.publish_initial_sync(InitialAdapterInput(run_id="pub-run", model=MODEL, seed=7))
    trainer = acts.trainer_for(MODEL, "fp32")
    with torch.no_grad():
        name, weight = next((n, p) for n, p in trainer.model.named_parameters() if "lora_B" in n)
        weight[0, 0] = math.nan
    staged = stage_checkpoint(
        staging_dir(tmp_path / "w", "pub-run", 1),
        trainer.save_state,
        TrainerState(run_id="pub-run", step=1, base_model=MODEL.base_model),
        {},
    )
    for publish in (acts.publish_adapter_sync, acts.publish_sync):  # neither servable nor resumable
        with pytest.raises(NonFiniteUpdateError, match=r"holds 1 NaN or infinite value\(s\)"):
            publish(PublishInput(run_id="pub-run", step=1, staging_dir=str(staged)))
    assert object_store.latest_checkpoint("pub-run") == start
    assert not object_store.list(layout.checkpoint_prefix("pub-run", 1)), name
