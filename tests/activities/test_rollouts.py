"""The rollouts activity against the real S3 store: scripted rollouts at the seam, and one real-model run."""

from __future__ import annotations

import json
import random
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from openai_stub import openai_stub
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.object_store import ObjectStore
from activities.rollout_model import routed_openai_client
from activities.rollouts import RolloutActivities, load_scenarios, pick_scenarios
from activities.trajectory_store import download_groups
from schemas import layout
from schemas.activities import RolloutsInput
from schemas.config import TaskSpec
from schemas.errors import ROLLOUT_FAILED, TASK_IMPORT, RunSpecError, TaskImportError
from schemas.trajectory import Choice, Trajectory

STUBS = "rollout_stubs"


def make_input(rollout: str, scenarios: Any = f"{STUBS}:scenarios", **task: Any) -> RolloutsInput:
    groups = task.pop("groups_per_step", 3)
    return RolloutsInput(
        run_id="r1",
        step=2,
        model_name="agent-001",
        adapter="agent-001@1",
        policy_step=1,
        task=TaskSpec(rollout=rollout, scenarios=scenarios, **task),
        groups_per_step=groups,
        group_size=2,
        scenario_offset=0,
        seed=7,
    )


async def run(store: ObjectStore, input: RolloutsInput, beats: list[Any] | None = None) -> Any:
    env = ActivityEnvironment()
    if beats is not None:
        env.on_heartbeat = lambda *details: beats.append(details[0])
    acts = RolloutActivities("http://127.0.0.1:9", store, base_served_name="base", task_modules=(STUBS,))
    return await env.run(acts.rollouts, input)


async def test_rollouts_write_groups_with_scenarios_policy_step_and_heartbeats(
    object_store: ObjectStore,
) -> None:
    beats: list[Any] = []
    ref = await run(object_store, make_input(f"{STUBS}:ok"), beats)
    assert ref.ref.uri == object_store.uri(layout.trajectories_key("r1", 2))
    assert (ref.n_groups, ref.n_trajectories, ref.n_exceptions) == (3, 6, 0)
    groups = download_groups(object_store, ref.ref.uri)
    picked = pick_scenarios(5, 3, 0, 7)
    assert [g.metadata["scenario_index"] for g in groups] == picked
    for g in groups:
        scenario = json.loads(str(g.metadata["scenario"]))
        assert g.metadata["scenario_id"] == scenario["id"]
        assert [t.reward for t in g.trajectories] == [float(scenario["x"])] * 2
        assert all(t.policy_step == 1 for t in g.trajectories)
        assert all(t.metadata["served_model"] == "agent-001@1" for t in g.trajectories)
    rewards = [float(x) for x in picked for _ in range(2)]
    assert ref.reward_mean == pytest.approx(sum(rewards) / 6)
    assert beats[-1] == {"done": 6, "total": 6}
    # a retry overwrites the same key with the same content
    again = await run(object_store, make_input(f"{STUBS}:ok"))
    assert again.ref == ref.ref


def test_pick_scenarios_is_seeded_cycled_and_offset() -> None:
    first = pick_scenarios(5, 5, 0, seed=1)
    assert sorted(first) == list(range(5))
    assert pick_scenarios(5, 5, 0, seed=1) == first
    assert pick_scenarios(5, 3, 2, seed=1) == first[2:5]
    second_pass = pick_scenarios(5, 5, 5, seed=1)
    assert sorted(second_pass) == list(range(5))
    assert pick_scenarios(5, 10, 0, seed=1) == first + second_pass


