"""ART's ``art.mcp``: an MCP server's tools and resources as types, and ``generate_scenarios``, which asks any
OpenAI-compatible model for tasks an agent could do with them (training scenarios for an MCP agent)."""

from __future__ import annotations

from dgrpo.mcp.generate_scenarios import generate_scenarios
from dgrpo.mcp.types import GeneratedScenario, GeneratedScenarioCollection, MCPResource, MCPTool

complete_task_tool = MCPTool(
    name="complete_task",
    description="Complete a task",
    parameters={
        "type": "object",
        "properties": {"summary": {"type": "string", "description": "Summary of accomplishments"}},
        "required": ["summary"],
    },
)
"""The tool an MCP agent calls to say it is done (ART's ``default_tools.complete_task_tool``)."""

__all__ = [
    "GeneratedScenario",
    "GeneratedScenarioCollection",
    "MCPResource",
    "MCPTool",
    "complete_task_tool",
    "generate_scenarios",
]
