"""Bad and hostile inputs, one table row each, against real worker processes on the real stack.

One control worker and one inference worker (``dgrpo worker``, real processes) serve every row; their
operator allowed two extra judge endpoints, each paired with its own key variable (one also with a variable
left unset), and one task package (``hostile_tasks``). A tiny workflow in this process runs each row's activity on the workers' queues.
Every row asserts:

- a clear error: the failure type, that Temporal did not retry it, and the words that say what to fix;
- the worker keeps serving: it is alive and answers a good request on the same queue right after;
- nothing already stored is lost or changed (every object's sha256 is compared with the baseline);
- no listener ever saw the S3 secret, no judge key reached an endpoint other than its own, and the
  attacker's listener was never called at all.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from recorder import Recorder, recorder
from temporalio import workflow
from temporalio.client import Client
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, RetryState
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from activities.object_store import ObjectStore
from activities.trajectory_store import upload_groups
from schemas.activities import AdvantagesInput, JudgeInput, ReloadInput, RolloutsInput
from schemas.config import JudgeConfig, TaskQueues, TaskSpec, TrainConfig
from schemas.errors import BAD_LOGPROB, BAD_REWARD, CONFIG_ERROR, TASK_IMPORT
from schemas.refs import CheckpointRef, TrajectoriesRef
from schemas.settings import ENV_HOME, ENV_S3_BUCKET, ENV_S3_SECRET_KEY, S3Settings
from schemas.trajectory import Choice, ChoiceLogprobs, TokenLogprob, Trajectory, TrajectoryGroup
from workers.launcher import WorkerProcess
from workers.stack import EmbeddedStack
from workers.temporal import connect_client

RUN = "sec-run"
CANARY = "sec-canary"
"""The run the good requests after each row write to (left out of the stored-objects comparison)."""
TASKS = "hostile_tasks"
JUDGE_KEY_ENV = "DGRPO_TEST_JUDGE_KEY"
"""Paired with the ``allowed`` endpoint, and set on the control worker."""
JUDGE_KEY = "the-allowed-judge-key"
SECOND_KEY_ENV = "DGRPO_TEST_SECOND_JUDGE_KEY"
"""Paired with the ``second`` endpoint, and set on the control worker."""
SECOND_KEY = "the-second-judge-key"
UNSET_KEY_ENV = "DGRPO_TEST_UNSET_KEY"
"""Paired with the ``allowed`` endpoint, but not set."""
HERE = Path(__file__).resolve().parent
LOGPROBS = [
    ("placeholder", -9999.0),
    ("nan", float("nan")),
    ("negative-inf", float("-inf")),
    ("positive", 2.0),
]
"""Sampling logprobs no sampler returns, uploaded as a client's own Choices could carry them."""


@workflow.defn(name="SecurityProbe")
class SecurityProbe:
    """Runs one activity by name on a worker's queue and reports how it ended (never fails itself)."""

    @workflow.run
    async def run(self, call: dict[str, Any]) -> dict[str, Any]:
        try:
            result = await workflow.execute_activity(
                call["activity"],
                call["input"],
                task_queue=call["queue"],
                start_to_close_timeout=timedelta(seconds=120),
                retry_policy=RetryPolicy(maximum_attempts=2, initial_interval=timedelta(milliseconds=100)),
            )
        except ActivityError as err:
            cause = err.cause
            app = cause if isinstance(cause, ApplicationError) else None
            chain, link = [], cause
            while link is not None:
                chain.append(str(link))
                link = link.__cause__
            return {
                "ok": False,
                "type": app.type if app else type(cause).__name__,
                "message": app.message if app else str(cause),
                "chain": " <- ".join(chain),
                "non_retryable": bool(app and app.non_retryable),
                "retry_state": err.retry_state.name if err.retry_state is not None else None,
            }
        return {"ok": True, "result": result}


@dataclass
class Harness:
    client: Client
    queues: TaskQueues
    probe_queue: str
    store: ObjectStore
    own: Recorder
    """The control worker's own inference server (its default judge) and the inference worker's server."""
    allowed: Recorder
    """A judge endpoint the operator allowed, paired with ``JUDGE_KEY_ENV``."""
    second: Recorder
    """Another allowed judge endpoint, paired with ``SECOND_KEY_ENV``: ``JUDGE_KEY`` must never reach it."""
    trap: Recorder
    """An attacker's host: no request may ever reach it."""
    control: WorkerProcess
    inference: WorkerProcess
    secret: str
    trajectories: TrajectoriesRef
    """Step 1's trajectories, written by the inference worker before any row."""
    scored: TrajectoriesRef
    bad_scored: dict[str, TrajectoriesRef]
    """Scored files with a bad reward (as an ART-style client could upload them), by kind."""

    async def call(self, queue: str, activity: str, input: Any) -> dict[str, Any]:
        payload = input if isinstance(input, dict) else input.model_dump(mode="json")
        call = {"activity": activity, "queue": queue, "input": payload}
        out: dict[str, Any] = await self.client.execute_workflow(
            SecurityProbe.run, call, id=f"probe-{uuid.uuid4().hex[:12]}", task_queue=self.probe_queue
        )
        return out

    def snapshot(self) -> dict[str, str]:
        """sha256 of every stored object outside the canary run."""
        return {
            key: hashlib.sha256(self.store.get_bytes(key)).hexdigest()
            for key in self.store.list("")
            if not key.startswith(f"runs/{CANARY}/")
        }


def rollouts_input(rollout: str, scenarios: Any, run_id: str = RUN, step: int = 1) -> RolloutsInput:
    return RolloutsInput(
        run_id=run_id,
        step=step,
        model_name="agent",
        task=TaskSpec(rollout=rollout, scenarios=scenarios),
        groups_per_step=2,
        group_size=2,
    )


def judge_input(h: Harness, **judge: Any) -> JudgeInput:
    return JudgeInput(
        run_id=RUN, step=1, trajectories=h.trajectories, judge=JudgeConfig(**judge), base_model_name="base"
    )


def advantages_input(ref: TrajectoriesRef, run_id: str = RUN) -> AdvantagesInput:
    return AdvantagesInput(run_id=run_id, step=ref.step, trajectories=ref, train=TrainConfig())


def scored_with(reward: float) -> list[TrajectoryGroup]:
    def traj(r: float) -> Trajectory:
        return Trajectory(messages_and_choices=[{"role": "user", "content": "q"}], reward=r)

    return [
        TrajectoryGroup([traj(0.0), traj(1.0)], metadata={"scenario_id": "fine"}),
        TrajectoryGroup([traj(1.0), traj(reward)], metadata={"scenario_id": "broken"}),
    ]


def scored_with_logprob(logprob: float) -> list[TrajectoryGroup]:
    """Scored groups whose group 1, trajectory 1 sampled a token at ``logprob`` (as a client's own Choices can)."""

    def traj(r: float, lp: float) -> Trajectory:
        choice = Choice(
            message={"role": "assistant", "content": "a"},
            token_ids=[100, 101],
            prompt_token_ids=[1, 2],
            logprobs=ChoiceLogprobs(
                content=[TokenLogprob(token="a", logprob=-0.5), TokenLogprob(token="b", logprob=lp)]
            ),
        )
        return Trajectory(messages_and_choices=[{"role": "user", "content": "q"}, choice], reward=r)

    return [
        TrajectoryGroup([traj(0.0, -1.0), traj(1.0, -2.0)], metadata={"scenario_id": "fine"}),
        TrajectoryGroup([traj(1.0, -0.1), traj(0.0, logprob)], metadata={"scenario_id": "broken"}),
    ]


async def expect_ok(h: Harness, queue: str, activity: str, input: Any) -> dict[str, Any]:
    out = await h.call(queue, activity, input)
    assert out["ok"], out
    return out["result"]


@pytest_asyncio.fixture(scope="module")
async def harness(
    stack: EmbeddedStack, s3_settings: S3Settings, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Harness]:
    suffix = uuid.uuid4().hex[:8]
    bucket = f"sec-{suffix}"
    store = ObjectStore(s3_settings.model_copy(update={"bucket": bucket}))
    store.ensure_bucket()
    queues = TaskQueues(
        control=f"sec-control-{suffix}", inference=f"sec-inf-{suffix}", trainer=f"sec-tr-{suffix}"
    )
    home = tmp_path_factory.mktemp("sec-home")
    env = {ENV_HOME: str(home), ENV_S3_BUCKET: bucket, JUDGE_KEY_ENV: JUDGE_KEY, SECOND_KEY_ENV: SECOND_KEY}
    env.pop(UNSET_KEY_ENV, None)
    client = await connect_client(address=stack.temporal_address)
    with recorder() as own, recorder() as allowed, recorder() as second, recorder() as trap:
        control = WorkerProcess(
            "control",
            home / "control.log",
            task_queues=queues,
            server_url=own.base_url,
            env=env,
            extra_args=["--judge-base-url", allowed.base_url,
                        "--judge-key-env", f"{allowed.base_url}={JUDGE_KEY_ENV}",
                        "--judge-key-env", f"{allowed.base_url}={UNSET_KEY_ENV}",
                        "--judge-key-env", f"{second.base_url}={SECOND_KEY_ENV}"],
        )  # fmt: skip
        pythonpath = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
        inference = WorkerProcess(
            "inference",
            home / "inference.log",
            task_queues=queues,
            server_url=own.base_url,
            env={**env, "PYTHONPATH": pythonpath},
            extra_args=["--task-module", TASKS],
        )
        control.spawn()
        inference.spawn()
        probe_queue = f"sec-probe-{suffix}"
        probe = Worker(
            client,
            task_queue=probe_queue,
            workflows=[SecurityProbe],
            workflow_runner=UnsandboxedWorkflowRunner(),
        )
        probe_task = asyncio.create_task(probe.run())
        try:
            await asyncio.to_thread(control.wait_ready, 180)
            await asyncio.to_thread(inference.wait_ready, 180)
            bad_scored = {
                kind: upload_groups(
                    store, scored_with(reward), RUN, step, key=f"runs/{RUN}/uploaded/{kind}.parquet"
                )
                for step, (kind, reward) in enumerate(
                    [("nan", float("nan")), ("inf", float("inf")), ("huge", 1e200)], start=2
                )
            } | {
                f"logprob-{kind}": upload_groups(
                    store,
                    scored_with_logprob(logprob),
                    RUN,
                    step,
                    key=f"runs/{RUN}/uploaded/logprob-{kind}.parquet",
                )
                for step, (kind, logprob) in enumerate(LOGPROBS, start=5)
            }
            h = Harness(
                client, queues, probe_queue, store, own, allowed, second, trap, control, inference,
                secret=os.environ[ENV_S3_SECRET_KEY], trajectories=None, scored=None,  # type: ignore[arg-type]
                bad_scored=bad_scored,
            )  # fmt: skip
            good = rollouts_input(f"{TASKS}:rollout", f"{TASKS}:scenarios")
            h.trajectories = TrajectoriesRef.model_validate(
                await expect_ok(h, queues.inference, "rollouts", good)
            )
            scored = await expect_ok(h, queues.control, "judge", judge_input(h, kind="ruler"))
            h.scored = TrajectoriesRef.model_validate(scored)
            await expect_ok(h, queues.control, "compute_advantages", advantages_input(h.scored))
            yield h
        finally:
            await probe.shutdown()
            probe_task.cancel()
            control.stop(30)
            inference.stop(30)
            store.remove_bucket()


@dataclass(frozen=True)
class Row:
    id: str
    queue: str
    """``control`` or ``inference``."""
    activity: str
    input: Callable[[Harness], Any]
    failure_type: str
    says: tuple[str, ...]
    """Words the error message must contain (what is wrong, and what to change)."""


def good_rollouts(h: Harness) -> RolloutsInput:
    return rollouts_input(f"{TASKS}:rollout", f"{TASKS}:scenarios")


