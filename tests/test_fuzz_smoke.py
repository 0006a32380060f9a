"""The endpoint under bad input: a schemathesis smoke run from /openapi.json plus hand-written cases.

One real server for the module, 2 slots, n_ctx 1024, answering from a scripted model and scripted
embeddings (tests/fake_tier.py): bad input is the endpoint's control flow. What compiles a grammar
(the generated cases, hostile schemas) goes to a second server with the real 0.5B (stage 2). Every
case must get a clean 4xx (or a 200), never a 5xx, and the server must still answer /health after it.
The dedicated 1,000-case run is `scripts/fuzz_endpoint.py`.
"""

from __future__ import annotations

import http.client
import json
import socket

import pytest
from prometheus_client.parser import text_string_to_metric_families

from localspec.server import ServerSettings, create_app
from scripts.fuzz_endpoint import fuzz
from tests.common import DRAFT_ID, SHARED_STORE, TEST_THREADS
from tests.fake_tier import ScriptedEmbedder, scripted, scripted_app, scripted_backend, scripted_pipeline, scripted_tier
from tests.server_harness import OpenStream, ServerThread, request, wait_until

KEY = "fuzz-smoke-key"
SMALL = DRAFT_ID  # the 0.5B: tiny generations
EMBED = "all-minilm-l6-v2-f16"
N_CTX = 1024
CAP = 64
BODY_LIMIT = 64 * 1024
# Long answers where a test needs a stream that runs for a while; "Hi." to the rest.
SCRIPT = scripted({"Count from 1 to 100": " ".join(str(i) for i in range(1, 101)),
                   "Write a story": "Once upon a time " * 20}, default="Hi.")


def _serve(tmp_path_factory, app_for):
    settings = ServerSettings(
        api_key=KEY, target=SMALL, mode="off", parallel=2, max_queue=4, n_ctx=N_CTX, n_threads=TEST_THREADS,
        max_tokens_cap=CAP, max_body_bytes=BODY_LIMIT,
    )
    # A module-scoped server starts before the per-test home exists: give it one of its own.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LOCALSPEC_HOME", str(tmp_path_factory.mktemp("fuzz-home")))
        mp.setenv("LOCALSPEC_MODELS_DIR", str(SHARED_STORE))
        app = app_for(settings)
        with ServerThread(app) as server:
            assert wait_until(lambda: request(server.base_url, "GET", "/health").status_code == 200, timeout=600), (
                request(server.base_url, "GET", "/health").text)
            yield server


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    """The control flow: a scripted model (tests/fake_tier.py) with SMALL's name, 2 slots, n_ctx 1024."""
    def app_for(settings):
        tier = scripted_tier(model_id=SMALL, script=SCRIPT, parallel=2, n_ctx=N_CTX)
        return scripted_app(backend=scripted_backend(pipeline=scripted_pipeline(tiers=[tier]),
                                                     embedder=ScriptedEmbedder(), embedding_id=EMBED),
                            settings=settings)

    yield from _serve(tmp_path_factory, app_for)


@pytest.fixture(scope="module")
def model_srv(draft_path, tmp_path_factory):
    """The real 0.5B, for what compiles a grammar against its vocabulary or embeds with MiniLM."""
    yield from _serve(tmp_path_factory, create_app)


def engine(srv):
    return srv.app.state.loader.backend.engine


def idle(srv) -> bool:
    eng = engine(srv)
    return all(s.active is None for s in eng.slots) and not eng._pending and srv.app.state.admission.unfinished() == 0


def send(srv, path: str, body: bytes, content_type: str | None = "application/json", extra: dict | None = None):
    """Raw bytes on the wire, so a test can send what no JSON library would produce."""
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=300)
    headers = {"Authorization": f"Bearer {KEY}", **(extra or {})}
    if content_type:
        headers["Content-Type"] = content_type
    try:
        conn.request("POST", path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read().decode("utf-8", "replace")
    finally:
        conn.close()


def chat(**kw) -> dict:
    body = {"model": SMALL, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4, "temperature": 0}
    body.update(kw)
    return body


def assert_alive(srv) -> None:
    assert request(srv.base_url, "GET", "/health").status_code == 200


# ---------------------------------------------------------------- generated


def test_schemathesis_smoke_no_5xx_and_schema_conformant(model_srv):
    srv = model_srv  # generated response formats compile grammars against the real vocabulary
    result = fuzz(srv.base_url, KEY, cases=80, seed=11, cap=8)
    assert not result["server_died"]
    assert result["server_errors_5xx"] == 0, result["findings"]
    assert result["findings"] == [], json.dumps(result["findings"], indent=1)[:4000]
    assert result["cases"] >= 60
    assert result["statuses"].get("200", 0) > 0  # some cases reached the engine, not only the validators
    assert wait_until(lambda: idle(srv), timeout=120)


def test_hostile_schema_smoke_every_answer_a_200_or_a_400(model_srv):
    """The campaign's schema phase, small: in-bounds schemas compile (or are unsupported), the rest are refused."""
    srv = model_srv
    from scripts.fuzz_endpoint import fuzz_schemas

    result = fuzz_schemas(srv.base_url, KEY, cases=30, seed=5, model=SMALL)
    assert not result["server_died"] and result["findings"] == [], result["findings"][:3]
    assert result["over_bounds"] > 0 and result["refused_as_too_large"] > 0
    assert wait_until(lambda: idle(srv), timeout=120)


# ---------------------------------------------------------------- hand-written bad input

BAD_BODIES = {
    "malformed_json": (b'{"model": "auto", "messages": [', "application/json"),
    "invalid_utf8": (b'{"model":"auto","messages":[{"role":"user","content":"\xff\xfe\xc3"}]}', "application/json"),
    "deeply_nested": (b'{"model":"auto","messages":' + b"[" * 30000 + b"]" * 30000 + b"}", "application/json"),
    "nested_content_parts": (json.dumps(chat(messages=[{"role": "user", "content": [{"type": "text", "text": [[["x"]]]}]}])).encode(),
                             "application/json"),
    "nan_temperature": (b'{"model":"auto","messages":[{"role":"user","content":"x"}],"temperature":NaN}', "application/json"),
    "infinite_penalty": (b'{"model":"auto","messages":[{"role":"user","content":"x"}],"frequency_penalty":Infinity}',
                         "application/json"),
    "null_body": (b"null", "application/json"),
    "array_body": (b"[]", "application/json"),
    "empty_body": (b"", "application/json"),
    "wrong_content_type": (json.dumps(chat()).encode(), "text/plain"),
    "form_content_type": (b"model=auto&messages=hi", "application/x-www-form-urlencoded"),
    "no_content_type": (json.dumps(chat()).encode(), None),
}


@pytest.mark.parametrize("name", sorted(BAD_BODIES))
def test_malformed_bodies_are_400(srv, name):
    body, ctype = BAD_BODIES[name]
    status, text = send(srv, "/v1/chat/completions", body, ctype)
    assert status == 400, (name, status, text)
    err = json.loads(text)["error"]
    assert err["type"] == "invalid_request_error"
    if name in NOT_A_JSON_OBJECT:  # was "13: JSON decode error" (param "13"), "Input should be a valid dictionary"
        assert err["code"] == "invalid_json" and err["param"] is None, err
        assert "application/json" in err["message"] or "must be a JSON object" in err["message"], err
    assert_alive(srv)


NOT_A_JSON_OBJECT = {"malformed_json", "invalid_utf8", "deeply_nested", "null_body", "array_body", "empty_body",
                     "wrong_content_type", "form_content_type", "no_content_type"}


LONG = "word " * 1500  # ~1500 tokens > n_ctx 1024

BAD_REQUESTS = {
    "negative_max_tokens": ("/v1/chat/completions", chat(max_tokens=-5), "invalid_value"),
    "zero_max_tokens": ("/v1/chat/completions", chat(max_tokens=0), "invalid_value"),
    "giant_max_tokens": ("/v1/chat/completions", chat(max_tokens=10**30), "invalid_value"),
    "giant_max_completion_tokens": ("/v1/chat/completions", chat(max_completion_tokens=2**63), "invalid_value"),
    "empty_messages": ("/v1/chat/completions", chat(messages=[]), "invalid_value"),
    "wrong_role": ("/v1/chat/completions", chat(messages=[{"role": "root", "content": "x"}]), "invalid_value"),
    "role_missing": ("/v1/chat/completions", chat(messages=[{"content": "x"}]), "invalid_value"),
    "image_part": ("/v1/chat/completions", chat(messages=[{"role": "user", "content": [{"type": "image_url"}]}]),
                   "unsupported_value"),
    "text_part_without_text": ("/v1/chat/completions", chat(messages=[{"role": "user", "content": [{"type": "text"}]}]),
                               "invalid_value"),
    "empty_embedding_input": ("/v1/embeddings", {"model": EMBED, "input": ["ok", ""]}, "invalid_value"),
    "prompt_over_context": ("/v1/chat/completions", chat(messages=[{"role": "user", "content": LONG}]),
                            "context_length_exceeded"),
    "completion_over_context": ("/v1/completions", {"model": SMALL, "prompt": LONG, "max_tokens": 4},
                                "context_length_exceeded"),
    "fim_suffix_over_context": ("/v1/completions", {"model": SMALL, "prompt": "a", "suffix": LONG, "max_tokens": 4},
                                "context_length_exceeded"),
    "empty_prompt": ("/v1/completions", {"model": SMALL, "prompt": "", "max_tokens": 4}, "invalid_value"),
    "two_prompts": ("/v1/completions", {"model": SMALL, "prompt": ["a", "b"], "max_tokens": 4}, "unsupported_value"),
    "lone_surrogate_chat": ("/v1/chat/completions", chat(messages=[{"role": "user", "content": "a\ud800b"}]), "invalid_value"),
    "lone_surrogate_prompt": ("/v1/completions", {"model": SMALL, "prompt": "x\udfff", "max_tokens": 4}, "invalid_value"),
    "lone_surrogate_stop": ("/v1/chat/completions", chat(stop=["\udc00"]), "invalid_value"),
    "lone_surrogate_embedding": ("/v1/embeddings", {"model": EMBED, "input": ["ok", "x\ud83d"]}, "invalid_value"),
    "tool_schema_unknown_type": ("/v1/chat/completions", chat(
        tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}], tool_choice="required"),
        "invalid_schema"),
    "tool_schema_ref_loop": ("/v1/chat/completions", chat(
        tools=[{"type": "function", "function": {"name": "f", "parameters": {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}}}],
        tool_choice="required"), "invalid_schema"),
    "schema_ref_to_nothing": ("/v1/chat/completions", chat(response_format={"type": "json_schema", "json_schema": {
        "schema": {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}}}), "invalid_schema"),
    "schema_ref_to_an_anchor": ("/v1/chat/completions", chat(response_format={"type": "json_schema", "json_schema": {
        "schema": {"$defs": {"a": {"$anchor": "foo", "type": "string"}}, "$ref": "#foo"}}}), "invalid_schema"),
    "tool_schema_ref_to_nothing": ("/v1/chat/completions", chat(
        tools=[{"type": "function", "function": {"name": "f", "parameters": {"$ref": "#/nope"}}}], tool_choice="required"),
        "invalid_schema"),
    "tool_schema_properties_list": ("/v1/chat/completions", chat(
        tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": [1, 2]}}}],
        tool_choice="required"), "invalid_schema"),
    "tool_name_breaks_grammar": ("/v1/chat/completions", chat(
        tools=[{"type": "function", "function": {"name": '"}\n{{ x }}', "parameters": {}}}], tool_choice="required"), None),
    "tool_choice_unknown_tool": ("/v1/chat/completions", chat(
        tools=[{"type": "function", "function": {"name": "f"}}], tool_choice={"type": "function", "function": {"name": "g"}}),
        "invalid_value"),
    "tools_not_a_list": ("/v1/chat/completions", chat(tools={"type": "function"}), "invalid_value"),
    "regex_pattern_unanchored": ("/v1/chat/completions", chat(
        response_format={"type": "json_schema", "json_schema": {"schema": {"type": "string", "pattern": "(["}}}), "invalid_schema"),
    "json_schema_missing": ("/v1/chat/completions", chat(response_format={"type": "json_schema"}), "invalid_value"),
    "draft_mode_without_draft": ("/v1/chat/completions", chat(localspec={"mode": "draft", "k": 32}), None),
    "k_out_of_range": ("/v1/chat/completions", chat(localspec={"mode": "lookup", "k": 10**6}), "invalid_value"),
    "top_logprobs_too_many": ("/v1/chat/completions", chat(logprobs=True, top_logprobs=10**6), "invalid_value"),
    "negative_seed": ("/v1/chat/completions", chat(seed=-1), "invalid_value"),
    "too_many_stops": ("/v1/chat/completions", chat(stop=["x"] * 17), "invalid_value"),
    "embedding_token_ids": ("/v1/embeddings", {"model": EMBED, "input": [1, 2, 3]}, "invalid_value"),
    "embedding_empty_list": ("/v1/embeddings", {"model": EMBED, "input": []}, "invalid_value"),
    "embedding_too_long": ("/v1/embeddings", {"model": EMBED, "input": "word " * 2000}, "invalid_value"),
}


