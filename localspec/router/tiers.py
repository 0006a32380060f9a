"""The router's tiers, read from a profile in models.toml and checked at start-up.

- `small`:  the profile's `small` model alone;
- `large`:  the profile's `target` with its `draft`;
- `remote`: the optional `[profiles.<name>.remote]` table, an OpenAI-compatible server.

They are ordered by cost, cheapest first. A tier that cannot work (a model not installed, a bad
URL, a key's env var unset) is a ConfigError when the router is built, not at the first request.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Literal
from urllib.parse import urlparse

from localspec.errors import ConfigError, ModelNotFoundError

if TYPE_CHECKING:
    from localspec.models.registry import Profile

TierKind = Literal["local", "remote"]


class TierName(StrEnum):
    """The tiers a request can be answered by, cheapest first. A StrEnum: it is its own JSON."""

    SMALL = "small"
    LARGE = "large"
    REMOTE = "remote"


@dataclass(frozen=True)
class TierSpec:
    name: TierName
    kind: TierKind
    target: str | None = None  # local: the model id that answers
    draft: str | None = None  # local: the draft model id for speculative decoding
    base_url: str | None = None  # remote: the server's OpenAI base URL (…/v1)
    model: str | None = None  # remote: the model name to ask for
    api_key_env: str | None = None  # remote: env var holding the key (None: no key)
    timeout_s: float = 60.0

    def as_dict(self) -> dict[str, object]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


def tiers_from_profile(profile: Profile) -> list[TierSpec]:
    """Tiers of a `localspec.models.Profile`, cheapest first."""
    tiers: list[TierSpec] = []
    if profile.small and profile.small != profile.target:
        tiers.append(TierSpec(TierName.SMALL, "local", target=profile.small))
    tiers.append(TierSpec(TierName.LARGE, "local", target=profile.target, draft=profile.draft))
    if profile.remote is not None:
        r = profile.remote
        tiers.append(TierSpec(TierName.REMOTE, "remote", base_url=r.base_url, model=r.model,
                              api_key_env=r.api_key_env, timeout_s=r.timeout_s))
    return tiers


def check_remote_spec(spec: TierSpec, where: str = "the remote tier") -> None:
    """Offline checks of a remote tier: a usable URL and, if a key is named, that it is set."""
    url = spec.base_url or ""
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ConfigError(
            f"{where}: base_url {url!r} is not an http(s) URL with a host.",
            "Set base_url to the server's OpenAI endpoint, e.g. \"http://127.0.0.1:8001/v1\".",
        )
    try:
        parsed.port  # noqa: B018 - raises on a malformed port
    except ValueError:
        raise ConfigError(f"{where}: base_url {url!r} has an invalid port.", "Use a port from 1 to 65535.") from None
    if not spec.model:
        raise ConfigError(f"{where}: no model name is set.", "Set model = \"<name the server serves>\".")
    if spec.api_key_env and not os.environ.get(spec.api_key_env):
        raise ConfigError(
            f"{where}: the environment variable {spec.api_key_env} (its API key) is not set.",
            f"Export {spec.api_key_env}=<key> before starting, or remove api_key_env if the server needs no key.",
        )


def check_local_installed(tiers: list[TierSpec], installed: Callable[[str], object | None]) -> None:
    """Every local tier's models must be installed; `installed(id)` returns a path or None."""
    for t in tiers:
        for mid in (t.target, t.draft):
            if t.kind == "local" and mid and installed(mid) is None:
                raise ModelNotFoundError(
                    f"The router's {t.name} tier needs the model {mid!r}, which is not installed.",
                    f"Run `localspec models pull {mid}`.",
                )