def replaced(model: Any, path: tuple[str, ...], value: Any) -> dict[str, Any]:
    """``model`` as JSON with the field at ``path`` set to ``value`` (bypassing validation, as a hostile
    client writing raw JSON would)."""
    data: dict[str, Any] = model.model_dump(mode="json")
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return data


def userinfo_trick(h: Harness) -> str:
    """``http://<allowed host:port>@<trap host:port>/v1``: reads like the allowed host, connects to the trap."""
    return h.allowed.base_url.removesuffix("/v1") + "@" + h.trap.base_url.removeprefix("http://")


ROWS = [
    # --- judge: endpoints and keys are the control worker operator's, never the run's
    Row("judge-attacker-url-with-the-s3-secret", "control", "judge",
        lambda h: judge_input(h, kind="ruler", base_url=h.trap.base_url, api_key_env=ENV_S3_SECRET_KEY),
        CONFIG_ERROR, ("is not a judge endpoint this control worker allows", "--judge-base-url",
                       "DGRPO_JUDGE_BASE_URLS")),
    Row("judge-attacker-url-without-a-key", "control", "judge",
        lambda h: judge_input(h, kind="both", base_url=h.trap.base_url),
        CONFIG_ERROR, ("judge.base_url", "--judge-base-url")),
    Row("judge-allowed-url-with-the-s3-secret", "control", "judge",
        lambda h: judge_input(h, kind="ruler", base_url=h.allowed.base_url, api_key_env=ENV_S3_SECRET_KEY),
        CONFIG_ERROR, (f"judge.api_key_env '{ENV_S3_SECRET_KEY}' is not a key variable", "--judge-key-env",
                       "DGRPO_JUDGE_KEY_ENVS")),
    Row("judge-own-server-with-the-s3-secret", "control", "judge",
        lambda h: judge_input(h, kind="ruler", api_key_env=ENV_S3_SECRET_KEY),
        CONFIG_ERROR, ("is not a key variable", "--judge-key-env")),
    Row("judge-allowed-key-to-another-allowed-endpoint", "control", "judge",
        lambda h: judge_input(h, kind="ruler", base_url=h.second.base_url, api_key_env=JUDGE_KEY_ENV),
        CONFIG_ERROR, (f"'{JUDGE_KEY_ENV}' is not a key variable this control worker sends to",
                       "a key goes only to the endpoint it is paired with", "--judge-key-env URL=NAME")),
    Row("judge-allowed-key-to-the-own-server", "control", "judge",
        lambda h: judge_input(h, kind="ruler", api_key_env=JUDGE_KEY_ENV),
        CONFIG_ERROR, (f"'{JUDGE_KEY_ENV}' is not a key variable this control worker sends to",)),
    Row("judge-other-secret-variable", "control", "judge",
        lambda h: judge_input(h, kind="ruler", base_url=h.allowed.base_url, api_key_env="DGRPO_S3_ACCESS_KEY"),
        CONFIG_ERROR, ("is not a key variable",)),
    Row("judge-allowed-key-variable-not-set", "control", "judge",
        lambda h: judge_input(h, kind="ruler", base_url=h.allowed.base_url, api_key_env=UNSET_KEY_ENV),
        CONFIG_ERROR, (UNSET_KEY_ENV, "does not set it")),
    Row("judge-url-userinfo-trick", "control", "judge",
        lambda h: judge_input(h, kind="ruler", base_url=userinfo_trick(h)),
        CONFIG_ERROR, ("is not a judge endpoint",)),
    Row("judge-url-path-trick", "control", "judge",
        lambda h: judge_input(h, kind="ruler", base_url=h.allowed.base_url + "/../../steal"),
        CONFIG_ERROR, ("is not a judge endpoint",)),
    # --- task code: only from the packages the inference worker's operator allowed
    Row("rollout-os-abort", "inference", "rollouts", lambda h: rollouts_input("os:abort", f"{TASKS}:scenarios"),
        TASK_IMPORT, ("module 'os' is not one this worker imports task code from", "--task-module",
                      "DGRPO_TASK_MODULES")),
    Row("rollout-subprocess-run", "inference", "rollouts",
        lambda h: rollouts_input("subprocess:run", f"{TASKS}:scenarios"), TASK_IMPORT, ("'subprocess'",)),
    Row("rollout-builtins-exec", "inference", "rollouts",
        lambda h: rollouts_input("builtins:exec", f"{TASKS}:scenarios"), TASK_IMPORT, ("'builtins'",)),
    Row("rollout-package-name-prefix-trick", "inference", "rollouts",
        lambda h: rollouts_input(f"{TASKS}_evil:rollout", f"{TASKS}:scenarios"), TASK_IMPORT, (f"'{TASKS}_evil'",)),
    Row("rollout-default-package-not-allowed-here", "inference", "rollouts",
        lambda h: rollouts_input("examples.arithmetic:rollout", f"{TASKS}:scenarios"),
        TASK_IMPORT, ("'examples.arithmetic'", f"allowed: {TASKS}")),
    Row("rollout-imported-coroutine", "inference", "rollouts",
        lambda h: rollouts_input(f"{TASKS}:imported_sleep", f"{TASKS}:scenarios"),
        TASK_IMPORT, ("module 'asyncio.tasks' is not one this worker imports",)),
    Row("scenarios-os-abort", "inference", "rollouts", lambda h: rollouts_input(f"{TASKS}:rollout", "os:abort"),
        TASK_IMPORT, ("task.scenarios 'os:abort'", "--task-module")),
    Row("scenarios-imported-function", "inference", "rollouts",
        lambda h: rollouts_input(f"{TASKS}:rollout", f"{TASKS}:getcwd"),
        TASK_IMPORT, ("must be a plain function",)),
    Row("scenarios-a-class", "inference", "rollouts",
        lambda h: rollouts_input(f"{TASKS}:rollout", f"{TASKS}:Scenarios"),
        TASK_IMPORT, ("is a type", "must be a plain function")),
    Row("scenarios-function-raises", "inference", "rollouts",
        lambda h: rollouts_input(f"{TASKS}:rollout", f"{TASKS}:raising_scenarios"),
        TASK_IMPORT, ("raised RuntimeError: the scenario source is down",)),
    Row("scenarios-not-dicts", "inference", "rollouts",
        lambda h: rollouts_input(f"{TASKS}:rollout", f"{TASKS}:not_dict_scenarios"),
        CONFIG_ERROR, ("item 0 is a str", "each scenario is a dict")),
    Row("scenarios-missing-file", "inference", "rollouts",
        lambda h: rollouts_input(f"{TASKS}:rollout", "no-such-scenarios.jsonl"),
        CONFIG_ERROR, ("does not exist on this worker",)),
    # --- scenario files: only from under the worker's working directory, never a hidden directory
    *(
        Row(f"scenarios-file-{label}", "inference", "rollouts",
            lambda h, path=path: rollouts_input(f"{TASKS}:rollout", path),
            CONFIG_ERROR, ("is outside this worker's working directory", "'module:function'"))
        for label, path in [
            ("absolute-elsewhere", "/etc/dgrpo-scenarios.jsonl"),
            ("parent-dirs", "../../../tmp/scenarios.parquet"),
            ("home-dotdir", "~/.aws/credentials.jsonl"),
            ("worker-state", ".dgrpo/runs/other-run/metrics.parquet"),
        ]
    ),
    # --- names: run ids, model and adapter names are validated names (one path component, one key segment)
    *(
        Row(f"{activity}-{'.'.join(path)}-{label}", queue, activity,
            lambda h, build=build, path=path, value=value: replaced(build(h), path, value),
            CONFIG_ERROR, ("the input does not validate", path[-1], "String should match pattern"))
        for activity, queue, build, path, label, value in [
            ("rollouts", "inference", good_rollouts, ("run_id",), "parent-dirs", "../../outside"),
            ("rollouts", "inference", good_rollouts, ("run_id",), "absolute", "/etc"),
            ("rollouts", "inference", good_rollouts, ("run_id",), "slash", "a/b"),
            ("rollouts", "inference", good_rollouts, ("run_id",), "empty", ""),
            ("rollouts", "inference", good_rollouts, ("model_name",), "parent-dir", "../model"),
            ("rollouts", "inference", good_rollouts, ("adapter",), "path", "../../x@1"),
            ("judge", "control", lambda h: judge_input(h, kind="ruler"), ("run_id",), "parent-dirs", "../x"),
            ("judge", "control", lambda h: judge_input(h, kind="ruler"), ("trajectories", "run_id"), "dot-dot", ".."),
            ("compute_advantages", "control", lambda h: advantages_input(h.scored), ("run_id",), "absolute", "/tmp/x"),
        ]
    ),
    # --- numbers and sizes a run spec may not carry, sent raw (as `temporal workflow start` could): refused by
    # the worker's decoding, naming the field, before anything runs
    *(
        Row(f"{activity}-{'.'.join(path)}-{label}", queue, activity,
            lambda h, build=build, path=path, value=value: replaced(build(h), path, value),
            CONFIG_ERROR, ("the input does not validate", path[-1], says))
        for activity, queue, build, path, label, value, says in [
            ("compute_advantages", "control", lambda h: advantages_input(h.scored), ("train", "advantage_eps"),
             "inf", float("inf"), "finite number"),
            ("compute_advantages", "control", lambda h: advantages_input(h.scored), ("train", "kl_coef"),
             "nan", float("nan"), "finite number"),
            ("rollouts", "inference", good_rollouts, ("seed",), "2**70", 2**70, "less than or equal"),
            ("judge", "control", lambda h: judge_input(h, kind="ruler"), ("judge", "rubric"), "1MiB",
             "x" * (1 << 20), "at most 65536 characters"),
            ("rollouts", "inference", good_rollouts, ("task", "rollout_timeout_s"), "1e300", 1e300,
             "less than or equal"),
        ]
    ),
    # --- rewards: finite and |r| <= 1e6, the offending trajectory named; nothing written
    *(
        Row(f"rollout-reward-{kind}", "inference", "rollouts",
            lambda h, fn=fn: rollouts_input(f"{TASKS}:rollout", f"{TASKS}:{fn}"),
            BAD_REWARD, ("(scenario 'broken'), trajectory 0 has reward", shown, "|reward| <= 1e+06"))
        for kind, fn, shown in [
            ("nan", "nan_scenarios", "nan"),
            ("inf", "inf_scenarios", "inf"),
            ("negative-inf", "negative_inf_scenarios", "-inf"),
            ("1e200", "huge_scenarios", "1e+200"),
            ("just-over-the-bound", "just_too_big_scenarios", "1000001.0"),
        ]
    ),
    *(
        Row(f"uploaded-reward-{kind}", "control", "compute_advantages",
            lambda h, kind=kind: advantages_input(h.bad_scored[kind]),
            BAD_REWARD, (f"uploaded/{kind}.parquet", "group 1 (scenario 'broken'), trajectory 1 has reward", shown))
        for kind, shown in [("nan", "nan"), ("inf", "inf"), ("huge", "1e+200")]
    ),
    # --- refs: a worker reads only its own object store's objects, never a local file or another bucket
    *(
        Row(f"{activity}-trajectories-{label}", "control", activity,
            lambda h, build=build, uri=uri: replaced(build(h), ("trajectories", "ref", "uri"), uri),
            CONFIG_ERROR, (f"{uri} is not in this worker's object store", "upload the file there"))
        for activity, build, label, uri in [
            ("compute_advantages", lambda h: advantages_input(h.scored), "file-etc-passwd", "file:///etc/passwd"),
            ("compute_advantages", lambda h: advantages_input(h.scored), "file-proc-environ",
             "file:///proc/self/environ"),
            ("compute_advantages", lambda h: advantages_input(h.scored), "other-bucket",
             "s3://someone-elses/runs/x/steps/000001/trajectories.parquet"),
            ("judge", lambda h: judge_input(h, kind="ruler"), "file-worker-home", "file:///etc/hostname"),
        ]
    ),
    *(
        Row(f"reload-checkpoint-{label}", "inference", "reload",
            lambda h, uri=uri: ReloadInput(
                model_name="agent",
                checkpoint=CheckpointRef(run_id=RUN, step=1, uri=uri, manifest_sha256="0" * 64),
            ),
            CONFIG_ERROR, (f"{uri} is not in this worker's object store", "upload the file there"))
        for label, uri in [("file-etc", "file:///etc/"), ("other-bucket", "s3://someone-elses/runs/x/000001/")]
    ),
    # --- sampling logprobs: finite and within [-60, 0], the offending token named; nothing written
    Row("rollout-logprob-placeholder", "inference", "rollouts",
        lambda h: rollouts_input(f"{TASKS}:rollout", f"{TASKS}:placeholder_logprob_scenarios"),
        BAD_LOGPROB, ("(scenario 'broken'), trajectory 0, choice 0, token 0 has sampling logprob -9999.0",
                      "placeholder")),
    *(
        Row(f"uploaded-logprob-{kind}", "control", "compute_advantages",
            lambda h, kind=kind: advantages_input(h.bad_scored[f"logprob-{kind}"]),
            BAD_LOGPROB, (f"uploaded/logprob-{kind}.parquet",
                          "group 1 (scenario 'broken'), trajectory 1, choice 0, token 1 has sampling logprob",
                          repr(logprob), "within [-60, 0]"))
        for kind, logprob in LOGPROBS
    ),
]  # fmt: skip


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
async def test_bad_input_is_refused_clearly_and_loses_nothing(harness: Harness, row: Row) -> None:
    h = harness
    before = h.snapshot()
    queue = h.queues.control if row.queue == "control" else h.queues.inference
    out = await h.call(queue, row.activity, row.input(h))
    assert not out["ok"], out
    assert out["type"] == row.failure_type, out
    # one attempt: the probe allows two, so a retried failure would end MAXIMUM_ATTEMPTS_REACHED
    assert out["non_retryable"] and out["retry_state"] == RetryState.NON_RETRYABLE_FAILURE.name, out
    for words in row.says:
        assert words in out["message"], (words, out["message"])
    # the worker keeps serving: alive, and a good request on the same queue succeeds
    worker = h.control if row.queue == "control" else h.inference
    assert worker.alive()
    if row.queue == "control":
        await expect_ok(h, queue, "compute_advantages", advantages_input(h.scored, run_id=CANARY))
    else:
        await expect_ok(
            h, queue, "rollouts", rollouts_input(f"{TASKS}:rollout", f"{TASKS}:scenarios", CANARY)
        )
    assert h.snapshot() == before  # nothing stored was lost, changed or added
    assert not h.trap.requests  # the attacker's host was never called
    assert_keys_stayed_home(h)


