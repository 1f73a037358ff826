"""ART's ``art.mcp.types``: an MCP server's tools and resources as a rollout hands them to a model, and the
task scenarios ``generate_scenarios`` asks a model for."""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, overload

from dgrpo.utils.logging import _C, dim, info


@dataclass
class MCPTool:
    """A tool an MCP server offers: its name, description and JSON-schema parameters."""

    name: str
    description: str
    parameters: dict[str, Any]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MCPTool:
        return cls(data.get("name", ""), data.get("description", ""), data.get("parameters", {}))

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "parameters": self.parameters}

    def to_tool_schema(self) -> dict[str, Any]:
        """The tool as a chat completion's ``tools`` entry."""
        return {"type": "function", "function": self.to_dict()}


@dataclass
class MCPResource:
    """A resource an MCP server offers (MCP's ``mimeType`` is ``mime_type`` here)."""

    uri: str
    name: str
    description: str
    mime_type: str | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MCPResource:
        mime = data.get("mimeType") or data.get("mime_type")
        return cls(data.get("uri", ""), data.get("name", ""), data.get("description", ""), mime)

    def to_dict(self) -> dict[str, Any]:
        out = {"uri": self.uri, "name": self.name, "description": self.description}
        return {**out, "mimeType": self.mime_type} if self.mime_type else out


@dataclass
class GeneratedScenario:
    """A task for an agent, rated 1 (one tool call) to 5 (a long multi-step analysis)."""

    task: str
    difficulty: int

    def __post_init__(self) -> None:
        if not isinstance(self.difficulty, int) or not 1 <= self.difficulty <= 5:
            raise ValueError("Difficulty must be an integer between 1 and 5")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GeneratedScenario:
        return cls(task=data["task"], difficulty=data["difficulty"])

    def to_dict(self) -> dict[str, Any]:
        return {"task": self.task, "difficulty": self.difficulty}

    def preview(self, max_length: int = 120) -> str:
        return self.task if len(self.task) <= max_length else self.task[:max_length].strip() + "…"


class GeneratedScenarioCollection:
    """Scenarios, with the splitting, filtering and summaries a training script wants."""

    def __init__(self, scenarios: list[GeneratedScenario]) -> None:
        self.scenarios = scenarios

    @classmethod
    def from_dicts(cls, data: list[dict[str, Any]]) -> GeneratedScenarioCollection:
        return cls([GeneratedScenario.from_dict(item) for item in data])

    @classmethod
    def from_json(cls, text: str) -> GeneratedScenarioCollection:
        """From ``{"scenarios": [...]}``, a bare list, or an object whose first value is the list."""
        data = json.loads(text)
        if isinstance(data, dict):
            data = data["scenarios"] if "scenarios" in data else next(iter(data.values()))
        return cls.from_dicts(data)

    def to_dicts(self) -> list[dict[str, Any]]:
        return [s.to_dict() for s in self.scenarios]

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps({"scenarios": self.to_dicts()}, indent=indent)

    def __len__(self) -> int:
        return len(self.scenarios)

    def __iter__(self) -> Iterator[GeneratedScenario]:
        return iter(self.scenarios)

    @overload
    def __getitem__(self, index: int) -> GeneratedScenario: ...

    @overload
    def __getitem__(self, index: slice) -> list[GeneratedScenario]: ...

    def __getitem__(self, index: int | slice) -> GeneratedScenario | list[GeneratedScenario]:
        return self.scenarios[index]

    def shuffle(self) -> GeneratedScenarioCollection:
        """A new collection, in a random order."""
        return GeneratedScenarioCollection(random.sample(self.scenarios, len(self.scenarios)))

    def split(self, train_size: int) -> tuple[GeneratedScenarioCollection, GeneratedScenarioCollection]:
        """The first ``train_size`` scenarios and the rest."""
        if train_size > len(self.scenarios):
            raise ValueError(
                f"train_size ({train_size}) cannot be larger than total scenarios ({len(self.scenarios)})"
            )
        return (
            GeneratedScenarioCollection(self.scenarios[:train_size]),
            GeneratedScenarioCollection(self.scenarios[train_size:]),
        )

    def filter_by_difficulty(
        self, min_difficulty: int = 1, max_difficulty: int = 5
    ) -> GeneratedScenarioCollection:
        return GeneratedScenarioCollection(
            [s for s in self.scenarios if min_difficulty <= s.difficulty <= max_difficulty]
        )

    def get_difficulty_distribution(self) -> Counter[int]:
        return Counter(s.difficulty for s in self.scenarios)

    def preview(self, n: int = 5, max_task_length: int = 120) -> None:
        for i, s in enumerate(self.scenarios[:n], start=1):
            dim(f"   {i}. {s.preview(max_task_length)}  {_C.GRAY}(difficulty {s.difficulty}/5){_C.RESET}")

    def print_difficulty_distribution(self) -> None:
        counts = self.get_difficulty_distribution()
        info("Difficulty distribution:")
        for difficulty in range(1, 6):
            dim(
                f"   {difficulty}/5: {counts.get(difficulty, 0):3d}  {'█' * min(counts.get(difficulty, 0), 30)}"
            )

    def get_summary(self) -> dict[str, Any]:
        n = len(self.scenarios)
        return {
            "total_scenarios": n,
            "difficulty_distribution": dict(self.get_difficulty_distribution()),
            "avg_difficulty": sum(s.difficulty for s in self.scenarios) / n if n else 0,
            "avg_task_length": sum(len(s.task) for s in self.scenarios) / n if n else 0,
        }
