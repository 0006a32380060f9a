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
import re
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


# A refusal that carries Python's own words names neither the field nor the fix: it let an exception's text
# through ("Unsupported JSON schema: 'int' object has no attribute 'get'"), a finding though its status is a 400.
PYTHON_WORDS = re.compile(r"has no attribute|is not iterable|not supported between instances|unhashable type|"
                          r"can't (?:multiply|concatenate|convert|encode|decode)|object is not subscriptable|"
                          r"Traceback|\b(?:Key|Index|Type|Attribute|Unicode\w*|Recursion|PydanticSerialization)Error\b")


def python_words(text: str) -> str | None:
    """The Python exception wording in an error's text, or None."""
    m = PYTHON_WORDS.search(text)
    return m.group(0) if m else None


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
    for field in ("max_tokens", "max_completion_tokens", "n_predict", "num_predict"):
        value = case.body.get(field)
        if isinstance(value, int) and not isinstance(value, bool) and value > cap:
            case.body[field] = 1 + value % cap
    if isinstance(case.body.get("n"), int):
        case.body["n"] = 1


def fuzz(
    base_url: str, key: str, cases: int, seed: int = 0, cap: int = 8, progress: bool = False,
    operations: str | None = None,
) -> dict[str, Any]:
    """Run `cases` generated requests against a running server; returns the figures and findings.
    `operations`: a regex on the operations' paths, to fuzz some routes only (new ones, say)."""
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
    if operations:
        schema = schema.include(path_regex=operations)
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
            elif response.status_code >= 400 and (words := python_words(response.text)):
                finding("python_error", case, f"{response.status_code} with Python's words ({words}): {response.text}")
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
        **({"operations": operations} if operations else {}),
    }


# ---------------------------------------------------------------- hostile schemas


def _schema_strategy():
    """JSON schemas built from the quantities that turn into grammar size or depth, in and out of bounds."""
    from hypothesis import strategies as st

    from localspec.engine.grammar_limits import LIMITS

    def around(limit: int) -> st.SearchStrategy[int]:  # small, near the bound, or far over it
        return st.one_of(st.integers(0, 16), st.integers(limit - 2, limit + 2), st.integers(limit, 20 * limit))

    string = st.builds(lambda lo, hi, pattern: {k: v for k, v in (("type", "string"), ("minLength", lo),
                                                                     ("maxLength", hi), ("pattern", pattern)) if v is not None},
                       st.none() | around(LIMITS.max_string_length), st.none() | around(LIMITS.max_string_length),
                       st.none() | _pattern_strategy())
    # A keyword holding a value of the wrong JSON type (a number for a schema, a string for a list): a 400 naming it.
    junk = st.one_of(st.none(), st.integers(-3, 3), st.booleans(), st.text(max_size=3), st.lists(st.integers(), max_size=2))
    malformed = st.builds(lambda key, value: {"type": "object", key: value} if key == "properties" else {key: value},
                          st.sampled_from(["type", "items", "properties", "enum", "anyOf", "allOf", "prefixItems", "$ref",
                                           "pattern", "format", "minLength", "maxItems", "additionalProperties", "$defs"]),
                          junk)
    scalar = st.one_of(string, st.just({"type": "integer"}), st.just({"type": "boolean"}),
                       st.builds(lambda n: {"enum": [f"v{i}" for i in range(n)]}, around(LIMITS.max_enum)), malformed)

    def extend(inner):
        array = st.builds(lambda items, lo, hi: {k: v for k, v in (("type", "array"), ("items", items), ("minItems", lo),
                                                                       ("maxItems", hi)) if v is not None},
                          inner, st.none() | around(LIMITS.max_items), st.none() | around(LIMITS.max_items))
        obj = st.builds(lambda props: {"type": "object", "properties": props, "required": list(props)[:3]},
                        st.dictionaries(st.from_regex(r"[a-z]{1,6}", fullmatch=True), inner, max_size=6))
        wide = st.builds(lambda n, inner_: {"type": "object", "properties": {f"p{i}": inner_ for i in range(n)}},
                         around(LIMITS.max_properties), inner)
        return st.one_of(array, obj, wide, st.builds(lambda xs: {"anyOf": xs}, st.lists(inner, min_size=1, max_size=4)))

    # Depth up to 4x the bound: deeper JSON would hit Python's own recursion limit in json.loads first.
    deep = st.builds(lambda d: json.loads('{"type":"array","items":' * d + '{"type":"string"}' + "}" * d),
                     st.one_of(st.integers(1, 16), st.integers(LIMITS.max_depth - 2, 4 * LIMITS.max_depth)))
    return st.one_of(st.recursive(scalar, extend, max_leaves=12), deep)


def _fits(value: Any, budget: int) -> bool:
    """Whether a value's JSON has at most `budget` nodes and strings, counted without serializing it."""
    todo, seen = [value], 0
    while todo:
        node = todo.pop()
        seen += 1
        if seen > budget:
            return False
        if isinstance(node, dict):
            todo.extend(node.values())
            seen += len(node)
        elif isinstance(node, list):
            todo.extend(node)
    return True


