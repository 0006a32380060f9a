"""What third-party clients (litellm, langchain, pydantic-ai, instructor, openai-agents) send and read,
reproduced on the wire with httpx and the official `openai` client: a real server on loopback over a
scripted model (tests/fake_tier.py). The clients themselves are not installed by the dev extras; each
case names the one whose request it copies (field-tested against `localspec serve` with the real pair).
"""

from __future__ import annotations

import openai
import pytest

from localspec.server import ServerSettings
from tests.fake_tier import ScriptedEmbedder, one_model_app
from tests.server_harness import ServerThread

MODEL = "scripted-clients"
EMBEDDER = "scripted-embedder"


@pytest.fixture(scope="module")
def served(module_home):
    app, _ = one_model_app(model_id=MODEL, script=lambda prompt: "Hello.", embedder=ScriptedEmbedder(),
                           embedding_id=EMBEDDER,
                           settings=ServerSettings(cache=False, router=False, max_tokens_cap=256))
    with ServerThread(app) as srv:
        yield srv


@pytest.mark.parametrize("ids", [[[9906, 1917]], [9906, 1917]])
def test_token_ids_for_embedding_name_the_setting_that_sends_texts(served, ids):
    """langchain's OpenAIEmbeddings (check_embedding_ctx_length, on by default) tokenizes with tiktoken
    and sends the ids: OpenAI's tokenizer's, which no local embedding model reads. The 400 said
    "token ids are not supported" and not which setting sends the texts."""
    client = openai.OpenAI(base_url=f"{served.base_url}/v1", api_key="unused", max_retries=0, timeout=60)
    with pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(model=EMBEDDER, input=ids)
    assert caught.value.body["param"] == "input"
    assert "token ids" in caught.value.body["message"]
    assert "check_embedding_ctx_length=False" in caught.value.body["message"]
    assert len(client.embeddings.create(model=EMBEDDER, input=["hello", "world"]).data) == 2

