"""Prometheus collectors, one set per `CollectorRegistry`, fed from each `RequestRecord`."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from localspec.metrics.record import RequestRecord

# Seconds; local generation spans milliseconds (cache hits) to minutes (long answers on a CPU).
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_INTER_TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5)
MAX_POSITION_LABELS = 16  # longer drafts fold into the last label to bound cardinality


class PromCollectors:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.requests = Counter(
            "localspec_requests_total", "Finished requests.", ["face", "mode", "finish_reason"], registry=r
        )
        self.errors = Counter("localspec_request_errors_total", "Requests that ended in an error.",
                              ["face", "error_class"], registry=r)
        self.prompt_tokens = Counter("localspec_prompt_tokens_total", "Prompt tokens received.", ["face"], registry=r)
        self.reused_tokens = Counter("localspec_reused_prompt_tokens_total",
                                     "Prompt tokens found already in the KV cache.", ["face"], registry=r)
        self.completion_tokens = Counter("localspec_completion_tokens_total", "Tokens generated or served.",
                                         ["face"], registry=r)
        self.cache = Counter("localspec_cache_lookups_total", "Semantic cache lookups.", ["result"], registry=r)
        self.routes = Counter("localspec_routes_total", "Router decisions.", ["route"], registry=r)
        self.compute = Counter("localspec_compute_seconds_total", "Engine seconds spent on requests.", registry=r)
        self.ttft = Histogram("localspec_time_to_first_token_seconds", "Submit to first token.",
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.inter_token = Histogram("localspec_inter_token_latency_seconds", "Time between streamed tokens.",
                                     buckets=_INTER_TOKEN_BUCKETS, registry=r)
        self.e2e = Histogram("localspec_request_duration_seconds", "Request received to last byte.",
                             buckets=_LATENCY_BUCKETS, registry=r)
        self.queue_depth = Gauge("localspec_queue_depth", "Requests waiting for the engine.", registry=r)
        self.drafts = Counter("localspec_spec_drafts_total", "Draft proposals verified by the target.",
                              ["mode"], registry=r)
        self.drafted = Counter("localspec_spec_drafted_tokens_total", "Tokens proposed by the drafter.",
                               ["mode"], registry=r)
        self.accepted = Counter("localspec_spec_accepted_tokens_total", "Drafted tokens the target accepted.",
                                ["mode"], registry=r)
        self.drafted_at = Counter("localspec_spec_drafted_by_position_total",
                                  "Drafts that reached a position (1 = first drafted token).", ["position"], registry=r)
        self.accepted_at = Counter("localspec_spec_accepted_by_position_total",
                                   "Drafted tokens accepted at a position (1 = first drafted token).",
                                   ["position"], registry=r)
        self.prediction = Counter("localspec_prediction_tokens_total",
                                  "Predicted Outputs: prediction tokens verified, by outcome (accepted: kept in "
                                  "the answer; rejected: drafted and not kept).", ["outcome"], registry=r)
        self.dropped = Counter("localspec_metrics_dropped_total",
                               "Records not logged because the metrics queue was full.", registry=r)

    def observe(self, rec: RequestRecord) -> None:
        face, mode = rec.face, rec.spec_mode or "off"
        self.requests.labels(face, mode, rec.finish_reason or "unknown").inc()
        if rec.error_class or rec.finish_reason == "error":
            self.errors.labels(face, rec.error_class or "unknown").inc()
        self.prompt_tokens.labels(face).inc(rec.prompt_tokens)
        self.reused_tokens.labels(face).inc(rec.reused_tokens)
        self.completion_tokens.labels(face).inc(rec.completion_tokens)
        if rec.cache in ("hit", "miss"):
            self.cache.labels(rec.cache).inc()
        if rec.route:
            self.routes.labels(rec.route).inc()
        self.compute.inc(rec.compute_s)
        if rec.completion_tokens and rec.ttft_ms > 0:
            self.ttft.observe(rec.ttft_ms / 1000)
        if rec.e2e_ms is not None:
            self.e2e.observe(rec.e2e_ms / 1000)
        if rec.drafted:
            # A draft of n tokens reaches positions 1..n, so position 1 counts the drafts.
            self.drafts.labels(mode).inc(rec.drafted_by_position[0] if rec.drafted_by_position else 0)
            self.drafted.labels(mode).inc(rec.drafted)
            self.accepted.labels(mode).inc(rec.accepted)
            for i, (d, a) in enumerate(zip(rec.drafted_by_position, rec.accepted_by_position, strict=False)):
                label = str(min(i + 1, MAX_POSITION_LABELS))
                self.drafted_at.labels(label).inc(d)
                self.accepted_at.labels(label).inc(a)
        if rec.prediction_drafted:
            self.prediction.labels("accepted").inc(rec.prediction_accepted)
            self.prediction.labels("rejected").inc(rec.prediction_rejected)
