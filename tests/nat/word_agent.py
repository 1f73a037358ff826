"""A NeMo Agent Toolkit user's own plugin, as NAT's ART example has one: the workflow (one LLM call through
LangChain, registered with NAT's LangChain profiler hooks, without which NAT's ART trainer sees no LLM call to
train on) and the reward (how close the reply came to the word the dataset expects: difflib's match ratio, as
examples/shaping.py scores a reply), named in tests/nat/config.yml.

Loaded by NAT only, in its own environment (``.venv-nat``), as NAT loads a user's plugin: through its
``nat.components`` entry point (test_nat_trainer.py registers this module so).
"""

from __future__ import annotations

import difflib
from collections.abc import AsyncIterator
from typing import Any

from nat.builder.builder import Builder, EvalBuilder
from nat.builder.evaluator import EvaluatorInfo
from nat.builder.framework_enum import LLMFrameworkEnum
from nat.builder.function_info import FunctionInfo
from nat.cli.register_workflow import register_evaluator, register_function
from nat.data_models.component_ref import LLMRef
from nat.data_models.evaluator import EvalInputItem, EvaluatorBaseConfig
from nat.data_models.function import FunctionBaseConfig
from nat.plugins.eval.data_models.evaluator_io import EvalOutputItem
from nat.plugins.eval.evaluator.base_evaluator import BaseEvaluator


class WordAgentConfig(FunctionBaseConfig, name="word_agent"):  # type: ignore[call-arg]
    """Ask the LLM the dataset's question; its reply is the answer."""

    llm_name: LLMRef


@register_function(config_type=WordAgentConfig, framework_wrappers=[LLMFrameworkEnum.LANGCHAIN])
async def word_agent(config: WordAgentConfig, builder: Builder) -> AsyncIterator[Any]:
    llm = await builder.get_llm(config.llm_name, wrapper_type=LLMFrameworkEnum.LANGCHAIN)

    async def reply(question: str) -> str:
        answer = await llm.ainvoke([("human", question)])
        return str(answer.content)

    yield FunctionInfo.from_fn(reply, description="the LLM's reply to the question")


class WordClosenessConfig(EvaluatorBaseConfig, name="word_closeness"):  # type: ignore[call-arg]
    """The reply's closeness to the expected word."""


class WordCloseness(BaseEvaluator):
    async def evaluate_item(self, item: EvalInputItem) -> EvalOutputItem:
        reply, word = str(item.output_obj or "").strip(), str(item.expected_output_obj)
        score = difflib.SequenceMatcher(None, reply, word).ratio()
        return EvalOutputItem(id=item.id, score=score, reasoning={"reply": reply, "word": word})


@register_evaluator(config_type=WordClosenessConfig)
async def word_closeness(config: WordClosenessConfig, builder: EvalBuilder) -> AsyncIterator[Any]:
    evaluator = WordCloseness(builder.get_max_concurrency())
    yield EvaluatorInfo(config=config, evaluate_fn=evaluator.evaluate, description="closeness to the word")