def _pattern_strategy():
    from hypothesis import strategies as st

    atom = st.sampled_from(["a", "[a-z]", "\\d", "(ab|c)", "."])
    rep = st.one_of(st.just(""), st.builds(lambda n: f"{{0,{n}}}", st.integers(1, 30000)),
                    st.builds(lambda n: f"{{{n}}}", st.integers(1, 3000)), st.sampled_from(["*", "+", "?"]))
    piece = st.builds(lambda a, r: a + r, atom, rep)
    group = st.builds(lambda inner, r, d: "(" * d + "".join(inner) + ")" * d + r,
                      st.lists(piece, min_size=1, max_size=3), rep, st.integers(1, 40))
    return st.builds(lambda parts: "^" + "".join(parts) + "$", st.lists(st.one_of(piece, group), min_size=1, max_size=4))


def fuzz_schemas(base_url: str, key: str | None, cases: int, seed: int = 0, model: str = "qwen2.5-coder-0.5b-instruct-q4_k_m",
                 progress: bool = False) -> dict[str, Any]:
    """Hostile schemas in response_format and forced tool calls: every answer a 200, 400 or 413, the server alive."""
    import hypothesis
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st

    from localspec.engine.grammar_limits import GrammarTooLarge, check_schema

    statuses: Counter[str] = Counter()
    findings: list[dict[str, Any]] = []
    run = {"n": 0, "dead": False, "over_bounds": 0, "refused_as_too_large": 0, "unsendable": 0}
    t0 = time.perf_counter()

    @settings(max_examples=cases, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck), print_blob=False)
    @hypothesis.seed(seed)
    @given(schema=_schema_strategy(), as_tool=st.booleans())
    def one(schema: dict, as_tool: bool) -> None:
        if run["dead"]:
            return
        if not _fits(schema, 1 << 20):  # "wide" over "wide" shares one inner dict: its JSON grows as a power
            run["unsendable"] += 1    # (a 1.4 GB body was being written when the campaign was OOM-killed)
            return
        run["n"] += 1
        try:
            check_schema(schema, "schema")
            over = False
        except GrammarTooLarge:
            over = True
        run["over_bounds"] += over
        body: dict[str, Any] = {"model": model, "max_tokens": 4, "temperature": 0,
                                "messages": [{"role": "user", "content": "Answer in JSON."}]}
        if as_tool:
            body.update(tools=[{"type": "function", "function": {"name": "f", "parameters": schema}}],
                        tool_choice="required")
        else:
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
        try:
            r = request(base_url, "POST", "/v1/chat/completions", key=key, json_body=body, timeout=300)
        except OSError as exc:
            findings.append({"kind": "transport", "detail": str(exc), "body": json.dumps(body)[:2000]})
            statuses["error"] += 1
        else:
            statuses[str(r.status_code)] += 1
            code = (r.json().get("error") or {}).get("code") if r.status_code == 400 else None
            run["refused_as_too_large"] += code == "schema_too_large"
            # 413: the body limit refused it before any schema work, which is as safe.
            # Over the bounds: refused as a schema too large, or, nested past the body's own limit, as too deep.
            too_large = code in ("schema_too_large", "json_too_deep")
            if r.status_code not in (200, 400, 413) or (over and r.status_code == 400 and not too_large):
                findings.append({"kind": "status", "status": r.status_code, "over_bounds": over,
                                 "detail": r.text[:500], "body": json.dumps(body)[:2000]})
            elif r.status_code == 400 and (words := python_words(r.text)):
                findings.append({"kind": "python_error", "status": 400, "words": words, "detail": r.text[:500],
                                 "body": json.dumps(body)[:2000]})
        try:
            alive = request(base_url, "GET", "/health", key=key, timeout=60).status_code == 200
        except OSError:
            alive = False
        if not alive:
            run["dead"] = True
            findings.append({"kind": "server_died", "body": json.dumps(body)[:2000]})
        if progress and run["n"] % 50 == 0:
            print(f"schemas: {run['n']} cases, {len(findings)} findings, {dict(statuses)}", file=sys.stderr, flush=True)

    one()
    return {"cases": run["n"], "seed": seed, "over_bounds": run["over_bounds"], "unsendable_skipped": run["unsendable"],
            "refused_as_too_large": run["refused_as_too_large"], "server_died": run["dead"],
            "statuses": dict(sorted(statuses.items())), "findings": findings,
            "seconds": round(time.perf_counter() - t0, 1)}


# ---------------------------------------------------------------- Host and Origin headers


HOSTS = ["localhost", "127.0.0.1", "[::1]", "LOCALHOST.", "attacker.example", "127.0.0.1.nip.io", "10.0.0.7",
         "localhost.attacker.example", "[::ffff:127.0.0.1]", "", "host.docker.internal", "0.0.0.0", "a" * 300,
         "local host", "127.1", "xn--lcalhost-9za"]
ORIGINS = [None, "http://localhost:3000", "https://127.0.0.1", "http://[::1]:5173", "null", "http://evil.example",
           "https://attacker.example:443", "file://", "chrome-extension://abc", "http://localhost.evil.example",
           "https://editor.example", "javascript:alert(1)", ""]


