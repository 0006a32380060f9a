"""The `[metrics]` table of settings.toml: privacy, retention, spend prices and drift limits.

    [metrics]
    store_prompts = false            # keep prompt text in the log (off by default)
    retention_days = 90              # prune older requests; unset keeps everything
    cost_per_hour = 0.35             # what an hour of this machine costs you (power, rent)
    reference_price_per_mtok = 2.0   # an API's price per million tokens, to compare against
    reference_output_price_per_mtok = 8.0  # optional separate price for completion tokens

    [metrics.drift]
    recent_days = 1                  # the window under test ...
    baseline_days = 7                # ... against the period just before it
    acceptance_rate = 0.10           # absolute drop/rise in accepted/drafted
    tokens_per_second = 0.20         # relative change
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field



class DriftLimits(BaseModel):
    """Windows and the largest change each metric may show before it is flagged."""

    model_config = ConfigDict(extra="forbid")

    recent_days: float = Field(default=1.0, gt=0)
    baseline_days: float = Field(default=7.0, gt=0)
    min_samples: int = Field(default=20, ge=1)  # per window; fewer gives no verdict
    acceptance_rate: float = Field(default=0.10, ge=0)  # absolute
    tokens_per_second: float = Field(default=0.20, ge=0)  # relative
    ttft: float = Field(default=0.30, ge=0)  # relative
    cache_hit_rate: float = Field(default=0.15, ge=0)  # absolute
    cache_false_hit_rate: float = Field(default=0.05, ge=0)  # absolute
    route_share: float = Field(default=0.20, ge=0)  # absolute, per route
    error_rate: float = Field(default=0.05, ge=0)  # absolute
    feedback_score: float = Field(default=0.30, ge=0)  # absolute, scores in [-1, 1]


class MetricsSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    store_prompts: bool = False
    retention_days: float | None = Field(default=None, gt=0)
    cost_per_hour: float | None = Field(default=None, ge=0)
    reference_price_per_mtok: float | None = Field(default=None, ge=0)
    reference_output_price_per_mtok: float | None = Field(default=None, ge=0)
    drift: DriftLimits = Field(default_factory=DriftLimits)


def load_metrics_settings(path: Path | None = None) -> MetricsSettings:
    """The [metrics] table of the one settings model (localspec.settings), checked with the rest."""
    from localspec.settings import load_settings

    return load_settings(path).metrics
