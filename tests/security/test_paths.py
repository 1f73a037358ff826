"""Local paths built from a run's names stay under their root: the trainer's staging root.

Activity inputs already refuse names that are not one path component (``schemas.refs.Name``; the table in
test_bad_inputs.py shows the workers refuse them); these checks hold even when a name slips past that.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.checkpoints import oom_state_file, run_dir, staging_dir
from activities.object_store import ObjectStore
from activities.training import TrainerActivities
from schemas.activities import PublishInput
from schemas.errors import CONFIG_ERROR, UnsafePathError


@pytest.mark.parametrize("run_id", ["..", "../outside", "../../etc", "/etc", "a/../../b", "", "."])
def test_paths_from_a_hostile_run_id_are_refused(tmp_path: Path, run_id: str) -> None:
    root = tmp_path / "staging"
    for build in (lambda: staging_dir(root, run_id, 1), lambda: oom_state_file(root, run_id, 1)):
        with pytest.raises(UnsafePathError, match="would leave"):
            build()
    assert not any(tmp_path.iterdir())  # nothing was created anywhere


def test_a_link_out_of_the_root_is_refused(tmp_path: Path) -> None:
    root, outside = tmp_path / "staging", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "run-1").symlink_to(outside)
    with pytest.raises(UnsafePathError):
        run_dir(root, "run-1")
    assert staging_dir(root, "run-2", 3) == root.resolve() / "run-2" / "000003"


async def test_publish_refuses_a_staging_dir_outside_the_runs_own(
    object_store: ObjectStore, tmp_path: Path
) -> None:
    trainer = TrainerActivities(object_store, tmp_path / "staging", worker_id="w1")
    other_run = staging_dir(tmp_path / "staging", "other-run", 1)
    other_run.mkdir(parents=True)
    for staged in (
        "/etc",
        str(tmp_path),
        str(other_run),
        str(tmp_path / "staging" / "run-1" / ".." / "other-run"),
    ):
        inp = PublishInput(run_id="run-1", step=1, staging_dir=staged)
        with pytest.raises(ApplicationError) as refused:
            await ActivityEnvironment().run(trainer.publish, inp)
        assert refused.value.type == CONFIG_ERROR and refused.value.non_retryable
        assert "publish only what train staged" in refused.value.message
    assert object_store.list("") == []  # nothing was uploaded
