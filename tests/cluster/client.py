"""The client host of a test cluster: start a ``TrainingRun``, wait for it, and report what the object store
holds for it, as JSON on stdout (the test reads it; the client is none of the worker hosts).

    python tests/cluster/client.py RUN_ID STEPS
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from activities.object_store import ObjectStore  # noqa: E402
from dgrpo import run_control  # noqa: E402
from schemas.config import RunSpec  # noqa: E402
from schemas.layout import MANIFEST_NAME, checkpoint_prefix, trajectories_key  # noqa: E402
from schemas.settings import S3Settings  # noqa: E402
from workers.temporal import connect_client  # noqa: E402


async def main(run_id: str, steps: int) -> None:
    data = json.loads((REPO / "examples" / "run.json").read_text())
    data.update(run_id=run_id, steps=steps, metrics={"wandb": False}, train={"learning_rate": 2e-4})
    data["model"]["name"] = run_id
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
    }
    print(json.dumps(report))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
