"""ART's ``art.langgraph``: a LangGraph (LangChain) agent trained as an ART rollout.

    async def rollout(model, scenario) -> art.Trajectory:
        agent = create_react_agent(init_chat_model(model.name, temperature=1.0), tools)
        result = await agent.ainvoke({"messages": [("user", scenario.question)]})
        return art.Trajectory(reward=score(result), messages_and_choices=[])

    trajectory = await wrap_rollout(model, rollout)(model, scenario)

``wrap_rollout`` (dgrpo/langgraph/rollout.py) runs the rollout under dgrpo's capture, so the chat completions of
its LangChain chat model (``init_chat_model``, dgrpo/langgraph/chat_model.py) become the returned trajectory's
messages and choices, with their logprobs and token ids. LangChain is not a dependency of dgrpo:
``init_chat_model`` raises an ``ImportError`` naming the ``pip install`` when it is missing.
"""

from __future__ import annotations

from dgrpo.langgraph.chat_model import init_chat_model
from dgrpo.langgraph.rollout import wrap_rollout

__all__ = ["init_chat_model", "wrap_rollout"]
