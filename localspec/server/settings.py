"""How the endpoint runs: bind address, auth, limits. Validated once at start-up."""

from __future__ import annotations

import ipaddress
import os
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from localspec.cache.policy import cache_judge_kind
from localspec.errors import ConfigError

API_KEY_ENV = "LOCALSPEC_API_KEY"


class ServerSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    api_key: str | None = Field(None, description=f"Bearer key; defaults to ${API_KEY_ENV}")
    profile: str | None = None
    target: str | None = None  # model ids overriding the profile's
    draft: str | None = None
    parallel: int = Field(4, ge=1, le=64, description="sequence slots decoding together")
    max_queue: int = Field(16, ge=0, description="requests waiting beyond the slots before 429")
    n_ctx: int | None = Field(None, ge=64, description="context per slot; default: the profile's")
    n_threads: int | None = Field(None, ge=1)
    mode: str | None = Field(None, description="engine speculation mode; default: settings/auto")
    max_body_bytes: int = Field(4 << 20, ge=1024)
    max_tokens_cap: int = Field(4096, ge=1, description="largest max_tokens a request may ask for")
    cors_origins: list[str] = Field(default_factory=list, description="empty: CORS off")
    retry_after_s: int = Field(2, ge=1)
    embeddings: bool = Field(True, description="serve the profile's embedding model on /v1/embeddings")
    cache: bool = Field(True, description="answer repeated deterministic requests from the semantic cache")
    cache_sampled: bool = Field(False, description="also cache sampled answers (temperature > 0, no seed)")
    cache_semantic: bool = Field(False, description="also serve near-duplicates (embedding similarity + guard)")
    cache_judge: Literal["model", "scorer", "rules"] = Field(
        "model", description="who confirms a near-duplicate: the answering model, the learned pair scorer "
                             "(milliseconds), or the guard's rules alone")

    @field_validator("cache_judge", mode="before")
    @classmethod
    def _judge_switch(cls, value: object) -> object:
        return cache_judge_kind(value) if isinstance(value, bool) else value  # the older on/off form
    router: bool = Field(True, description="model 'auto' routes between the profile's tiers")

    def with_env_key(self) -> ServerSettings:
        if self.api_key is None and os.environ.get(API_KEY_ENV):
            return self.model_copy(update={"api_key": os.environ[API_KEY_ENV]})
        return self

    def check_bind(self) -> None:
        """Refuse to expose an unauthenticated model server beyond this machine."""
        if not is_loopback(self.host) and not self.api_key:
            raise ConfigError(
                f"Refusing to listen on {self.host} without an API key: anyone on the network could use it.",
                f"Pass --api-key (or set {API_KEY_ENV}), or bind to 127.0.0.1.",
            )


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything
