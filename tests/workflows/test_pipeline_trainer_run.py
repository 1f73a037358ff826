"""``PipelineTrainer.train()`` starts a pipelined ``TrainingRun`` on the real Temporal dev server (scripted
activities at the seams), and a second ``train()`` with a higher ``max_steps`` continues after the first."""

from __future__ import annotations

from temporalio.client import Client
from test_training_run_logic import running
from workflow_stubs import ScriptedActivities

import dgrpo as art
from dgrpo.pipeline_trainer import PipelineTrainer, make_group_rollout_fn
from examples.arithmetic import rollout, scenarios
from schemas.config import TaskQueues


class ClientBackend(art.TemporalBackend):
    """The test's Temporal client and no workers to wait for: the scripted ones are started here."""

    def __init__(self, client: Client, task_queue: str) -> None:
        queues = TaskQueues(control=task_queue, inference=task_queue, trainer=task_queue)
        super().__init__(task_queues=queues)
        self._client = client

    async def start(self) -> None:
        return None


async def test_pipeline_trainer_runs_a_pipelined_training_run_and_resumes_it(
    client: Client, task_queue: str
) -> None:
    stubs = ScriptedActivities()
    model = art.TrainableModel(
        name="agent-001", project=f"p{task_queue[-8:]}", base_model="smollm2-135m-instruct"
    )
    backend = ClientBackend(client, task_queue)

    def trainer(max_steps: int) -> PipelineTrainer:
        group = make_group_rollout_fn(rollout, n=4)
        return PipelineTrainer(
            model, backend, group, scenarios()[:8], None, min_batch_size=2, max_steps=max_steps
        )

    async with running(stubs, client, task_queue):
        first = await trainer(2).train()
        again = await trainer(3).train()
    assert (first.mode, first.step, first.phase) == ("pipelined", 2, "done")
    assert (again.step, again.phase) == (3, "done")
    # The second run continued after checkpoint 2: steps 1 and 2 were trained once.
    assert [step for name, step in stubs.calls if name == "train"] == [1, 2, 3]
