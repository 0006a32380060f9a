"""/v1/embeddings over the engine's Embedder (MiniLM through llama.cpp), with OpenAI's encodings."""

from __future__ import annotations

import base64
import os

import numpy as np

from localspec.engine.embedder import Embedder
from localspec.errors import RequestError


class EmbeddingModel:
    def __init__(self, path: str | os.PathLike[str], n_threads: int | None = None,
                 embedder: Embedder | None = None) -> None:
        if embedder is None:
            from localspec.models import validate_gguf

            # A clean IntegrityError for a truncated or foreign file, before llama.cpp sees it.
            validate_gguf(os.fspath(path))
        self._embedder = embedder or Embedder(path, n_threads=n_threads or 2)

    @property
    def window(self) -> int:
        return self._embedder.window

    def embed(self, texts: list[str], *, max_tokens: int | None = None,
              truncate: bool = False) -> tuple[list[np.ndarray], int]:
        """Unit vectors for `texts` and the tokens they took. Every text is measured before any is
        embedded: a text that does not fit (unless `truncate`: its start that fits is embedded), or a
        request over `max_tokens` in all, raises RequestError and costs no embedding work."""
        counts = []
        texts = list(texts)
        for i, text in enumerate(texts):
            if not text:
                raise RequestError(f"Input {i} is empty.", "Leave empty texts out, or send some text in their place.")
            n = self._embedder.count_tokens(text)
            if n > self.window and truncate:
                texts[i] = self._embedder.truncated(text)
                n = self._embedder.count_tokens(texts[i])
            if n > self.window:
                raise RequestError(f"Input {i} has {n} tokens; the embedding model takes at most {self.window}.",
                                   "Split long texts into chunks.")
            counts.append(n)
            # As they are measured: cutting each text is a search of tokenizations, and a body of long
            # texts over the budget cut them all (seconds of the embedder's lock) before its 400.
            if max_tokens is not None and sum(counts) > max_tokens:
                more = " or more" if i < len(texts) - 1 else ""
                raise RequestError(f"The inputs have {sum(counts)}{more} tokens together; this server embeds at "
                                   f"most {max_tokens} per request.", "Send them in several requests.")
        vectors: list[np.ndarray] = []
        for i, text in enumerate(texts):
            vec = self._embedder.embed(text)
            if vec is None:
                raise RequestError(f"Input {i} cannot be embedded.", "Check the text.")
            vectors.append(vec)
        return vectors, sum(counts)

    def close(self) -> None:
        self._embedder.close()


def encode(vec: np.ndarray, encoding_format: str) -> list[float] | str:
    """`float`: a JSON list; `base64`: little-endian float32 bytes, which the openai client decodes."""
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(vec, dtype="<f4").tobytes()).decode("ascii")
    return [float(x) for x in vec]