def assert_keys_stayed_home(h: Harness) -> None:
    """No listener saw the S3 secret, and each judge key reached no endpoint but its own."""
    assert not any(r.seen(h.secret) for r in (h.own, h.allowed, h.second, h.trap))
    assert not any(r.seen(JUDGE_KEY) for r in (h.own, h.second, h.trap))
    assert not any(r.seen(SECOND_KEY) for r in (h.own, h.allowed, h.trap))


async def test_each_allowed_judge_endpoint_gets_its_own_key_and_nothing_else(harness: Harness) -> None:
    """The positive side of the pairs: each endpoint, named with its own key variable, gets that key."""
    h = harness
    for endpoint, key_env, key in (
        (h.allowed, JUDGE_KEY_ENV, JUDGE_KEY),
        (h.second, SECOND_KEY_ENV, SECOND_KEY),
    ):
        calls = len(endpoint.requests)
        judged = judge_input(h, kind="ruler", base_url=endpoint.base_url, api_key_env=key_env, model=key_env)
        await expect_ok(h, h.queues.control, "judge", judged.model_copy(update={"run_id": CANARY}))
        new = endpoint.requests[calls:]
        assert new and all(r.headers.get("authorization") == f"Bearer {key}" for r in new)
    assert not h.trap.requests
    assert_keys_stayed_home(h)
