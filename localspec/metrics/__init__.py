"""Observability: a per-request log in SQLite, Prometheus collectors, spend and drift.

Every face (TUI, endpoint, CLI) builds a `RequestRecord` from the engine's `Stats` and hands it
to `Metrics.record`; `localspec stats` and the TUI read the log back through this package.
"""

from localspec.metrics.drift import Comparison, DriftFlag, active_drift_flags, compare, detect_drift, drift_report
from localspec.metrics.record import FACES, RequestRecord
from localspec.metrics.recorder import Metrics
from localspec.metrics.report import Spend, Summary, group_rows, parse_period, spend, summarize, time_series
from localspec.metrics.settings import DriftLimits, MetricsSettings, load_metrics_settings
from localspec.metrics.store import SCHEMA_VERSION, default_db_path, fetch_rows, open_reader

__all__ = [
    "FACES", "SCHEMA_VERSION", "Comparison", "DriftFlag", "DriftLimits", "Metrics", "MetricsSettings",
    "RequestRecord", "Spend", "Summary", "active_drift_flags", "compare", "default_db_path", "detect_drift",
    "drift_report", "fetch_rows", "group_rows", "load_metrics_settings", "open_reader", "parse_period", "spend",
    "summarize", "time_series",
]
