"""The endpoint's shapes for a thinking model's thought (engine/thoughts.py splits it from the
answer): the Responses API's reasoning item and its text."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class ReasoningText(BaseModel):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class OutputReasoning(BaseModel):
    """The Responses API's reasoning output item, before the message: the thought as its text (nothing
    here summarizes or encrypts it)."""

    type: Literal["reasoning"] = "reasoning"
    id: str
    summary: list[dict[str, str]] = Field(default_factory=list)  # none: the thought is whole in content
    content: list[ReasoningText]
    status: Literal["in_progress", "completed", "incomplete"]