def expected_allowed(host: str, origin: str | None, allowed_hosts: set[str], allowed_origins: set[str]) -> bool:
    """The rule, written out independently of the guard: loopback names and the allowed ones, any port."""
    from urllib.parse import urlsplit

    name = host.lower()
    name = name[1:name.index("]")] if name.startswith("[") and "]" in name else name.rsplit(":", 1)[0]
    name = name.rstrip(".")
    if name not in {"localhost", "127.0.0.1", "::1", *allowed_hosts}:
        return False
    if origin is None or origin.lower() in allowed_origins:
        return True
    parts = urlsplit(origin.lower())
    return parts.scheme in ("http", "https") and (parts.hostname or "") in {"localhost", "127.0.0.1", "::1",
                                                                           *allowed_hosts}


def fuzz_hosts(base_url: str, cases: int, seed: int = 0, allowed_hosts: tuple[str, ...] = ("host.docker.internal",),
               allowed_origins: tuple[str, ...] = ("https://editor.example",), progress: bool = False) -> dict[str, Any]:
    """Host and Origin headers against a server without a key: 403 exactly when the rule says so."""
    import random

    rng = random.Random(seed)
    paths = [("GET", "/health"), ("GET", "/docs"), ("GET", "/v1/models"), ("GET", "/v1/cache/stats"),
             ("GET", "/metrics"), ("POST", "/v1/chat/completions")]
    statuses: Counter[str] = Counter()
    findings: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for n in range(cases):
        host = rng.choice(HOSTS) + rng.choice(["", ":8000", f":{rng.randint(1, 65535)}", ":"])
        origin = rng.choice(ORIGINS)
        method, path = rng.choice(paths)
        headers = {"Host": host} | ({"Origin": origin} if origin is not None else {})
        body = {"model": "qwen2.5-coder-0.5b-instruct-q4_k_m", "max_tokens": 1, "temperature": 0,
                "messages": [{"role": "user", "content": "hi"}]} if method == "POST" else None
        try:
            r = request(base_url, method, path, json_body=body, headers=headers, timeout=300)
        except OSError as exc:
            findings.append({"kind": "transport", "host": host, "origin": origin, "detail": str(exc)})
            continue
        statuses[str(r.status_code)] += 1
        allowed = expected_allowed(host, origin, set(allowed_hosts), set(allowed_origins))
        if (r.status_code >= 500 and r.status_code != 503) or (r.status_code == 403) == allowed:  # 503: still loading
            findings.append({"kind": "guard", "host": host, "origin": origin, "path": path, "status": r.status_code,
                             "expected": "allowed" if allowed else "403", "detail": r.text[:300]})
        if progress and (n + 1) % 100 == 0:
            print(f"hosts: {n + 1} cases, {len(findings)} findings", file=sys.stderr, flush=True)
    return {"cases": cases, "seed": seed, "statuses": dict(sorted(statuses.items())), "findings": findings,
            "seconds": round(time.perf_counter() - t0, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--url", help="fuzz an already running server (default: start one in-process)")
    ap.add_argument("--api-key", default=KEY)
    ap.add_argument("--schema-cases", type=int, default=400, help="hostile JSON schemas (grammar bounds)")
    ap.add_argument("--host-cases", type=int, default=600, help="Host/Origin headers against a server without a key")
    ap.add_argument("--out", type=Path, default=Path("docs/reliability/fuzz.json"))
    ap.add_argument("--operations", help="a regex on the paths to fuzz (default: every operation)")
    args = ap.parse_args()
    if args.url:
        result = fuzz(args.url, args.api_key, args.cases, args.seed, progress=True, operations=args.operations)
        result["schemas"] = fuzz_schemas(args.url, args.api_key, args.schema_cases, args.seed, progress=True)
    else:
        isolate_home()
        settings = campaign_settings(args.api_key)
        with campaign_server(settings) as srv:
            result = fuzz(srv.base_url, args.api_key, args.cases, args.seed, settings.max_tokens_cap, progress=True,
                          operations=args.operations)
            result["schemas"] = fuzz_schemas(srv.base_url, args.api_key, args.schema_cases, args.seed, progress=True)
            result["slots_idle_after"] = wait_until(lambda: slots_idle(srv), timeout=120)
            result["server"] = settings.model_dump(exclude={"api_key"})
        open_settings = campaign_settings(None, allowed_hosts=["host.docker.internal"],
                                          allowed_origins=["https://editor.example"])
        with campaign_server(open_settings) as srv:
            result["hosts"] = fuzz_hosts(srv.base_url, args.host_cases, args.seed, progress=True)
    result["command"] = " ".join(["python", "scripts/fuzz_endpoint.py", *sys.argv[1:]])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "findings"}, indent=2, default=str))
    findings = len(result["findings"]) + sum(len(result[p]["findings"]) for p in ("schemas", "hosts") if p in result)
    print(f"{findings} findings -> {args.out}")
    dead = result["server_died"] or result.get("schemas", {}).get("server_died")
    return 1 if findings or dead else 0


if __name__ == "__main__":
    sys.exit(main())