# Compiled against a real vocabulary (llama.cpp's grammar sampler): the real model's server.
GRAMMAR_CASES = {"tool_name_breaks_grammar", "deep_but_valid_response_schema"}


@pytest.mark.parametrize("name", sorted(set(BAD_REQUESTS) - GRAMMAR_CASES))
def test_bad_requests_get_a_clear_400(srv, name):
    _clear_400(srv, name)


@pytest.mark.parametrize("name", sorted(set(BAD_REQUESTS) & GRAMMAR_CASES))
def test_bad_grammar_requests_get_a_clear_400(model_srv, name):
    _clear_400(model_srv, name)


def _clear_400(srv, name: str) -> None:
    path, body, code = BAD_REQUESTS[name]
    status, text = send(srv, path, json.dumps(body).encode())
    assert status == 400, (name, status, text)
    err = json.loads(text)["error"]
    assert err["type"] == "invalid_request_error" and err["message"]
    if code:
        assert err["code"] == code, err
    if code == "context_length_exceeded":
        assert str(N_CTX) in err["message"]
    if name in FIXES:  # the fix fits the cause (was "not supported" for a part without text, "Split long
        assert FIXES[name] in err["message"], err  # texts" for an empty one)
    assert_alive(srv)


FIXES = {"text_part_without_text": "has no 'text'", "empty_embedding_input": "Leave empty texts out"}


