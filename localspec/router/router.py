"""The router: which tier answers a request, and why.

`Router.decide` looks at the whole request (every message, the requested length, any hint),
scores P(needs more than the cheapest tier) with the trained policy or the heuristic, and picks
the cheapest tier below the threshold, else the most capable one (the remote tier when the
profile has one; the pipeline falls back to the best local tier when it is unavailable).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from localspec.router.cascade import DEFAULT_MIN_MEAN_LOGPROB
from localspec.router.cascade import should_escalate as _should_escalate
from localspec.router.features import LARGE_HINTS, SMALL_HINTS, extract_features, request_text
from localspec.router.policy import HeuristicPolicy, LogisticPolicy
from localspec.router.tiers import TierName, TierSpec, check_local_installed, check_remote_spec, tiers_from_profile

if TYPE_CHECKING:
    from localspec.engine.config import GenerationRequest

logger = logging.getLogger(__name__)

_TAIL_CHARS = 1500  # what is embedded when the whole request is longer than MiniLM's window


@dataclass(frozen=True)
class RouteInput:
    """The whole request, not just the last message."""

    messages: list[dict] | None
    prompt: str | None
    max_tokens: int | None
    hint: str | None = None  # "fast" / "best", or a tier name

    @classmethod
    def from_request(cls, req: GenerationRequest, hint: str | None = None) -> RouteInput:
        messages = [m.model_dump(exclude_none=True) for m in req.messages] if req.messages is not None else None
        return cls(messages=messages, prompt=req.prompt, max_tokens=req.max_tokens, hint=hint)

    def asks_for_code(self) -> bool:
        feats = extract_features(request_text(self.messages, self.prompt), None, None)
        return feats["code_markers"] >= 2


@dataclass(frozen=True)
class RouteDecision:
    tier: TierName
    score: float  # P(needs the larger tier)
    threshold: float
    reason: str
    policy: str  # "learned" | "heuristic" | "explicit"
    features: dict[str, float]
    cascade: bool  # answer with the small tier first, escalate on low confidence

    def as_dict(self) -> dict:
        d = asdict(self)
        d["score"] = round(self.score, 4)
        d["threshold"] = round(self.threshold, 4)
        d["features"] = {k: round(v, 4) for k, v in self.features.items()}
        return d


def weights_path(profile_name: str) -> Path:
    from localspec.paths import resolve_paths

    return resolve_paths().data_dir / "router" / f"{profile_name}.json"


class Router:
    def __init__(self, tiers: list[TierSpec], policy: HeuristicPolicy | LogisticPolicy, embedder=None,
                 cascade: bool = False, min_mean_logprob: float = DEFAULT_MIN_MEAN_LOGPROB,
                 profile: str | None = None, note: str = "") -> None:
        if not tiers:
            raise ValueError("a router needs at least one tier")
        self.tiers = list(tiers)
        self.policy = policy
        self.embedder = embedder
        self.cascade = cascade
        self.min_mean_logprob = min_mean_logprob
        self.profile = profile
        self.note = note  # why the heuristic applies although weights exist, for `router show`

    @classmethod
    def from_profile(cls, profile_name: str | None = None, embedder=None, weights: Path | None = None,
                     check_installed: bool = True) -> Router:
        """The profile's tiers (validated now) and its trained policy, else the heuristic."""
        from localspec.models import ModelManager

        mm = ModelManager()
        name = profile_name or mm.registry.default_profile or "default"
        profile = mm.profile(name)
        tiers = tiers_from_profile(profile)
        for t in tiers:
            if t.kind == "remote":
                check_remote_spec(t, f"profiles.{name}.remote")
        if check_installed:
            check_local_installed(tiers, mm.installed_path)
        path = weights or weights_path(name)
        policy: HeuristicPolicy | LogisticPolicy = HeuristicPolicy()
        note = ""
        if path.is_file():
            learned = LogisticPolicy.load(path)
            learned.set_share(profile.large_share)
            if learned.uses_embedding and embedder is None:
                embedder, note = _profile_embedder(mm, profile.embedding)
            if learned.uses_embedding and embedder is None:
                note = f"trained weights {path} need the embedding model, which is not available ({note})"
                logger.warning("router: %s; using the heuristic", note)
            else:
                policy = learned
        return cls(tiers, policy, embedder if policy.uses_embedding else None,
                   cascade=profile.cascade, profile=name, note=note)

    # ---------------------------------------------------------------- decisions

    def tier(self, name: TierName | str) -> TierSpec:
        for t in self.tiers:
            if t.name == name:
                return t
        raise KeyError(name)

    @property
    def cheapest(self) -> TierSpec:
        return self.tiers[0]

    @property
    def strongest(self) -> TierSpec:
        return self.tiers[-1]

    def best_local(self) -> TierSpec:
        """Where a failed remote tier falls back to."""
        local = [t for t in self.tiers if t.kind == "local"]
        return local[-1] if local else self.tiers[0]

    def escalation_tier(self, decision: RouteDecision) -> TierSpec:
        """Where a cascade escalates from the tier it answered with: the most capable tier."""
        return self.strongest

    def decide(self, route_input: RouteInput) -> RouteDecision:
        text = request_text(route_input.messages, route_input.prompt)
        features = extract_features(text, route_input.max_tokens, route_input.hint)
        explicit = self._explicit(route_input.hint)
        if explicit is not None:
            score = 1.0 if explicit != self.cheapest else 0.0
            return RouteDecision(explicit.name, score, self.policy.threshold,
                                 f"explicit hint {route_input.hint!r} -> {explicit.name}", "explicit", features, False)
        embedding = self._embed(text.full) if self.policy.uses_embedding else None
        score = self.policy.score(features, embedding)
        threshold = self.policy.threshold
        up = score >= threshold and len(self.tiers) > 1
        chosen = self.strongest if up else self.cheapest
        cascade = self.cascade and not up and len(self.tiers) > 1
        why = self.policy.describe(features)
        reason = f"{self.policy.name} score {score:.2f} {'>=' if up else '<'} {threshold:.2f} ({why}) -> {chosen.name}"
        if cascade:
            reason += f", escalating to {self.escalation_tier_name()} if unsure"
        return RouteDecision(chosen.name, score, threshold, reason, self.policy.name, features, cascade)

    def escalation_tier_name(self) -> TierName:
        return self.strongest.name

    def should_escalate(self, mean_logprob: float | None, text: str,
                        route_input: RouteInput | None = None) -> tuple[bool, str]:
        """The cascade rule (localspec.router.cascade): low confidence or an invalid answer."""
        asked_code = route_input.asks_for_code() if route_input is not None else "```" in text
        return _should_escalate(mean_logprob, text, asked_code, self.min_mean_logprob)

    def _explicit(self, hint: str | None) -> TierSpec | None:
        if not hint:
            return None
        key = hint.strip().lower()
        for t in self.tiers:
            if t.name == key:
                return t
        if key in SMALL_HINTS:
            return self.cheapest
        if key in LARGE_HINTS:
            return self.strongest
        return None

    def _embed(self, text: str) -> np.ndarray | None:
        if self.embedder is None:
            return None
        vec = self.embedder.embed(text)
        if vec is None and len(text) > _TAIL_CHARS:
            vec = self.embedder.embed(text[-_TAIL_CHARS:])
        return vec

    def close(self) -> None:
        if self.embedder is not None and hasattr(self.embedder, "close"):
            self.embedder.close()


def _profile_embedder(mm, embedding_id: str | None):
    """The profile's embedding model, loaded, or (None, why not)."""
    if not embedding_id:
        return None, "the profile names no embedding model"
    path = mm.installed_path(embedding_id)
    if path is None:
        return None, f"{embedding_id} is not installed; run `localspec models pull {embedding_id}`"
    from localspec.engine.embedder import Embedder
    from localspec.errors import LocalspecError
    from localspec.models.gguf_info import validate_gguf

    try:
        validate_gguf(path)  # a bad file is a clean error here, never a llama.cpp abort
    except LocalspecError as exc:
        return None, str(exc)
    return Embedder(path), ""
