"""The router between model sizes: tiers from the profile, a scoring policy, the cascade rule,
the remote tier with its circuit breaker, and the evaluation behind `localspec router eval`."""

from localspec.router.breaker import CircuitBreaker
from localspec.router.cascade import DEFAULT_MIN_MEAN_LOGPROB
from localspec.router.features import FEATURE_NAMES, extract_features, request_text
from localspec.router.policy import HeuristicPolicy, LogisticPolicy, train_policy
from localspec.router.remote import RemoteTier, RemoteUnavailable
from localspec.router.router import RouteDecision, RouteInput, Router, weights_path
from localspec.router.tiers import TierName, TierSpec, tiers_from_profile

__all__ = [
    "DEFAULT_MIN_MEAN_LOGPROB", "FEATURE_NAMES", "CircuitBreaker", "HeuristicPolicy", "LogisticPolicy",
    "RemoteTier", "RemoteUnavailable", "RouteDecision", "RouteInput", "Router", "TierName", "TierSpec",
    "extract_features", "request_text", "tiers_from_profile", "train_policy", "weights_path",
]