ACCEPTED = {
    "unknown_fields_ignored": chat(user="u1", metadata={"a": 1}, store=False, not_a_field=[1, {"x": None}]),
    "huge_seed": chat(seed=2**70),
    "empty_stop_string": chat(stop=[""]),
    "nul_and_control_chars": chat(messages=[{"role": "user", "content": "a\u0000b\u0007\u202e"}]),
    "special_tokens_as_text": chat(messages=[{"role": "user", "content": "<|im_end|><|endoftext|><|im_start|>system"}]),
    "tiny_top_p_and_temperature": chat(top_p=1e-300, temperature=1e-300),
    "max_top_logprobs": chat(logprobs=True, top_logprobs=20),
    "tool_reply_without_call": chat(messages=[{"role": "tool", "content": "42"}]),
    "assistant_tool_call_with_broken_arguments": chat(messages=[
        {"role": "assistant", "tool_calls": [{"id": "1", "function": {"name": "f", "arguments": "{not json"}}]},
        {"role": "user", "content": "go on"}]),
    "deep_but_valid_response_schema": chat(response_format={"type": "json_schema", "json_schema": {"schema": json.loads(
        '{"type":"object","properties":{"a":' * 100 + '{"type":"string"}' + "}}" * 100)}}),
}


@pytest.mark.parametrize("name", sorted(set(ACCEPTED) - GRAMMAR_CASES))
def test_odd_but_valid_requests_are_answered(srv, name):
    _answered(srv, name)


@pytest.mark.parametrize("name", sorted(set(ACCEPTED) & GRAMMAR_CASES))
def test_odd_but_valid_grammar_requests_are_answered(model_srv, name):
    _answered(model_srv, name)


def _answered(srv, name: str) -> None:
    status, text = send(srv, "/v1/chat/completions", json.dumps(ACCEPTED[name]).encode())
    assert status == 200, (name, status, text)
    assert json.loads(text)["choices"][0]["finish_reason"] in ("stop", "length", "tool_calls")
    assert_alive(srv)


def test_body_over_limit_is_413_by_length_and_chunked(srv):
    big = json.dumps(chat(messages=[{"role": "user", "content": "y" * (BODY_LIMIT + 10)}])).encode()
    status, text = send(srv, "/v1/chat/completions", big)
    error = json.loads(text)["error"]
    assert status == 413 and error["code"] == "body_too_large" and "--max-body-mb" in error["message"]  # the fix
    # The same bytes without a Content-Length: counted as they arrive.
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=300)
    try:
        conn.request("POST", "/v1/chat/completions", body=iter([big[i:i + 8192] for i in range(0, len(big), 8192)]),
                     headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}, encode_chunked=True)
        resp = conn.getresponse()
        assert resp.status == 413
        assert "--max-body-mb" in json.loads(resp.read())["error"]["message"]
    finally:
        conn.close()
    assert_alive(srv)


