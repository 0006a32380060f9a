"""POST /v1/embeddings: the embedding model, loaded on first use, within the server's capacity."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter

from localspec.errors import LocalspecError, RequestError
from localspec.server.embeddings import encode
from localspec.server.errors import ERROR_RESPONSES, APIError
from localspec.server.redact import redact_paths
from localspec.server.schemas import Embedding, EmbeddingList, EmbeddingRequest, EmbeddingUsage
from localspec.server.state import ServerState, State, check_model

router = APIRouter()


@router.post("/v1/embeddings", response_model=EmbeddingList, responses=ERROR_RESPONSES)
async def embeddings(body: EmbeddingRequest, state: State) -> EmbeddingList:
    """A text longer than the model's window is a 400, as on OpenAI."""
    return await embed(body, state, truncate=False)


async def embed(body: EmbeddingRequest, state: ServerState, *, truncate: bool) -> EmbeddingList:
    """The vectors for a request's texts; `truncate`: a text longer than the window is cut to fit
    (Ollama's default) rather than refused."""
    s = state.settings
    # Held from the model check to the last vector: the reaper, a load on demand or `stop` closes
    # these models (and the embedder with them) only once the embedding is done.
    async with state.holding() as (b, _):
        check_model(body.model, b.embedding_names)
        texts = _texts(body, s.max_embedding_inputs)
        with state.admission.hold():  # embeddings share the server's capacity with generations
            try:
                model = await asyncio.to_thread(b.embedder)
            except (LocalspecError, ValueError) as exc:  # a broken embedding file: this model is unusable
                raise APIError(503, f"The embedding model cannot be loaded: {redact_paths(str(exc))}",
                               "model_unusable") from exc
            if model is None:
                raise APIError(404, "This server has no embedding model.", "model_not_found", "model")
            try:
                vectors, n = await asyncio.to_thread(model.embed, texts, max_tokens=s.max_embedding_tokens,
                                                     truncate=truncate)
            except RequestError as exc:
                raise APIError(400, str(exc), "invalid_value", "input") from exc
    data = [Embedding(index=i, embedding=encode(v, body.encoding_format)) for i, v in enumerate(vectors)]
    return EmbeddingList(data=data, model=body.model, usage=EmbeddingUsage(prompt_tokens=n, total_tokens=n))


def _texts(body: EmbeddingRequest, max_inputs: int) -> list[str]:
    """The texts to embed, or a 400 naming what is wrong with the input."""
    given = [body.input] if isinstance(body.input, str) else body.input
    texts = [t for t in given if isinstance(t, str)]
    if given and all(isinstance(t, int) or isinstance(t, list) and all(isinstance(i, int) for i in t) for t in given):
        raise APIError(400, "input holds token ids, which are another tokenizer's (OpenAI's tiktoken), not this "
                       "server's embedding model's: send the texts themselves (langchain's OpenAIEmbeddings sends "
                       "ids unless check_embedding_ctx_length=False).", "invalid_value", "input")
    if not texts or len(texts) != len(given):
        raise APIError(400, "input must be a string or a non-empty list of strings.", "invalid_value", "input")
    if len(texts) > max_inputs:
        raise APIError(400, f"input has {len(texts)} texts; this server embeds at most {max_inputs} "
                       "per request. Send them in several requests.", "too_many_inputs", "input")
    if body.dimensions is not None:
        raise APIError(400, "dimensions is not supported by this embedding model.", "unsupported_value", "dimensions")
    return texts
