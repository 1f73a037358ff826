"""ART's ``art.mcp.generate_scenarios``: ask a model (by default ``openai/gpt-4.1-mini`` on OpenRouter) for task
scenarios an agent could carry out with an MCP server's tools and resources, as a JSON-schema response."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import openai

from dgrpo.mcp.types import GeneratedScenarioCollection, MCPResource, MCPTool
from dgrpo.utils.logging import info, ok

PROMPT = """You write realistic tasks for testing AI agents that work through an MCP (Model Context Protocol) server.

The server offers these tools:
{tools}

and these resources:
{resources}

Write {n} different tasks a real user could want done with them. Vary them: some need one or two tool calls,
others several tools combined; cover different uses, without naming which tools to use. Rate each task's
difficulty from 1 (a single tool call) to 5 (a long multi-step analysis). Every task asks, at its end, for a
summary of the work done and a thorough analysis and report of the results.

Answer with a JSON object whose "scenarios" array holds exactly {n} objects, each with "task" (a string) and
"difficulty" (an integer from 1 to 5)."""


def _as_dict(item: Any) -> dict[str, Any]:
    return item.to_dict() if isinstance(item, MCPTool | MCPResource) else dict(item)


def response_schema(n: int) -> dict[str, Any]:
    scenario = {
        "type": "object",
        "properties": {
            "task": {"type": "string"},
            "difficulty": {"type": "integer", "minimum": 1, "maximum": 5},
        },
        "required": ["task", "difficulty"],
        "additionalProperties": False,
    }
    return {
        "type": "object",
        "properties": {"scenarios": {"type": "array", "items": scenario, "minItems": n, "maxItems": n}},
        "required": ["scenarios"],
        "additionalProperties": False,
    }


async def generate_scenarios(
    tools: Sequence[MCPTool] | Sequence[dict[str, Any]],
    resources: Sequence[MCPResource] | Sequence[dict[str, Any]] | None = None,
    num_scenarios: int = 24,
    show_preview: bool = True,
    custom_instructions: str | None = None,
    generator_model: str = "openai/gpt-4.1-mini",
    generator_api_key: str | None = None,
    generator_base_url: str = "https://openrouter.ai/api/v1",
) -> GeneratedScenarioCollection:
    """``num_scenarios`` scenarios for the server's ``tools`` and ``resources``, from ``generator_model`` at
    ``generator_base_url`` (any OpenAI-compatible endpoint; key: ``generator_api_key`` or ``$OPENROUTER_API_KEY``).
    Raises ``ValueError`` when there is no key, nothing to use, or a reply with another number of scenarios."""
    api_key = generator_api_key or os.environ.get("OPENROUTER_API_KEY")
    if not api_key:
        raise ValueError("generator_api_key is required or OPENROUTER_API_KEY env var must be set")
    if not tools and not resources:
        raise ValueError("At least one tool or resource must be provided")
    tools_info = [_as_dict(t) for t in tools]
    resources_info = [_as_dict(r) for r in resources or []]
    info(f"Generating {num_scenarios} scenarios with {generator_model}: {len(tools_info)} tool(s), "
         f"{len(resources_info)} resource(s)")  # fmt: skip
    prompt = PROMPT.format(
        tools=json.dumps(tools_info, indent=2),
        resources=json.dumps(resources_info, indent=2) if resources_info else "No resources available",
        n=num_scenarios,
    )
    if custom_instructions:
        prompt += f"\n\nFollow these instructions closely:\n\n{custom_instructions}"
    async with openai.AsyncOpenAI(api_key=api_key, base_url=generator_base_url) as client:
        response = await client.chat.completions.create(
            model=generator_model,
            messages=[{"role": "user", "content": prompt}],
            max_completion_tokens=8000,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "scenario_list", "schema": response_schema(num_scenarios)},
            },
        )
    content = response.choices[0].message.content
    if content is None:
        raise ValueError("Model response content is None")
    collection = GeneratedScenarioCollection.from_json(content)
    if len(collection) != num_scenarios:
        raise ValueError(f"Expected {num_scenarios} scenarios, got {len(collection)}")
    collection.print_difficulty_distribution()
    if show_preview:
        collection.preview(n=min(5, num_scenarios))
    ok(f"Generated {len(collection)} scenarios")
    return collection