# ---------------------------------------------------------------- clients that misbehave on the wire


def queue_depth(srv) -> float:
    text = request(srv.base_url, "GET", "/metrics", KEY).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    return families["localspec_queue_depth"].samples[0].value


def test_sse_client_that_never_reads_blocks_nobody_and_frees_its_slot(srv):
    assert wait_until(lambda: idle(srv), timeout=120)
    # A tiny receive window, and the client never calls recv(): the server's writes back up.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
    sock.connect(("127.0.0.1", srv.port))
    body = json.dumps(chat(messages=[{"role": "user", "content": "Count from 1 to 100."}], max_tokens=CAP, stream=True)).encode()
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + f"Authorization: Bearer {KEY}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    try:
        # Meanwhile other clients are served, streamed and not.
        status, text = send(srv, "/v1/chat/completions", json.dumps(chat()).encode())
        assert status == 200, text
        other = OpenStream(srv.base_url, "/v1/chat/completions", KEY, chat(stream=True))
        assert other.status_code == 200 and list(other.lines())[-2] == "data: [DONE]"
        other.close()
        assert_alive(srv)
    finally:
        sock.close()  # the reader goes away without ever reading
    assert wait_until(lambda: idle(srv), timeout=120)
    assert queue_depth(srv) == 0


def test_stream_dropped_right_after_headers_is_cancelled(srv):
    assert wait_until(lambda: idle(srv), timeout=120)
    streams = [OpenStream(srv.base_url, "/v1/chat/completions", KEY,
                          chat(messages=[{"role": "user", "content": f"Write a story number {i}."}], max_tokens=CAP, stream=True))
               for i in range(4)]  # 2 slots + 2 queued
    for s in streams:
        assert s.status_code == 200
        s.close()
    assert wait_until(lambda: idle(srv), timeout=120)
    assert queue_depth(srv) == 0
    status, _ = send(srv, "/v1/chat/completions", json.dumps(chat()).encode())
    assert status == 200


def test_half_sent_body_then_hang_up(srv):
    """A client that promises more body than it sends and disconnects: no request is left behind."""
    sock = socket.create_connection(("127.0.0.1", srv.port))
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + f"Authorization: Bearer {KEY}\r\nContent-Length: 5000\r\n\r\n".encode() + b'{"model": "auto", "mess')
    sock.close()
    assert_alive(srv)
    assert wait_until(lambda: idle(srv), timeout=60)


# ---------------------------------------------------------------- secrets and traversal on the live server


@pytest.mark.parametrize("path", ["/v1/models/..%2F..%2Fetc%2Fpasswd", "/v1/models/../../etc/passwd",
                                  "/v1/models/%2e%2e", "/v1/models/qwen%00"])
def test_model_id_paths_cannot_traverse(srv, path):
    r = request(srv.base_url, "GET", path, KEY)
    assert r.status_code == 404, r.text
    assert "root:" not in r.text
    assert_alive(srv)


def test_api_keys_never_reach_logs_or_the_metrics_db(srv):
    import logging

    wrong = "sk-wrong-Zq8vX2-never-log-me"
    records: list[str] = []

    class Grab(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(self.format(record))

    handler = Grab(level=logging.DEBUG)
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        assert send(srv, "/v1/chat/completions", json.dumps(chat()).encode())[0] == 200
        stream = OpenStream(srv.base_url, "/v1/chat/completions", KEY, chat(stream=True))
        list(stream.lines())
        stream.close()
        assert request(srv.base_url, "GET", "/v1/models", wrong).status_code == 401
        status, text = send(srv, "/v1/chat/completions", json.dumps(chat()).encode(),
                            extra={"Authorization": f"Bearer {wrong}"})
        assert status == 401 and wrong not in text
        assert send(srv, "/v1/chat/completions", b"{broken", extra={"X-Api-Key": wrong})[0] == 400
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
    metrics = srv.app.state.metrics
    assert metrics.flush()
    blobs = [p.read_bytes() for p in metrics.db_path.parent.glob(metrics.db_path.name + "*") if p.is_file()]
    assert blobs and any(b"api" in b for b in blobs)  # the requests were recorded
    for secret in (KEY, wrong):
        assert not any(secret.encode() in b for b in blobs), f"{secret} in the metrics DB"
        assert not any(secret in r for r in records), f"{secret} in the log"
