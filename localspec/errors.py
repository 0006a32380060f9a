"""One error type that every face can print as a single line: what went wrong, and the fix."""

from __future__ import annotations


class LocalspecError(Exception):
    """An expected failure with a cause and a fix, shown to users without a traceback."""

    def __init__(self, cause: str, fix: str | None = None) -> None:
        super().__init__(cause)
        self.cause = cause
        self.fix = fix

    def __str__(self) -> str:
        return f"{self.cause} Fix: {self.fix}" if self.fix else self.cause


class UsageError(LocalspecError):
    """A command line that cannot run as given (flags that conflict or do not parse): exit status 2,
    like argparse's own usage errors. Every other LocalspecError is a runtime failure (status 1)."""


class ConfigError(LocalspecError):
    """A malformed registry, overlay or settings file."""


class ModelNotFoundError(LocalspecError):
    """An unknown model id, or a model that is not installed."""


class DownloadError(LocalspecError):
    """Every source of a model failed."""


class DiskFullError(DownloadError):
    """The disk filled up while writing a model file; the partial file was removed."""


class IntegrityError(LocalspecError):
    """A file whose hash, size or GGUF header is wrong."""


class IncompatibleDraftError(LocalspecError):
    """A draft model whose tokenizer does not match the target's."""


class IncompatibleAdapterError(LocalspecError):
    """A LoRA adapter that is not a LoRA, or was made for another base model."""


class RequestError(LocalspecError):
    """A generation request that cannot be served as given (bad parameters, too long)."""


class ContextOverflowError(RequestError):
    """The prompt does not fit in the context window."""

    def __init__(self, prompt_tokens: int, n_ctx: int, fix: str | None = None) -> None:
        super().__init__(
            f"The prompt has {prompt_tokens} tokens but the context holds {n_ctx}.",
            fix or "Shorten the prompt, raise n_ctx, or enable the 'truncate' policy for chats.",
        )
        self.prompt_tokens = prompt_tokens
        self.n_ctx = n_ctx


class PredictionTooLongError(RequestError):
    """A prediction (Predicted Outputs) longer than the context could ever hold as an answer."""

    def __init__(self, prediction_tokens: int, n_ctx: int) -> None:
        super().__init__(
            f"The prediction has {prediction_tokens} tokens but the context holds {n_ctx}.",
            "Send a shorter prediction (the part of the answer you expect), or raise n_ctx.",
        )
        self.prediction_tokens = prediction_tokens
        self.n_ctx = n_ctx
