"""The client host of a test cluster: start a ``TrainingRun`` of model ``NAME`` in project ``PROJECT`` (run id
``PROJECT-NAME``, as an ART client names it) judged by RULER on the inference host's server, wait for it, and
report what the object store holds for it, as JSON on stdout (the test reads it; the client is none of the
worker hosts).

    python tests/cluster/client.py PROJECT NAME STEPS
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from activities.object_store import ObjectStore  # noqa: E402
from activities.trajectory_store import download_groups  # noqa: E402
from dgrpo.client import run_control  # noqa: E402
from dgrpo.model import run_id_of  # noqa: E402
from schemas.config import RunSpec  # noqa: E402
from schemas.layout import MANIFEST_NAME, checkpoint_prefix, scored_key, trajectories_key  # noqa: E402
from schemas.settings import S3Settings  # noqa: E402
from workers.temporal import connect_client  # noqa: E402


def judged(store: ObjectStore, run_id: str, step: int) -> list[dict[str, float]]:
    """The judge metrics of each trajectory the step's judge scored (its first attempt that wrote any)."""
    for attempt in range(1, 6):
        if store.exists(key := scored_key(run_id, step, attempt)):
            groups = download_groups(store, key)
            return [
                {k: float(v) for k, v in t.metrics.items() if k in ("judge_fallback", "ruler_score")}
                for g in groups
                for t in g.trajectories
            ]
    return []


async def main(project: str, name: str, steps: int) -> None:
    run_id = run_id_of(project, name)
    data = json.loads((REPO / "examples" / "run.json").read_text())
    data.update(run_id=run_id, steps=steps, metrics={"wandb": False}, train={"learning_rate": 2e-4})
    data["model"].update(project=project, name=name)
    # RULER on the base model of the inference host's server, which the control host reaches at
    # $DGRPO_INFERENCE_URL; few tokens: a malformed reply still counts as judged (judge_fallback = 1)
    data["judge"] = {"kind": "ruler", "max_tokens": 48}
    client = await connect_client()
    handle = await run_control.start_run(client, RunSpec.model_validate(data))
    final = await run_control.watch(handle, lambda _: None, interval=1.0)
    store = ObjectStore(S3Settings.from_env())
    report = {
        "phase": final.phase,
        "step": final.step,
        "history": [{"step": h.step, "n_trajectories": h.n_trajectories} for h in final.history],
        "trajectories": [store.exists(trajectories_key(run_id, n)) for n in range(1, steps + 1)],
        "manifests": [store.exists(checkpoint_prefix(run_id, n) + MANIFEST_NAME) for n in range(steps + 1)],
        "judged": [judged(store, run_id, n) for n in range(1, steps + 1)],
    }
    print(json.dumps(report))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
