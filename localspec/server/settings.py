"""How the endpoint runs: bind address, auth, limits. Validated once at start-up."""

from __future__ import annotations

import ipaddress
import os
import stat
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from localspec.cache.policy import cache_judge_kind
from localspec.errors import ConfigError, UsageError
from localspec.server.keepalive import parse_keep_alive

API_KEY_ENV = "LOCALSPEC_API_KEY"


class ServerSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    api_key: str | None = Field(None, description=f"Bearer key; defaults to ${API_KEY_ENV}")
    api_key_file: Path | None = Field(None, description="a file of Bearer keys, one per line; each key is its own "
                                                        "cache scope")
    allowed_hosts: list[str] = Field(default_factory=list, description="Host names answered beyond loopback "
                                                                       "(without a key)")
    allowed_origins: list[str] = Field(default_factory=list, description="browser origins allowed (and given CORS) "
                                                                         "beyond loopback pages")
    ssl_certfile: Path | None = Field(None, description="TLS certificate (PEM); with ssl_keyfile, serve HTTPS")
    ssl_keyfile: Path | None = Field(None, description="TLS private key (PEM)")
    max_embedding_inputs: int = Field(2048, ge=1, description="texts in one /v1/embeddings request")
    max_embedding_tokens: int = Field(65536, ge=1, description="tokens in one /v1/embeddings request, all inputs")
    profile: str | None = None
    target: str | None = None  # model ids overriding the profile's
    draft: str | None = None
    parallel: int = Field(4, ge=1, le=64, description="sequence slots decoding together")
    max_queue: int = Field(16, ge=0, description="requests waiting beyond the slots before 429")
    n_ctx: int | None = Field(None, ge=64, description="context per slot; default: the profile's")
    n_threads: int | None = Field(None, ge=1)
    mode: str | None = Field(None, description="engine speculation mode; default: settings/auto")
    lora_path: str | None = Field(None, description="LoRA adapter GGUF applied to the target (not the draft)")
    lora_scale: float = Field(1.0, allow_inf_nan=False, description="the adapter's scale")
    max_body_bytes: int = Field(4 << 20, ge=1024)
    request_timeout_s: float = Field(60.0, gt=0, le=3600, allow_inf_nan=False,
                                     description="seconds a client has to send a request's head, and again its body")
    max_connections: int | None = Field(None, ge=8, le=65536, description="open connections at once; default: 512, "
                                                                            "or half the descriptor limit")
    max_tokens_cap: int = Field(4096, ge=1, description="largest max_tokens a request may ask for")
    cors_origins: list[str] = Field(default_factory=list, description="older name of allowed_origins")
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
    keep_alive: str = Field("5m", description="how long the models stay loaded after the last request (5m, "
                                              "seconds, 0 = after each request, -1 = forever); a request's "
                                              "keep_alive overrides it")

    @field_validator("keep_alive")
    @classmethod
    def _keep_alive(cls, v: str) -> str:
        parse_keep_alive(v)
        return v

    def with_env_key(self) -> ServerSettings:
        if self.api_key is None and os.environ.get(API_KEY_ENV):
            return self.model_copy(update={"api_key": os.environ[API_KEY_ENV]})
        return self

    @property
    def origins(self) -> list[str]:
        return [*self.allowed_origins, *self.cors_origins]

    def keys(self) -> list[str]:
        """Every Bearer key: --api-key (or $LOCALSPEC_API_KEY) and the lines of --api-key-file."""
        keys = [self.api_key] if self.api_key else []
        if self.api_key_file is not None:
            keys += read_key_file(self.api_key_file)
        return keys

    def check_bind(self) -> None:
        """Refuse to expose an unauthenticated model server beyond this machine, or half a TLS setup."""
        keys = self.keys()
        # Flags that cannot run together are usage errors (exit status 2); a missing file is not.
        if not is_loopback(self.host) and not keys:
            raise UsageError(
                f"Refusing to listen on {self.host} without an API key: anyone on the network could use it.",
                f"Pass --api-key-file PATH (or set {API_KEY_ENV}), or bind to 127.0.0.1.",
            )
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise UsageError("TLS needs both a certificate and its key.", "Pass --ssl-certfile and --ssl-keyfile.")
        for label, path in (("certificate", self.ssl_certfile), ("key", self.ssl_keyfile)):
            if path is not None and not Path(path).is_file():
                raise ConfigError(f"The TLS {label} {path} does not exist.", "Give the path of a PEM file.")
        if self.ssl_certfile is not None and self.ssl_keyfile is not None:
            import ssl

            try:  # as uvicorn will once the server starts, where a bad file was a traceback
                ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(
                    self.ssl_certfile, self.ssl_keyfile, password=lambda: b"")  # never a prompt on the terminal
            except (ssl.SSLError, OSError) as exc:
                raise ConfigError(f"The TLS certificate {self.ssl_certfile} and key {self.ssl_keyfile} do not load "
                                  f"({getattr(exc, 'reason', None) or exc}).",
                                  "Give a PEM certificate and its own private key, unencrypted.") from None


def read_key_file(path: Path) -> list[str]:
    """Keys, one per line (blank lines and `#` comments skipped). The file must be readable by its owner only."""
    try:
        mode = Path(path).stat().st_mode
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"Cannot read the API key file {path}: {exc.strerror}.", "Give a readable file.") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"The API key file {path} is not UTF-8 (byte 0x{exc.object[exc.start]:02x} at offset "
                          f"{exc.start}).", "Write one key per line, as text.") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(f"The API key file {path} is readable by other users (mode {stat.S_IMODE(mode):o}).",
                          f"Run `chmod 600 {path}`.")
    keys = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if not keys:
        raise ConfigError(f"The API key file {path} holds no key.", "Write one key per line.")
    bad = [i for i, k in enumerate(keys, 1) if any(c.isspace() or not c.isprintable() for c in k)]
    if bad:
        raise ConfigError(f"Key {bad[0]} in {path} contains spaces or control characters.",
                          "Write one key per line, with no spaces inside a key.")
    return keys


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything
