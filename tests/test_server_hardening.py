"""Hardening round 2 on the endpoint: one request must never kill the server, no web page may use it.

The crash class (a schema that becomes thousands of nested grammar groups) runs against a real
`localspec serve` in a subprocess, with the real llama.cpp grammar parser: if a case still crashed
the server, this test would fail, not the whole suite.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading

import pytest

from localspec.server import ServerSettings, create_app
from tests.common import DRAFT_ID, REPO, SHARED_STORE
from tests.server_harness import ServerThread, request, wait_until

CRASHER = {"type": "string", "maxLength": 20000}  # the 188-byte request of the issue


def chat_with_schema(schema: dict) -> dict:
    return {"model": DRAFT_ID, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4,
            "temperature": 0, "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}}


def forced_tool(params: dict) -> dict:
    return {"model": DRAFT_ID, "messages": [{"role": "user", "content": "Call it."}], "max_tokens": 4, "temperature": 0,
            "tools": [{"type": "function", "function": {"name": "f", "parameters": params}}], "tool_choice": "required"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(draft_path, tmp_path_factory):
    """`localspec serve` in its own process, with the 0.5B as its model."""
    port = _free_port()
    home = tmp_path_factory.mktemp("serve-home")
    env = dict(os.environ, LOCALSPEC_HOME=str(home), LOCALSPEC_MODELS_DIR=str(SHARED_STORE),
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    log = (home / "serve.log").open("w")  # a file, not a pipe: nobody reads it while the server runs
    proc = subprocess.Popen(
        [sys.executable, "-m", "localspec", "serve", "--port", str(port), "--model", DRAFT_ID, "--no-pull",
         "--mode", "off", "--parallel", "1", "--n-ctx", "512", "--threads", "2", "--max-tokens-cap", "16"],
        env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    base = f"http://127.0.0.1:{port}"

    def status() -> str:
        try:
            return request(base, "GET", "/health", timeout=5).json()["status"]
        except (OSError, ValueError):
            return "down"

    wait_until(lambda: status() in ("ok", "error") or proc.poll() is not None, timeout=300)
    assert proc.poll() is None and status() == "ok", (home / "serve.log").read_text()[-3000:]
    yield proc, base
    proc.terminate()
    proc.wait(timeout=60)
    log.close()


ADDRESS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
# What pydantic writes for a model with a nested one, and for a recursive one (a root that is a $ref).
NESTED_PARAMS = {"$defs": {"Address": ADDRESS}, "type": "object",
                 "properties": {"home": {"$ref": "#/$defs/Address"}}, "required": ["home"]}
TREE = {"$defs": {"Node": {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 8},
    "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}, "maxItems": 2}},
    "required": ["name", "children"]}}, "$ref": "#/$defs/Node"}


def _alive(proc, base: str) -> None:
    assert proc.poll() is None, f"the server died with exit status {proc.returncode}"
    assert request(base, "GET", "/health").status_code == 200


# One case per class of schema quantity; each must be a 400 naming the field and the limit.
BOUNDS = {
    "maxLength_20000": (chat_with_schema(CRASHER), "maxLength", "1000"),
    "minLength_huge": (chat_with_schema({"type": "string", "minLength": 100000}), "minLength", "1000"),
    "pattern_repeat": (chat_with_schema({"type": "string", "pattern": "^a{0,20000}$"}), "pattern", "1000"),
    "pattern_nested_repeat": (chat_with_schema({"type": "string", "pattern": "^(a{0,100}){0,100}$"}), "pattern", "4096"),
    "pattern_nesting": (chat_with_schema({"type": "string", "pattern": "^" + "(" * 40 + "a" + ")" * 40 + "$"}),
                        "pattern", "32"),
    "maxItems": (chat_with_schema({"type": "array", "items": {"type": "integer"}, "maxItems": 5000}), "maxItems", "256"),
    "minItems": (chat_with_schema({"type": "array", "items": {"type": "string"}, "minItems": 100000}), "minItems", "256"),
    "deep_nesting": (chat_with_schema(json.loads('{"type":"array","items":' * 200 + '{"type":"string"}' + "}" * 200)),
                     "nesting depth", "128"),
    "many_properties": (chat_with_schema({"type": "object", "properties": {f"p{i}": {"type": "integer"}
                                                                              for i in range(900)}}),
                        "properties", "256"),
    "huge_enum": (chat_with_schema({"enum": [f"v{i}" for i in range(5000)]}), "enum", "1024"),
    "tool_params_maxLength": (forced_tool({"type": "object", "properties": {"x": CRASHER}}), "tools[0]", "1000"),
}


@pytest.mark.models
@pytest.mark.parametrize("name", sorted(BOUNDS))
def test_schema_bounds_are_a_400_naming_field_and_limit(served, name):
    proc, base = served
    body, field, limit = BOUNDS[name]
    r = request(base, "POST", "/v1/chat/completions", json_body=body)
    assert r.status_code == 400, (name, r.status_code, r.text)
    err = r.json()["error"]
    assert err["code"] == "schema_too_large" and field in err["message"] and limit in err["message"], err
    assert "\n" not in err["message"]
    _alive(proc, base)


@pytest.mark.models
def test_pydantic_schemas_with_defs_are_enforced_in_forced_tools_and_response_formats(served):
    """A tool's "#/$defs/Address" pointed at the combined schema's root once nested under `arguments`
    (400 "Error resolving ref"), and a root $ref left the converter a KeyError (400 "'#/$defs/Node'")."""
    proc, base = served
    body = forced_tool(NESTED_PARAMS) | {"max_tokens": 16}
    r = request(base, "POST", "/v1/chat/completions", json_body=body)
    assert r.status_code == 200, r.text
    message = r.json()["choices"][0]["message"]  # 16 tokens: the call is cut short, and returned as text
    said = message["content"] or message["tool_calls"][0]["function"]["arguments"]
    assert said.replace(" ", "").startswith('{"name":"f","arguments":{"home":{"city":"'), message
    r = request(base, "POST", "/v1/chat/completions", json_body=chat_with_schema(TREE) | {"max_tokens": 16})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"].replace(" ", "").startswith('{"name":"'), r.text
    _alive(proc, base)


@pytest.mark.parametrize("where", ["response_format", "tool"])
@pytest.mark.parametrize(("n", "keywords"), [({"type": "number", "minimum": 0, "exclusiveMinimum": True}, ["minimum", "exclusiveMinimum"]),
                                              ({"type": "number", "multipleOf": 0.5}, ["multipleOf"]),
                                              ({"type": "array", "items": {"type": "string"}, "uniqueItems": True},
                                               ["uniqueItems"]),
                                              ({"type": "integer", "minimum": 1, "enum": [0, 1, 2]}, ["minimum"]),
                                              ({"type": "integer", "maximum": 10**19}, ["maximum"])])
def test_a_schema_keyword_the_grammar_cannot_keep_is_named_and_the_grammar_is_partial(where, n, keywords):
    """`minimum` was dropped by the converter while the reply said grammar "enforced": {"n": 5} for a
    minimum of 100. An integer's bounds are now kept (below); what the grammar cannot keep (a float's
    Field(ge=0), a set[str]: pydantic writes them everywhere) is served and named: grammar "partial"."""
    from localspec.server.schemas import ChatCompletionRequest
    from localspec.server.translate import chat_plan

    schema = {"type": "object", "properties": {"n": n, "note": {"type": "string", "x-meta": {"minimum": 1}}},
              "required": ["n"]}
    body = chat_with_schema(schema) if where == "response_format" else forced_tool(schema)
    plan = chat_plan(ChatCompletionRequest.model_validate(body), 16)
    assert plan.grammar_kept == "partial" and plan.request.grammar
    assert [p.rsplit(".", 3)[-3:] for p in plan.grammar_unenforced] == [["properties", "n", k] for k in keywords]
    assert all(f"properties.n.{k}" in (plan.fallback or "") for k in keywords)  # x-meta's dict is not a schema
    assert "check those values" in (plan.fallback or "")


@pytest.mark.parametrize("where", ["response_format", "tool"])
@pytest.mark.parametrize("n", [{"type": "integer", "minimum": 1, "maximum": 5},
                               {"type": "number", "minimum": 0, "maximum": 1},  # pydantic's Field(ge=0, le=1)
                               {"type": "number", "exclusiveMinimum": 0}])
def test_a_schema_the_grammar_keeps_whole_says_enforced(where, n):
    """A number's bounds were named as not kept (grammar "partial") until they became a rule of ours."""
    from localspec.server.schemas import ChatCompletionRequest
    from localspec.server.translate import chat_plan

    schema = {"type": "object", "properties": {"n": n}}
    body = chat_with_schema(schema) if where == "response_format" else forced_tool(schema)
    plan = chat_plan(ChatCompletionRequest.model_validate(body), 16)
    assert plan.grammar_kept == "enforced" and not plan.grammar_unenforced and plan.fallback is None
    assert "localspec-range" not in (plan.request.grammar or "")


@pytest.mark.models
def test_an_integers_bounds_are_kept_by_the_grammar(served):
    """Asked for {"n": 5} against 100..200, the grammar made the model write a number in range."""
    proc, base = served
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 100, "maximum": 200}},
              "required": ["n"]}
    body = chat_with_schema(schema) | {"messages": [{"role": "user", "content": 'Reply with the JSON {"n": 5}.'}],
                                       "max_tokens": 12}
    r = request(base, "POST", "/v1/chat/completions", json_body=body)
    assert r.status_code == 200 and r.json()["localspec"]["grammar"] == "enforced", r.text
    assert 100 <= json.loads(r.json()["choices"][0]["message"]["content"])["n"] <= 200, r.text
    _alive(proc, base)


@pytest.mark.models
def test_a_numbers_bounds_are_kept_by_the_grammar(served):
    """Asked for {"p": 7.5} against 0..1 (pydantic's Field(ge=0, le=1) on a float), the grammar made the
    model write a number in range; the converter alone let it write 7.5."""
    proc, base = served
    schema = {"type": "object", "properties": {"p": {"type": "number", "minimum": 0, "maximum": 1}}, "required": ["p"]}
    body = chat_with_schema(schema) | {"messages": [{"role": "user", "content": 'Reply with the JSON {"p": 7.5}.'}],
                                       "max_tokens": 16}
    r = request(base, "POST", "/v1/chat/completions", json_body=body)
    assert r.status_code == 200 and r.json()["localspec"]["grammar"] == "enforced", r.text
    assert 0 <= json.loads(r.json()["choices"][0]["message"]["content"])["p"] <= 1, r.text
    _alive(proc, base)


def test_bounds_that_leave_no_number_are_a_400():
    from localspec.server.errors import APIError
    from localspec.server.schemas import ChatCompletionRequest
    from localspec.server.translate import chat_plan

    body = chat_with_schema({"type": "number", "exclusiveMinimum": 0.5, "maximum": 0.5})
    with pytest.raises(APIError) as err:
        chat_plan(ChatCompletionRequest.model_validate(body), 16)
    assert err.value.code == "invalid_schema" and "no number meets maximum 0.5, exclusiveMinimum 0.5" in err.value.message


def test_bounds_that_leave_no_integer_are_a_400():
    from localspec.server.errors import APIError
    from localspec.server.schemas import ChatCompletionRequest
    from localspec.server.translate import chat_plan

    body = chat_with_schema({"type": "integer", "exclusiveMinimum": 3, "exclusiveMaximum": 4})
    with pytest.raises(APIError) as err:
        chat_plan(ChatCompletionRequest.model_validate(body), 16)
    assert err.value.code == "invalid_schema" and "no integer is from 4 to 3" in err.value.message


def test_two_tools_defining_the_same_name_keep_their_own_definitions():
    """Nested under each tool, both tools' "Address" became one grammar rule (the converter names a
    ref's rule by its last part), so the second tool's fields were the first's."""
    import llama_cpp

    from localspec.server.schemas import ChatCompletionRequest
    from localspec.server.translate import chat_plan

    other = {"$defs": {"Address": {"type": "object", "properties": {"zip": {"type": "integer"}}, "required": ["zip"]}},
             "type": "object", "properties": {"work": {"$ref": "#/$defs/Address"}, "next": {"$ref": "#"}},
             "required": ["work"]}
    body = forced_tool(NESTED_PARAMS)
    body["tools"].append({"type": "function", "function": {"name": "g", "parameters": other}})
    gbnf = chat_plan(ChatCompletionRequest.model_validate(body), 16).request.grammar
    rules = dict(line.split(" ::= ", 1) for line in gbnf.splitlines())
    assert '"\\"city\\""' in rules["tool0-Address-city-kv"] and '"\\"zip\\""' in rules["tool1-Address-zip-kv"]
    assert rules["tool1-next"] == "tool1"  # "#" is the tool's own parameters
    llama_cpp.LlamaGrammar.from_string(gbnf, verbose=False)


@pytest.mark.models
def test_the_188_byte_request_no_longer_kills_the_server(served):
    proc, base = served
    raw = json.dumps(chat_with_schema(CRASHER)["response_format"], separators=(",", ":"))
    assert len(raw) < 120  # the schema itself is tiny; the danger is what it expands to
    assert request(base, "POST", "/v1/chat/completions", json_body=chat_with_schema(CRASHER)).status_code == 400
    # A schema at the bounds still compiles and answers.
    ok = request(base, "POST", "/v1/chat/completions",
                 json_body=chat_with_schema({"type": "string", "maxLength": 1000, "pattern": "^[a-z]{0,1000}$"}))
    assert ok.status_code == 200, ok.text
    _alive(proc, base)


_PARSER_SCRIPT = r"""
import sys, threading
import llama_cpp
from localspec.engine.grammar import Grammar
from localspec.engine.grammar_limits import GrammarTooLarge

llama_cpp.llama_backend_init()
params = llama_cpp.llama_model_default_params()
params.vocab_only = True
model = llama_cpp.llama_model_load_from_file(sys.argv[1].encode(), params)
vocab = llama_cpp.llama_model_get_vocab(model)
n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)

def nested(depth):
    return "root ::= " + "(" * depth + '"a"' + ")?" * depth + "\n"

try:
    Grammar.compile(vocab, n_vocab, nested(20000), 0)
    print("compiled the 20000-deep grammar")
except GrammarTooLarge as exc:
    print("refused:", exc.cause)

# As deep as a schema at its bounds makes (maxLength 1000), asked for from a thread with a 256 KiB
# stack, on which llama.cpp's parser segfaults at this depth: it parses on the parser's own
# big-stack thread, so the caller's stack does not matter.
result = []
threading.stack_size(256 << 10)
t = threading.Thread(target=lambda: result.append(Grammar.compile(vocab, n_vocab, nested(1000), 0)))
t.start(); t.join()
print("deep ok" if result else "deep failed")
"""


@pytest.mark.models
def test_the_grammar_parser_is_bounded_and_runs_on_a_big_stack(draft_path):
    proc = subprocess.run([sys.executable, "-c", _PARSER_SCRIPT, str(draft_path)], capture_output=True, text=True,
                          timeout=300, cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")))
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-2000:]}"
    assert "refused: grammar: the grammar's group nesting is 20000, over this server's limit of 2000" in proc.stdout
    assert "deep ok" in proc.stdout


# ---------------------------------------------------------------- without a model: guards


def _never_loads(never: threading.Event):
    def load(settings):
        never.wait()
        raise RuntimeError("test over")

    return load


@pytest.fixture(scope="module")
def loading_app():
    """A server whose models never load: the guards answer before any route needs them."""
    never = threading.Event()
    app = create_app(ServerSettings(allowed_hosts=["host.docker.internal"],
                                    allowed_origins=["https://editor.example"]), load=_never_loads(never))
    with ServerThread(app) as srv:
        yield srv
        never.set()


@pytest.mark.parametrize("host", ["attacker.example", "attacker.example:8000", "127.0.0.1.nip.io", "10.0.0.5",
                                  "localhost.attacker.example"])
@pytest.mark.parametrize("path", ["/health", "/docs", "/v1/models", "/v1/cache/stats", "/metrics"])
def test_dns_rebinding_hosts_are_refused_on_every_route(loading_app, host, path):
    r = request(loading_app.base_url, "GET", path, headers={"Host": host})
    assert r.status_code == 403, (host, path, r.status_code)
    err = r.json()["error"]
    assert err["code"] == "host_not_allowed" and "--allowed-hosts" in err["message"]
    assert err["type"] == "permission_error"  # OpenAI's type for a 403 (was server_error)


@pytest.mark.parametrize("host", ["localhost", "localhost:8000", "127.0.0.1:1234", "[::1]:8000", "LOCALHOST",
                                  "host.docker.internal:8000"])
def test_loopback_names_and_allowed_hosts_pass(loading_app, host):
    r = request(loading_app.base_url, "GET", "/health", headers={"Host": host})
    assert r.status_code == 503 and r.json()["status"] == "loading"  # past the guard, into the loading state


@pytest.mark.parametrize("origin, allowed", [
    ("http://evil.example", False), ("https://attacker.example:443", False), ("null", False),
    ("file://", False), ("http://localhost:3000", True), ("http://127.0.0.1:8080", True),
    ("https://editor.example", True), ("http://[::1]:5173", True),
])
def test_origins_from_foreign_pages_are_refused(loading_app, origin, allowed):
    r = request(loading_app.base_url, "GET", "/health", headers={"Origin": origin})
    assert (r.status_code != 403) is allowed, (origin, r.status_code, r.text)
    if not allowed:
        assert r.json()["error"]["code"] == "origin_not_allowed"


def test_a_request_without_origin_passes_and_loopback_pages_get_cors(loading_app):
    assert request(loading_app.base_url, "GET", "/health").status_code == 503
    r = request(loading_app.base_url, "GET", "/health", headers={"Origin": "http://localhost:3000"})
    assert r.headers["access-control-allow-origin"] == "http://localhost:3000"


def test_cors_preflight_with_a_key_is_answered_before_auth():
    never = threading.Event()
    app = create_app(ServerSettings(api_key="k", allowed_origins=["https://editor.example"]),
                     load=_never_loads(never))
    with ServerThread(app) as srv:
        pre = request(srv.base_url, "OPTIONS", "/v1/chat/completions", headers={
            "Origin": "https://editor.example", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type"})
        assert pre.status_code == 200, pre.text
        assert pre.headers["access-control-allow-origin"] == "https://editor.example"
        # The real request still needs the key, and its 401 carries CORS so the page can read it.
        r = request(srv.base_url, "GET", "/v1/models", headers={"Origin": "https://editor.example"})
        assert r.status_code == 401 and r.headers["access-control-allow-origin"] == "https://editor.example"
        assert request(srv.base_url, "GET", "/v1/models", key="k").status_code == 503
        never.set()


def test_health_shows_no_file_paths():
    from localspec.errors import IntegrityError

    def broken(settings):
        raise IntegrityError("Model file /root/.local/share/localspec/models/x/x.gguf is truncated.",
                             "Pull it again.")

    with ServerThread(create_app(ServerSettings(), load=broken)) as srv:
        assert wait_until(lambda: request(srv.base_url, "GET", "/health").json()["status"] == "error")
        detail = request(srv.base_url, "GET", "/health").json()["detail"]
        assert "x.gguf is truncated" in detail and "/root" not in detail and "/x/" not in detail


# ---------------------------------------------------------------- the plan is built off the event loop


class _NamesOnly:
    """Enough of a backend for the routes to reach the request plan."""

    target_names = {"m"}
    embedding_names: set[str] = set()


def test_schema_conversion_runs_off_the_event_loop(monkeypatch):
    from localspec.server import translate
    from localspec.server.errors import APIError

    seen: list[threading.Thread] = []

    def recording_plan(*args, **kwargs):
        seen.append(threading.current_thread())
        raise APIError(400, "stop here", "test")

    monkeypatch.setattr(translate, "chat_plan", recording_plan)
    app = create_app(ServerSettings(), load=lambda s: _NamesOnly())
    with ServerThread(app) as srv:
        assert wait_until(lambda: request(srv.base_url, "GET", "/health").status_code == 200)
        r = request(srv.base_url, "POST", "/v1/chat/completions",
                    json_body={"model": "m", "messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 400 and r.json()["error"]["message"] == "stop here"
    assert seen and seen[0] is not srv._thread, "the plan was built on the server's event-loop thread"


def test_a_big_schema_body_is_refused_at_its_first_bound():
    """The issue's 210 KiB body (8 objects x 900 properties) froze /health for 8 s; now it is a quick 400."""
    from localspec.server import translate
    from localspec.server.errors import APIError
    from localspec.server.schemas import ChatCompletionRequest

    props = {f"p{i}": {"type": "string"} for i in range(900)}
    schema = {"type": "object", "properties": {f"o{j}": {"type": "object", "properties": props} for j in range(8)}}
    body = ChatCompletionRequest.model_validate(chat_with_schema(schema) | {"model": "m"})
    assert len(json.dumps(schema)) > 200_000
    with pytest.raises(APIError) as err:
        translate.chat_plan(body, 64)
    assert err.value.status == 400 and "properties" in err.value.message and "256" in err.value.message


# ---------------------------------------------------------------- serve's flags


def test_bad_serve_flags_are_one_line_errors(capsys):
    from localspec.cli import main

    for argv, words in ((["--port", "99999"], "--port"), (["--parallel", "0"], "--parallel"),
                        (["--max-body-mb", "0"], "--max-body-mb"), (["--api-key-file", "/nonexistent/keys"], "key file"),
                        (["--ssl-certfile", "/nonexistent/cert.pem"], "TLS")):
        assert main(["serve", "--no-pull", *argv]) != 0
        err = capsys.readouterr().err
        assert words in err and "Traceback" not in err and err.startswith("error: "), (argv, err)


def test_tls_files_that_are_not_pem_and_a_key_file_that_is_not_text_are_one_line_errors(tmp_path, capsys):
    """Both were tracebacks: uvicorn's ssl.SSLError ("PEM lib") once the server started, and a
    UnicodeDecodeError reading the keys."""
    from localspec.cli import main

    junk, keys = tmp_path / "junk.pem", tmp_path / "keys"
    junk.write_text("not a certificate\n")
    keys.write_bytes(b"\xff\xfekey\n")
    keys.chmod(0o600)
    for argv, words in ((["--ssl-certfile", str(junk), "--ssl-keyfile", str(junk)], "do not load"),
                        (["--api-key-file", str(keys)], "is not UTF-8")):
        assert main(["serve", "--no-pull", "--port", "0", *argv]) == 1
        err = capsys.readouterr().err
        assert words in err and err.startswith("error: ") and len(err.splitlines()) == 2, (argv, err)


def test_an_unknown_profile_is_refused_before_the_server_starts(monkeypatch, capsys):
    """With --no-pull it started, and every request got the load's 503; from $LOCALSPEC_PROFILE or
    settings.toml the refusal names where it was set."""
    import localspec.server
    from localspec.cli import main

    started: list[object] = []
    monkeypatch.setattr(localspec.server, "serve", started.append)
    assert main(["serve", "--no-pull", "--port", "0", "--profile", "no-such-profile"]) != 0
    err = capsys.readouterr().err
    assert "no-such-profile" in err and "Traceback" not in err and err.startswith("error: "), err
    monkeypatch.setenv("LOCALSPEC_PROFILE", "no-such-profile")
    assert main(["serve", "--no-pull", "--port", "0"]) != 0
    err = capsys.readouterr().err
    assert "$LOCALSPEC_PROFILE" in err and "no-such-profile" in err, err
    assert not started


def test_api_key_on_the_command_line_warns_and_a_key_file_is_checked(tmp_path, capsys):
    from localspec.cli import main
    from localspec.server.settings import read_key_file

    main(["serve", "--no-pull", "--api-key", "k", "--port", "99999"])
    assert "visible to every user" in capsys.readouterr().err
    keys = tmp_path / "keys"
    keys.write_text("# editor\nkey-one\n\nkey-two\n")
    keys.chmod(0o644)
    with pytest.raises(Exception, match="readable by other users"):
        read_key_file(keys)
    keys.chmod(0o600)
    assert read_key_file(keys) == ["key-one", "key-two"]
    assert ServerSettings(host="0.0.0.0", api_key_file=keys).keys() == ["key-one", "key-two"]
    ServerSettings(host="0.0.0.0", api_key_file=keys).check_bind()  # a key file is a key


# ---------------------------------------------------------------- embeddings: caps and admission


@pytest.fixture(scope="module")
def embed_srv(draft_path, minilm_path, module_home):
    settings = ServerSettings(target=DRAFT_ID, mode="off", parallel=1, max_queue=0, n_ctx=512, n_threads=2,
                              max_tokens_cap=64, max_embedding_tokens=40, router=False, cache=False)
    with ServerThread(create_app(settings)) as server:
        assert wait_until(lambda: request(server.base_url, "GET", "/health").status_code == 200, timeout=300)
        yield server


def _embed(srv, texts) -> object:
    return request(srv.base_url, "POST", "/v1/embeddings", json_body={"model": "all-minilm-l6-v2-f16", "input": texts})


@pytest.mark.models
def test_embeddings_cap_inputs_and_tokens(embed_srv):
    r = _embed(embed_srv, ["a"] * 2049)
    assert r.status_code == 400 and r.json()["error"]["code"] == "too_many_inputs" and "2048" in r.text
    r = _embed(embed_srv, ["one two three four five six seven"] * 8)  # ~9 tokens each, 40 allowed in all
    assert r.status_code == 400 and "at most 40" in r.json()["error"]["message"]
    assert _embed(embed_srv, ["one two three"] * 2).status_code == 200


@pytest.mark.models
def test_embeddings_share_admission_with_generation(embed_srv):
    from tests.server_harness import OpenStream

    stream = OpenStream(embed_srv.base_url, "/v1/chat/completions", "unused", {
        "model": DRAFT_ID, "messages": [{"role": "user", "content": "Count from 1 to 200."}],
        "max_tokens": 64, "temperature": 0, "stream": True})
    try:
        assert stream.status_code == 200
        next(stream.lines())  # the request holds the server's one place
        busy = _embed(embed_srv, "hello")
        assert busy.status_code == 429 and busy.headers["Retry-After"]
    finally:
        stream.close()
    assert wait_until(lambda: _embed(embed_srv, "hello").status_code == 200, timeout=120)


def test_the_embedders_recent_vectors_never_keep_the_texts(embedder):
    long_text = "word " * 20000  # far over the window: refused
    assert embedder.embed(long_text) is None
    assert embedder.embed("a short text") is not None
    assert all(isinstance(k, bytes) and len(k) == 16 for k in embedder._recent)


# ---------------------------------------------------------------- TLS


@pytest.mark.models
def test_serve_speaks_tls_with_a_certificate(draft_path, tmp_path, module_home):
    import shutil
    import ssl

    from tests.serve_process import ServeProcess

    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed to make a test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-days", "1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    args = ["--model", DRAFT_ID, "--no-pull", "--mode", "off", "--ssl-certfile", str(cert), "--ssl-keyfile", str(key)]
    with ServeProcess(args, tls=True) as server:
        ctx = ssl.create_default_context(cafile=str(cert))
        import http.client

        conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=ctx, timeout=60)
        conn.request("GET", "/health")
        resp = conn.getresponse()
        assert resp.status in (200, 503) and json.loads(resp.read())["status"] in ("ok", "loading")
        conn.close()


def test_host_and_origin_fuzz_finds_nothing(loading_app):
    """The campaign's Host/Origin phase, small: 403 exactly when an independent statement of the rule says so."""
    from scripts.fuzz_endpoint import fuzz_hosts

    result = fuzz_hosts(loading_app.base_url, cases=300, seed=3, allowed_hosts=("host.docker.internal",),
                        allowed_origins=("https://editor.example",))
    assert result["findings"] == [], result["findings"][:5]
    assert result["statuses"].get("403", 0) > 50  # the run did meet the guard


def test_a_burst_is_admitted_only_up_to_slots_and_queue():
    """Each request counts from its admission check: a burst of 40 passed the check while the first ones
    were still tokenizing, and all 40 were queued against a capacity of 20 (no 429 at all). Here the
    tokenizer holds every request that reaches it until all six are either in it or refused."""
    from tests.fake_tier import Reply, scripted_app, scripted_pipeline, scripted_tier

    tier = scripted_tier(model_id="scripted", script=lambda prompt: Reply("word " * 40, pace_s=0.01), parallel=1)
    pipeline = scripted_pipeline(tiers=[tier])
    submit, release, tokenizing = pipeline.submit, threading.Event(), []

    def tokenizing_slowly(*args, **kwargs):
        tokenizing.append(1)
        release.wait(60)  # a long prompt's tokenization: the window the burst went through
        return submit(*args, **kwargs)

    pipeline.submit = tokenizing_slowly
    app = scripted_app(pipeline=pipeline, settings=ServerSettings(parallel=1, max_queue=1, cache=False, router=False))
    with ServerThread(app) as srv:
        assert wait_until(lambda: request(srv.base_url, "GET", "/health").status_code == 200, timeout=60)
        body = {"model": "scripted", "messages": [{"role": "user", "content": "Say words."}], "max_tokens": 40}
        statuses: list[int] = []

        def ask() -> None:
            statuses.append(request(srv.base_url, "POST", "/v1/chat/completions", json_body=body).status_code)

        askers = [threading.Thread(target=ask) for _ in range(6)]
        for t in askers:
            t.start()
        assert wait_until(lambda: len(tokenizing) + statuses.count(429) == 6, timeout=60), (tokenizing, statuses)
        release.set()
        for t in askers:
            t.join(120)
    assert sorted(statuses) == [200, 200, 429, 429, 429, 429], statuses


def test_the_start_up_line_names_a_usable_address(monkeypatch, capsys):
    """`--port 0` printed `serving http://127.0.0.1:0/v1`, and an IPv6 host came without brackets."""
    import localspec.server
    from localspec.cli import main

    monkeypatch.setattr(localspec.server, "serve", lambda settings: None)
    assert main(["serve", "--no-pull", "--port", "0"]) == 0
    out = capsys.readouterr().out
    assert ":0/" not in out and "free port" in out, out
    assert main(["serve", "--no-pull", "--host", "::1", "--port", "8123"]) == 0
    assert "serving http://[::1]:8123/v1 " in capsys.readouterr().out