def test_picking_a_steps_scenarios_shuffles_each_pass_once_and_picks_as_before(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A step's groups over a long list: one seeded shuffle per pass over it (it was one per group: 64 groups
    over a million scenarios took 55 s on the worker's event loop), picking the very scenarios it did then."""
    shuffled: list[int] = []
    shuffle = random.Random.shuffle

    def counting(self: random.Random, x: list[Any]) -> None:
        shuffled.append(len(x))
        shuffle(self, x)

    monkeypatch.setattr(random.Random, "shuffle", counting)
    picked = pick_scenarios(1000, 64, 970, seed=11)  # 30 groups in pass 0, 34 in pass 1
    assert shuffled == [1000, 1000]

    def one_shuffle_per_group(n: int, count: int, offset: int, seed: int) -> list[int]:  # the old picking
        out = []
        for position in range(offset, offset + count):
            epoch, index = divmod(position, n)
            order = list(range(n))
            shuffle(random.Random(f"{seed}:{epoch}"), order)
            out.append(order[index])
        return out

    assert picked == one_shuffle_per_group(1000, 64, 970, 11)


async def test_max_exceptions_tolerated_and_recorded(object_store: ObjectStore) -> None:
    scenarios = [{"id": "good", "x": 1}, {"id": "bad", "fail": True, "x": 0}]
    ref = await run(object_store, make_input(f"{STUBS}:ok", scenarios, max_exceptions=2, groups_per_step=2))
    assert (ref.n_trajectories, ref.n_exceptions) == (2, 2)
    groups = download_groups(object_store, ref.ref.uri)
    bad = next(g for g in groups if g.metadata["scenario_id"] == "bad")
    assert len(bad.exceptions) == 2 and not bad.trajectories
    record = bad.exceptions[0]
    assert record.type == "ValueError"
    assert (
        f"{STUBS}:ok" in record.message and "'bad'" in record.message and "scripted failure" in record.message
    )
    assert "Traceback" in record.traceback


async def test_one_exception_too_many_fails_the_step_naming_function_and_scenario(
    object_store: ObjectStore,
) -> None:
    scenarios = [{"id": "good", "x": 1}, {"id": "bad", "fail": True, "x": 0}]
    with pytest.raises(ApplicationError) as info:
        await run(object_store, make_input(f"{STUBS}:ok", scenarios, max_exceptions=1, groups_per_step=2))
    assert info.value.type == ROLLOUT_FAILED
    assert f"{STUBS}:ok" in info.value.message and "'bad'" in info.value.message
    assert "scripted failure" in info.value.message
    assert not object_store.exists(layout.trajectories_key("r1", 2))


async def test_wrong_return_type_is_recorded(object_store: ObjectStore) -> None:
    ref = await run(object_store, make_input(f"{STUBS}:wrong_type", max_exceptions=6))
    assert (ref.n_trajectories, ref.n_exceptions) == (0, 6)
    record = download_groups(object_store, ref.ref.uri)[0].exceptions[0]
    assert record.type == "TypeError"
    assert (
        f"{STUBS}:wrong_type" in record.message and "returned dict, expected a Trajectory" in record.message
    )


async def test_timeout_is_recorded(object_store: ObjectStore) -> None:
    scenarios = [{"id": "slow", "x": 1, "sleep": 30}, {"id": "fast", "x": 2}]
    ref = await run(
        object_store,
        make_input(f"{STUBS}:ok", scenarios, max_exceptions=2, rollout_timeout_s=0.3, groups_per_step=2),
    )
    groups = download_groups(object_store, ref.ref.uri)
    slow = next(g for g in groups if g.metadata["scenario_id"] == "slow")
    assert [e.type for e in slow.exceptions] == ["TimeoutError", "TimeoutError"]
    assert "timed out after 0.3 s" in slow.exceptions[0].message and "'slow'" in slow.exceptions[0].message


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("no_such_module_xyz:rollout", "is not one this worker imports task code from"),
        ("os:abort", "is not one this worker imports task code from (allowed: rollout_stubs)"),
        (f"{STUBS}_evil:ok", "is not one this worker imports task code from"),
        (f"{STUBS}:missing", "has no attribute 'missing'"),
        (f"{STUBS}:not_async", "not an async function"),
        (f"{STUBS}:NOT_CALLABLE", "not an async function"),
    ],
)
async def test_bad_rollout_path_is_non_retryable_task_import(
    object_store: ObjectStore, path: str, expected: str
) -> None:
    with pytest.raises(ApplicationError) as info:
        await run(object_store, make_input(path))
    assert info.value.type == TASK_IMPORT and info.value.non_retryable
    assert path in info.value.message and expected in info.value.message


