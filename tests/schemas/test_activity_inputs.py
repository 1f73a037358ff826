"""Activity inputs and run state as workflow histories carry them: what older histories recorded still decodes,
and a stored scenario list's ref survives the JSON round trip."""

from __future__ import annotations

import json

from schemas.activities import RolloutsInput
from schemas.config import TaskSpec
from schemas.layout import scenarios_key
from schemas.refs import ObjectRef
from schemas.run_state import RunState

SHA = "a" * 64


def test_a_rollouts_input_recorded_with_an_inline_list_and_no_merge_flag_still_decodes() -> None:
    recorded = {
        "run_id": "r",
        "step": 1,
        "model_name": "m",
        "task": {"rollout": "examples.arithmetic:rollout", "scenarios": [{"x": 1}]},
        "groups_per_step": 2,
        "group_size": 2,
    }
    inp = RolloutsInput.model_validate_json(json.dumps(recorded))
    assert inp.task.scenarios == [{"x": 1}] and inp.merged is False


def test_a_stored_scenario_lists_ref_survives_the_json_round_trip() -> None:
    ref = ObjectRef(uri=f"s3://dgrpo/{scenarios_key('r', SHA)}", size=3, sha256=SHA)
    inp = RolloutsInput(
        run_id="r",
        step=1,
        model_name="m",
        task=TaskSpec(rollout="examples.arithmetic:rollout", scenarios=ref),
        groups_per_step=2,
        group_size=2,
        merged=True,
    )
    back = RolloutsInput.model_validate_json(inp.model_dump_json())
    assert back == inp and isinstance(back.task.scenarios, ObjectRef)


def test_a_run_state_recorded_before_stored_scenarios_decodes_without_a_ref() -> None:
    assert RunState.model_validate_json('{"step": 2}').scenarios is None
