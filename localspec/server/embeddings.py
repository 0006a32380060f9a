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

            validate_gguf(path)  # a clean IntegrityError for a truncated or foreign file, before llama.cpp sees it
        self._embedder = embedder or Embedder(path, n_threads=n_threads or 2)

    @property
    def window(self) -> int:
        return self._embedder.window

    def embed(self, texts: list[str]) -> tuple[list[np.ndarray], int]:
        """Unit vectors for `texts` and the tokens they took. Raises RequestError for a text that does not fit."""
        vectors: list[np.ndarray] = []
        tokens = 0
        for i, text in enumerate(texts):
            n = self._embedder.count_tokens(text)
            vec = self._embedder.embed(text)
            if vec is None:
                what = "is empty" if not text else f"has {n} tokens; the embedding model takes at most {self.window}"
                raise RequestError(f"Input {i} {what}.", "Split long texts into chunks.")
            vectors.append(vec)
            tokens += n
        return vectors, tokens

    def close(self) -> None:
        self._embedder.close()


def encode(vec: np.ndarray, encoding_format: str) -> list[float] | str:
    """`float`: a JSON list; `base64`: little-endian float32 bytes, which the openai client decodes."""
    if encoding_format == "base64":
        return base64.b64encode(np.asarray(vec, dtype="<f4").tobytes()).decode("ascii")
    return [float(x) for x in vec]
