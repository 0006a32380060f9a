"""What two requests must share before one's answer may serve the other.

The prompt text is compared by the lookup; everything else that shapes the answer goes into the
scope key: the model file (by hash), the system prompt, the earlier turns, the sampling
parameters (include max_tokens and stop strings there) and whether tools or a response format
were given. Two requests with different scope keys never see each other's entries.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

LOCAL_OWNER = "local"  # the machine's user: the chat app, and every client of a server without keys


def _digest(value: Any) -> str:
    blob = json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def _plain(value: Any) -> Any:
    """Pydantic models and mappings to plain JSON-able values."""
    if hasattr(value, "model_dump"):
        return value.model_dump()
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


class PromptKind(StrEnum):
    CHAT = "chat"  # the last user message: answered, so a reworded question may share the answer
    COMPLETION = "completion"  # a raw prompt: continued character by character, matched only as it is


@dataclass(frozen=True)
class CacheScope:
    model_hash: str
    system_hash: str
    history_hash: str
    sampling_hash: str
    has_tools: bool = False
    has_response_format: bool = False
    kind: PromptKind = PromptKind.CHAT
    owner: str = LOCAL_OWNER  # whose entries these are: one API key's clients never see another's

    @classmethod
    def from_request(
        cls,
        model_hash: str,
        system_prompt: str | None = None,
        earlier_turns: Sequence[Any] = (),
        sampling: Mapping[str, Any] | Any = None,
        has_tools: bool = False,
        has_response_format: bool = False,
        kind: PromptKind = PromptKind.CHAT,
        *,
        owner: str = LOCAL_OWNER,
    ) -> CacheScope:
        """`earlier_turns`: the messages before the last user message (dicts or pydantic models)."""
        return cls(
            model_hash=model_hash,
            system_hash=_digest(system_prompt or ""),
            history_hash=_digest(_plain(list(earlier_turns))),
            sampling_hash=_digest(_plain(sampling or {})),
            has_tools=bool(has_tools),
            has_response_format=bool(has_response_format),
            kind=PromptKind(kind),
            owner=owner,
        )

    @property
    def key(self) -> str:
        parts: list[Any] = [self.model_hash, self.system_hash, self.history_hash, self.sampling_hash,
                            self.has_tools, self.has_response_format, self.kind]
        if self.owner != LOCAL_OWNER:  # the local owner's keys stay as they were before owners existed
            parts.append(self.owner)
        return _digest(parts)[:32]
