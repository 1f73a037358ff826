"""Mistakes a user of the ART-style client can make get messages that say what to fix (no stack needed)."""

from __future__ import annotations

import pytest

import dgrpo
from dgrpo.capture.exchange_training import PolicyNames

ASSISTANT = {"role": "assistant", "content": "5"}

POLICY = PolicyNames("agent", "agent", ("agent",))
"""The policy as the model named ``agent`` sends it (no exchanges here: not read)."""


def trained_on(*items: dgrpo.Choice | dict[str, str]) -> dgrpo.TrajectoryGroup:
    messages = [{"role": "user", "content": "What is 2 + 3?"}, *items]
    return dgrpo.TrajectoryGroup(
        [dgrpo.Trajectory(messages_and_choices=messages, reward=r) for r in (0.0, 1.0)]
    )


def model() -> dgrpo.TrainableModel:
    return dgrpo.TrainableModel(name="agent-001", project="errors", base_model="smollm2-135m-instruct")


async def test_train_before_register() -> None:
    groups = [trained_on(dgrpo.Choice(message=ASSISTANT, token_ids=[20, 2]))]
    with pytest.raises(dgrpo.NotRegisteredError, match=r"await model.register\(backend\)"):
        await model().train(groups)
    with pytest.raises(dgrpo.NotRegisteredError, match="register"):
        model().openai_client()
    with pytest.raises(dgrpo.NotRegisteredError, match="register"):
        await model().get_step()


def test_empty_and_all_failed_batches_are_left_for_train_to_skip() -> None:
    # As in ART, train skips these (and logs it; see test_art_program) rather than refusing them.
    from dgrpo.client.train_step import check_trainable

    failed = [dgrpo.TrajectoryGroup([ValueError("every rollout raised")])]
    assert check_trainable([], POLICY) == [] and check_trainable(failed, POLICY) == failed


async def test_groups_not_yet_awaited() -> None:
    async def rollout() -> dgrpo.Trajectory:
        return dgrpo.Trajectory()

    pending = dgrpo.TrajectoryGroup([rollout()])
    with pytest.raises(dgrpo.EmptyGroupsError, match="gather_trajectory_groups"):
        await model().train([pending])
    await pending  # no never-awaited coroutine left behind


async def test_groups_with_no_trainable_choice() -> None:
    with pytest.raises(dgrpo.NoTrainableChoiceError, match=r"no Choice objects.*model.openai_client\(\)"):
        await model().train([trained_on(ASSISTANT)])
    with pytest.raises(dgrpo.NoTrainableChoiceError, match=r"choices without token ids.*openai_client"):
        await model().train([trained_on(dgrpo.Choice(message=ASSISTANT))])