def test_scenarios_from_function_jsonl_parquet_and_inline(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = [{"id": "a", "x": 1}, {"id": "b", "x": 2}]
    monkeypatch.chdir(tmp_path)  # scenario files are read from under the worker's working directory
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "s.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "s.parquet")
    assert load_scenarios(f"{STUBS}:scenarios", (STUBS,))[1] == {"id": "s1", "x": 1}
    assert load_scenarios("data/s.jsonl") == rows
    assert load_scenarios(str(tmp_path / "s.parquet")) == rows  # absolute, but under the working directory
    assert load_scenarios(rows) == rows
    with pytest.raises(RunSpecError, match="does not exist"):
        load_scenarios("missing.jsonl")
    with pytest.raises(TaskImportError, match="does not import"):
        load_scenarios("no_such_module_xyz:scenarios", ("no_such_module_xyz",))


@pytest.mark.parametrize("where", ["../outside.jsonl", "{outside}/s.jsonl", ".dgrpo/s.jsonl", "link/s.jsonl"])
def test_scenario_files_outside_the_working_directory_are_refused(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    work, outside = tmp_path / "work", tmp_path / "outside"
    for directory in (work / ".dgrpo", outside):
        directory.mkdir(parents=True)
        (directory / "s.jsonl").write_text('{"secret": 1}\n')
    (tmp_path / "outside.jsonl").write_text('{"secret": 1}\n')
    (work / "link").symlink_to(outside)
    monkeypatch.chdir(work)
    with pytest.raises(RunSpecError, match="outside this worker's working directory") as refused:
        load_scenarios(where.format(outside=outside))
    assert "module:function" in str(refused.value)


def test_a_file_that_is_not_scenarios_is_a_clear_error(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.parquet").write_bytes(b"not parquet")
    (tmp_path / "bad.jsonl").write_bytes(b"\xff\xfe{")
    with pytest.raises(RunSpecError, match="not a Parquet table"):
        load_scenarios("bad.parquet")
    with pytest.raises(RunSpecError, match="not JSON Lines"):
        load_scenarios("bad.jsonl")


async def test_routed_client_rewrites_model_and_asks_for_tokens_and_logprobs() -> None:
    with openai_stub() as stub:
        client = routed_openai_client(stub.base_url, "agent-001", lambda: "agent-001@4")
        completion = await client.chat.completions.create(
            model="agent-001", messages=[{"role": "user", "content": "hi"}]
        )
        await client.chat.completions.create(model="other", messages=[], logprobs=False)
        await client.close()
    first, second = stub.requests
    assert (first["model"], first["logprobs"], first["return_token_ids"]) == ("agent-001@4", True, True)
    assert (second["model"], second["logprobs"]) == ("other", False)  # other names and explicit choices stay
    assert Choice.model_validate(completion.choices[0]).prompt_token_ids == [1, 2, 3]


async def test_a_runs_own_chat_template_goes_with_each_of_its_chats(object_store: ObjectStore) -> None:
    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    with openai_stub() as stub:
        acts = RolloutActivities(stub.base_url, object_store, base_served_name="base", task_modules=(STUBS,))
        input = make_input(f"{STUBS}:asks", groups_per_step=1).model_copy(update={"chat_template": template})
        await ActivityEnvironment().run(acts.rollouts, input)
        client = routed_openai_client(stub.base_url, "agent-001", "agent-001@1", chat_template=template)
        await client.chat.completions.create(model="judge", messages=[{"role": "user", "content": "hi"}])
        await client.chat.completions.create(
            model="agent-001",
            messages=[{"role": "user", "content": "hi"}],
            extra_body={"chat_template": "{{ 1 }}"},
        )
        await client.close()
    *rollouts, other, own = stub.requests
    assert len(rollouts) == 2 and all(
        (r["model"], r["chat_template"]) == ("agent-001@1", template) for r in rollouts
    )
    assert "chat_template" not in other  # another model's chat keeps that model's template
    assert own["chat_template"] == "{{ 1 }}"  # a chat that brings its own keeps it


def real_input(rollout: str, scenarios: str, group_size: int) -> RolloutsInput:
    return RolloutsInput(
        run_id="real",
        step=1,
        model_name="agent-001",
        adapter=None,
        policy_step=0,
        task=TaskSpec(rollout=rollout, scenarios=scenarios, rollout_timeout_s=240),
        groups_per_step=1,
        group_size=group_size,
    )


def assert_choices_carry_tokens(trajectory: Trajectory) -> None:
    assert trajectory.choices(), "a trajectory without a sampled choice"
    for choice in trajectory.choices():
        assert choice.token_ids and choice.prompt_token_ids
        logprobs = choice.sampled_logprobs()
        assert logprobs is not None and len(logprobs) == len(choice.token_ids)
        assert all(lp <= 0.0 for lp in logprobs)


async def test_arithmetic_rollout_on_the_real_server(cpu_server: str, object_store: ObjectStore) -> None:
    acts = RolloutActivities(cpu_server, object_store)  # finds the base model's served name itself
    input = real_input("examples.arithmetic:rollout", "examples.arithmetic:scenarios", group_size=4)
    ref = await ActivityEnvironment().run(acts.rollouts, input)
    (group,) = download_groups(object_store, ref.ref.uri)
    assert len(group.trajectories) == 4 and not group.exceptions
    for trajectory in group.trajectories:
        assert_choices_carry_tokens(trajectory)
        assert trajectory.policy_step == 0 and 0.0 <= trajectory.reward <= 1.0


async def test_tool_agent_rollout_on_the_real_server(cpu_server: str, object_store: ObjectStore) -> None:
    acts = RolloutActivities(cpu_server, object_store)
    input = real_input("examples.tool_agent:rollout", "examples.tool_agent:scenarios", group_size=2)
    ref = await ActivityEnvironment().run(acts.rollouts, input)
    (group,) = download_groups(object_store, ref.ref.uri)
    assert len(group.trajectories) == 2 and not group.exceptions
    for trajectory in group.trajectories:
        assert trajectory.tools and trajectory.tools[0]["function"]["name"] == "lookup_price"
        assert_choices_carry_tokens(trajectory)
