"""An ART program on the client host of a test cluster: ``TemporalBackend`` to the cluster's Temporal, the
model a run trained registered by its project and name, and ``model.openai_client()`` asking its newest
adapter through the inference server's routable address (``$DGRPO_INFERENCE_URL``, key
``$DGRPO_SERVE_API_KEY``). Reports what it saw as JSON on stdout.

    python tests/cluster/art_client.py PROJECT NAME
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import dgrpo as art  # noqa: E402
from serving.client import ServingClient  # noqa: E402


async def main(project: str, name: str) -> None:
    backend = art.TemporalBackend(worker_timeout=120.0)
    model = art.TrainableModel(name=name, project=project, base_model="smollm2-135m-instruct")
    await model.register(backend)
    assert model.inference_base_url is not None
    completion = await model.openai_client().chat.completions.create(
        model=model.name,  # as ART programs ask: the client routes it to the newest served step
        messages=[{"role": "user", "content": "What is 2 + 3? Answer with the number."}],
        max_tokens=8,
        temperature=0.0,
        logprobs=True,
    )
    choice = completion.choices[0]
    served = await ServingClient(model.inference_base_url).models()
    print(
        json.dumps(
            {
                "step": await model.get_step(),
                "inference_name": model.get_inference_name(),
                "base_url": model.inference_base_url,
                "served": sorted(str(m["id"]) for m in served),
                "answered_by": completion.model,
                "content": choice.message.content,
                "logprobs": len(choice.logprobs.content or []) if choice.logprobs else 0,
            }
        )
    )


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
