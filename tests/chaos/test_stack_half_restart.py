"""Half a crashed stack: ``EmbeddedStack(home).start()`` restarts only the dead server, on its recorded ports."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest
from temporalio.client import Client, WorkflowExecutionStatus

from activities.object_store import ObjectStore
from workers.stack import EmbeddedStack, StackState


def crash(pid: int) -> None:
    process = psutil.Process(pid)
    process.kill()
    process.wait(10)


async def workflow_status(address: str, workflow_id: str) -> WorkflowExecutionStatus | None:
    client = await Client.connect(address)
    return (await client.get_workflow_handle(workflow_id).describe()).status


@pytest.mark.parametrize("dead", ["seaweed", "temporal"])
async def test_only_the_dead_half_restarts_on_its_ports(tmp_path: Path, dead: str) -> None:
    home = tmp_path / "home"
    before = EmbeddedStack(home, free_ports=True, ui=False, tied_to_parent=True).start()
    restarted = EmbeddedStack(home, free_ports=True, ui=False, tied_to_parent=True)
    try:
        client = await Client.connect(before.temporal_address)
        await client.start_workflow("Durable", id="wf-half", task_queue="tq-half")
        ObjectStore(restarted.s3_settings).put_bytes("kept/z", b"before the crash")
        crash((before.seaweed if dead == "seaweed" else before.temporal).pid)

        after = restarted.start()
        if dead == "seaweed":  # the live half is the same process; the dead one a new one
            assert after.temporal == before.temporal and after.seaweed.pid != before.seaweed.pid
        else:
            assert after.seaweed == before.seaweed and after.temporal.pid != before.temporal.pid
        assert (after.temporal_port, after.s3_port, after.weed_ports) == (
            before.temporal_port,
            before.s3_port,
            before.weed_ports,
        )
        assert StackState.model_validate_json(restarted.state_path.read_text()) == after
        assert await workflow_status(after.temporal_address, "wf-half") == WorkflowExecutionStatus.RUNNING
        assert ObjectStore(restarted.s3_settings).get_bytes("kept/z") == b"before the crash"
    finally:
        restarted.stop()
