"""Fuzz the OpenAI-compatible endpoint from its own OpenAPI spec with schemathesis.

    .venv/bin/python scripts/fuzz_endpoint.py --cases 1000 --out docs/reliability/fuzz.json

Starts the endpoint in-process on a free loopback port with the 0.5B model (max_tokens capped at
8, so every generation is tiny), or fuzzes --url. Half the cases fit the schema (they reach the
engine and llama.cpp), half are negative (wrong types, missing fields, out-of-range numbers).
Every response is checked: no 5xx, a documented status code and content type, a body that
conforms to the documented schema; after every case /health must still answer (the process is
alive: a native GGML_ASSERT would have killed it). Findings are written to the JSON with a curl
line to reproduce each.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.campaign_server import campaign_server, campaign_settings, isolate_home, slots_idle  # noqa: E402
from tests.server_harness import request, wait_until  # noqa: E402

KEY = "fuzz-key"
CHAT_MODELS = ["auto", "qwen2.5-coder-0.5b-instruct-q4_k_m"]
EMBEDDING_MODELS = ["all-minilm-l6-v2-f16"]


def steer(case, cap: int, pick: int) -> None:
    """Point most cases at a served model with a max_tokens under the cap, so they reach the engine.

    Random model names all end in a 404 before anything interesting runs; the rest of the body
    (messages, stops, sampling, tools, formats, logprobs, seeds) stays as generated.
    """
    label = case.operation.label
    if label == "GET /v1/models/{model_id}" and isinstance(case.path_parameters, dict):
        case.path_parameters["model_id"] = (CHAT_MODELS + EMBEDDING_MODELS)[pick % 3]
        return
    if not isinstance(case.body, dict):
        return
    if label == "POST /v1/embeddings":
        case.body["model"] = EMBEDDING_MODELS[0]
        return
    case.body["model"] = CHAT_MODELS[pick % 2]
    for field in ("max_tokens", "max_completion_tokens"):
        value = case.body.get(field)
        if isinstance(value, int) and not isinstance(value, bool) and value > cap:
            case.body[field] = 1 + value % cap
    if isinstance(case.body.get("n"), int):
        case.body["n"] = 1


def fuzz(
    base_url: str, key: str, cases: int, seed: int = 0, cap: int = 8, progress: bool = False
) -> dict[str, Any]:
    """Run `cases` generated requests against a running server; returns the figures and findings."""
    import hypothesis
    import schemathesis
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st
    from schemathesis.checks import not_a_server_error
    from schemathesis.core.failures import FailureGroup
    from schemathesis.generation.modes import GenerationMode
    from schemathesis.specs.openapi.checks import (
        content_type_conformance,
        response_schema_conformance,
        status_code_conformance,
    )

    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json")
    auth = {"Authorization": f"Bearer {key}"}
    checks = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
    strategy = st.one_of(schema.as_strategy(GenerationMode.POSITIVE), schema.as_strategy(GenerationMode.NEGATIVE))
    statuses: Counter[str] = Counter()
    per_operation: Counter[str] = Counter()
    findings: list[dict[str, Any]] = []
    run = {"n": 0, "server_errors": 0, "dead": False}
    t0 = time.perf_counter()

    def finding(kind: str, case, detail: str) -> None:
        try:
            curl = case.as_curl_command(headers=auth)
        except Exception:  # a case whose curl cannot be built still counts
            curl = None
        findings.append({"kind": kind, "operation": case.operation.label, "detail": detail[:2000], "curl": curl})

    @settings(
        max_examples=cases, database=None, deadline=None, phases=[Phase.generate],
        suppress_health_check=list(HealthCheck), print_blob=False,
    )
    @hypothesis.seed(seed)
    @given(case=strategy, pick=st.integers(0, 5))
    def one(case, pick: int) -> None:
        if run["dead"]:
            return
        if pick:  # one case in six keeps its generated model name and max_tokens
            steer(case, cap, pick)
        run["n"] += 1
        per_operation[case.operation.label] += 1
        try:
            response = case.call(base_url=base_url, headers=auth, timeout=300)
        except Exception as exc:  # a dropped connection is a finding, not the end of the run
            finding("transport", case, f"{type(exc).__name__}: {exc}")
            statuses["error"] += 1
        else:
            statuses[str(response.status_code)] += 1
            if response.status_code >= 500:
                run["server_errors"] += 1
            try:
                case.validate_response(response, checks=checks, headers=auth)
            except FailureGroup as exc:
                finding("check", case, str(exc))
        try:
            alive = request(base_url, "GET", "/health", timeout=60).status_code == 200
        except OSError:
            alive = False
        if not alive:
            run["dead"] = True
            finding("server_died", case, "/health stopped answering after this case")
        if progress and run["n"] % 50 == 0:
            print(f"{run['n']} cases, {len(findings)} findings, {dict(statuses)}", file=sys.stderr, flush=True)

    one()
    return {
        "cases": run["n"], "seed": seed, "steered": "5 in 6 cases aimed at a served model, max_tokens <= cap", "server_errors_5xx": run["server_errors"], "server_died": run["dead"],
        "findings": findings, "statuses": dict(sorted(statuses.items())),
        "per_operation": dict(sorted(per_operation.items())), "seconds": round(time.perf_counter() - t0, 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--url", help="fuzz an already running server (default: start one in-process)")
    ap.add_argument("--api-key", default=KEY)
    ap.add_argument("--out", type=Path, default=Path("docs/reliability/fuzz.json"))
    args = ap.parse_args()
    if args.url:
        result = fuzz(args.url, args.api_key, args.cases, args.seed, progress=True)
    else:
        isolate_home()
        settings = campaign_settings(args.api_key)
        with campaign_server(settings) as srv:
            result = fuzz(srv.base_url, args.api_key, args.cases, args.seed, settings.max_tokens_cap, progress=True)
            result["slots_idle_after"] = wait_until(lambda: slots_idle(srv), timeout=120)
            result["server"] = settings.model_dump(exclude={"api_key"})
    result["command"] = " ".join(["python", "scripts/fuzz_endpoint.py", *sys.argv[1:]])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "findings"}, indent=2))
    print(f"{len(result['findings'])} findings -> {args.out}")
    return 1 if result["findings"] or result["server_died"] else 0


if __name__ == "__main__":
    sys.exit(main())
