"""``dgrpo.metrics.MetricsBuilder``: ART's step metrics: sums, cost roll-ups, running totals, throughput."""

from __future__ import annotations

import asyncio

import pytest

from dgrpo.metrics import MetricsBuilder


async def test_costs_roll_up_to_every_parent_and_all_with_running_totals() -> None:
    builder = MetricsBuilder("train")
    builder.add_cost("train/judge/style", usd=0.08)
    builder.add_cost("train/judge/facts", usd=0.04)
    builder.add_cost("train/gpu", usd=1.0)
    builder.add_cost("train/gpu", usd=0.25)  # the same leaf twice in a step: summed
    builder.add_cost("eval/judge/facts", usd=0.5)
    first = await builder.flush()
    assert first["costs/train/judge"] == pytest.approx(0.12)
    assert (first["costs/train"], first["costs/eval"], first["costs/all"]) == pytest.approx((1.37, 0.5, 1.87))
    assert first["costs/cum/train/judge"] == pytest.approx(0.12) and first["costs/cum/all"] == pytest.approx(
        1.87
    )
    assert await builder.flush() == {}  # a step that added nothing logs nothing, not stale totals
    builder.add_cost("train/gpu", usd=2.0)
    third = await builder.flush()
    assert (third["costs/train"], third["costs/cum/train"], third["costs/cum/all"]) == pytest.approx(
        (2.0, 3.37, 3.87)
    )


async def test_time_data_and_throughput_accumulate_across_steps() -> None:
    builder = MetricsBuilder("train")
    builder.add_user_timing(step_wall_s=1.5, step_actor_s=2.0)
    builder.add_data(step_num_scenarios=2, step_actor_tokens=10, scenario_ids=["a", "b"])
    builder.add_metric("time/step_trainer_s", 4.0)
    builder.add_metric("data/step_trainer_tokens", 40.0)
    builder.add_idle_times(step_trainer_idle_s=1.0, step_actor_idle_s=0.5)
    first = await builder.flush()
    assert (first["time/cum/wall_s"], first["data/cum/num_scenarios"], first["data/cum/actor_tokens"]) == (
        1.5,
        2,
        10,
    )
    assert (first["throughput/avg_trainer_tok_per_s"], first["throughput/avg_actor_tok_per_s"]) == (10.0, 5.0)
    assert (first["throughput/cum/trainer_idle_s"], first["data/cum/num_unique_scenarios"]) == (1.0, 2)
    builder.add_user_timing(step_wall_s=0.5)
    builder.add_data(step_num_scenarios=3, scenario_ids=["b", "c"])
    second = await builder.flush()
    assert (second["time/step_wall_s"], second["time/cum/wall_s"], second["data/cum/num_scenarios"]) == (
        0.5,
        2.0,
        5,
    )
    assert second["data/cum/num_unique_scenarios"] == 3 and "throughput/avg_actor_tok_per_s" not in second


def test_keys_that_would_make_a_leaf_a_parent_or_write_a_total_are_refused() -> None:
    builder = MetricsBuilder("train")
    builder.add_cost("train", usd=1.0)
    with pytest.raises(ValueError, match="cannot both be leaves"):
        builder.add_cost("train/judge", usd=0.1)
    with pytest.raises(ValueError, match="cumulative namespace"):
        builder.add_metric("costs/cum/train", 0.1)
    with pytest.raises(ValueError, match="must start with a section"):
        builder.add_metric("loss", 0.1)


async def test_running_totals_resume_from_state_and_are_shared_across_contexts() -> None:
    before = MetricsBuilder("train")
    before.add_cost("train/gpu", usd=1.0)
    await before.flush()
    after = MetricsBuilder("train")
    after.load_state_dict(before.state_dict())
    evaluation = after.for_cost_context("eval")
    assert after.for_cost_context("train") is after
    evaluation.add_cost("eval/judge", usd=2.0)
    after.add_cost("train/gpu", usd=0.5)  # pending in the train scope: not the eval step's
    metrics = await evaluation.flush()
    assert (metrics["costs/eval/judge"], metrics["costs/cum/all"]) == pytest.approx((2.0, 3.0))
    assert "costs/train/gpu" not in metrics
    assert (await after.flush())["costs/cum/all"] == pytest.approx(3.5)


async def test_concurrent_adds_are_all_counted_and_measure_times_a_block() -> None:
    builder = MetricsBuilder("train")

    async def add() -> None:
        for _ in range(25):
            builder.add_cost("train/gpu", usd=0.1)
            await asyncio.sleep(0)

    await asyncio.gather(*(add() for _ in range(4)))
    with builder.measure("time/step_eval_s"):
        pass
    metrics = await builder.flush()
    assert metrics["costs/all"] == pytest.approx(10.0) and metrics["time/step_eval_s"] >= 0


def test_activate_makes_a_builder_current_until_reset() -> None:
    builder = MetricsBuilder("eval")
    token = builder.activate()
    assert MetricsBuilder.get_active() is builder
    token.var.reset(token)
    with pytest.raises(LookupError):
        MetricsBuilder.get_active()
    with builder.activate_context() as active:
        assert MetricsBuilder.get_active() is active is builder
