"""Hostile bodies on every generating route: the chat route, /v1/responses and Ollama's /api/chat and
/api/generate answer each the same way, a 400 naming the field (never a 500 and a traceback).

A real server on loopback over a scripted target (tests/fake_tier.py); what each case sends is a
client's doing, so nothing here needs model weights.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from localspec.server import ServerSettings
from localspec.server.errors import APIError
from localspec.server.routes.plans import valid_or_400
from localspec.server.schemas import MAX_JSON_DEPTH, ChatCompletionRequest
from localspec.server.translate import parse_tool_calls
from tests.fake_tier import scripted_app, scripted_backend, scripted_pipeline, scripted_tier
from tests.server_harness import ServerThread, request

MODEL = "scripted-hostile"
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def served(module_home):
    tier = scripted_tier(model_id=MODEL, script=lambda prompt: "Red, green, blue.")
    backend = scripted_backend(pipeline=scripted_pipeline(tiers=[tier]))
    app = scripted_app(backend=backend, settings=ServerSettings(cache=False, router=False, max_tokens_cap=256))
    with ServerThread(app) as srv:
        yield srv


def nested(levels: int) -> Any:
    """A JSON value `levels` objects deep: {"a": {"a": ... {} ...}}."""
    value: dict[str, Any] = {}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


DEEP = "__deep__"


def nested_text(body: dict, levels: int) -> str:
    """`body` as JSON text with the string DEEP replaced by a value `levels` objects deep, written as text:
    json.dumps recurses per level, and under pytest-xdist's deeper stack 950 levels passed its limit."""
    return json.dumps(body).replace(json.dumps(DEEP), '{"a": ' * (levels - 1) + "{}" + "}" * (levels - 1), 1)


def error_text(r) -> str:
    err = r.json()["error"]
    return err if isinstance(err, str) else err["message"]


# Each places a value nested `levels` deep where a client may put JSON of its own.
DEEP_FIELDS = {
    "chat forced tool parameters": ("/v1/chat/completions", lambda v: {
        "model": MODEL, "messages": HI, "tool_choice": "required",
        "tools": [{"type": "function", "function": {"name": "f", "parameters": v}}]}),
    "chat response_format schema": ("/v1/chat/completions", lambda v: {
        "model": MODEL, "messages": HI,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": v}}}),
    "responses tool parameters": ("/v1/responses", lambda v: {
        "model": MODEL, "input": "hi", "tools": [{"type": "function", "name": "f", "parameters": v}]}),
    "responses forced tool parameters": ("/v1/responses", lambda v: {
        "model": MODEL, "input": "hi", "tool_choice": "required",
        "tools": [{"type": "function", "name": "f", "parameters": v}]}),
    "messages tool input_schema": ("/v1/messages", lambda v: {
        "model": MODEL, "max_tokens": 8, "messages": HI, "tools": [{"name": "f", "input_schema": v}]}),
    "messages tool_use input": ("/v1/messages", lambda v: {
        "model": MODEL, "max_tokens": 8, "messages": [*HI, {"role": "assistant", "content": [
            {"type": "tool_use", "id": "t", "name": "f", "input": {"a": v}}]}]}),
    "messages output_config schema": ("/v1/messages", lambda v: {
        "model": MODEL, "max_tokens": 8, "messages": HI, "output_config": {"format": {"type": "json_schema",
                                                                                    "schema": v}}}),
    "ollama format": ("/api/chat", lambda v: {"model": MODEL, "stream": False, "messages": HI, "format": v}),
    "ollama tool call arguments": ("/api/chat", lambda v: {
        "model": MODEL, "stream": False,
        "messages": [*HI, {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": v}}]}]}),
}


@pytest.mark.parametrize("case", sorted(DEEP_FIELDS))
@pytest.mark.parametrize("levels", [500, 950])
def test_a_body_nested_past_the_limit_is_a_400_naming_it(served, case, levels):
    """Nested 500 to 1000 levels (under the JSON parser's own limit), such a body reached a recursive
    step (the unicode check, a deep copy, pydantic's serializer): a RecursionError and a 500."""
    path, body = DEEP_FIELDS[case]
    r = request(served.base_url, "POST", path, json_text=nested_text(body(DEEP), levels))
    assert r.status_code == 400, (case, r.status_code, r.text[:300])
    assert f"over {MAX_JSON_DEPTH} levels deep" in error_text(r) and "\n" not in error_text(r)
    assert "Value error" not in error_text(r)
    if not path.startswith(("/api/", "/v1/messages")):  # OpenAI's error object carries a code: too deep, not invalid
        assert r.json()["error"]["code"] == "json_too_deep"


@pytest.mark.parametrize("stream", [False, True])
def test_a_response_echoes_tools_nested_to_the_limit(served, stream):
    """A Response echoes the request's tools: nested past pydantic's serialization depth (255), the
    answer was generated and then lost to a 500. The body's limit keeps the echo within it."""
    body = {"model": MODEL, "input": "hi", "stream": stream,
            "tools": [{"type": "function", "name": "f", "parameters": nested(MAX_JSON_DEPTH - 3)}]}
    r = request(served.base_url, "POST", "/v1/responses", json_body=body)  # body, tools, [0], parameters...
    assert r.status_code == 200, r.text[:300]
    assert ("response.completed" in r.text) if stream else r.json()["status"] == "completed"
    body["tools"][0]["parameters"] = nested(MAX_JSON_DEPTH - 2)
    assert request(served.base_url, "POST", "/v1/responses", json_body=body).status_code == 400


DEEP_TEXT = '{"a":' * 5000 + "1" + "}" * 5000  # past the stack as parsed JSON, a short string in the body

ARGUMENTS_AS_TEXT = {
    "chat": ("/v1/chat/completions", {"model": MODEL, "messages": [*HI, {"role": "assistant", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": DEEP_TEXT}}]}]}),
    "responses": ("/v1/responses", {"model": MODEL, "input": [
        *HI, {"type": "function_call", "call_id": "c1", "name": "f", "arguments": DEEP_TEXT}]}),
    "ollama": ("/api/chat", {"model": MODEL, "stream": False, "messages": [
        *HI, {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": DEEP_TEXT}}]}]}),
}


@pytest.mark.parametrize("case", sorted(ARGUMENTS_AS_TEXT))
def test_tool_call_arguments_too_deep_to_parse_go_to_the_template_as_text(served, case):
    """Earlier calls' arguments are parsed for the template; text nested past the stack raised
    RecursionError (not a JSONDecodeError) out of json.loads: a 500 on all three routes."""
    path, body = ARGUMENTS_AS_TEXT[case]
    r = request(served.base_url, "POST", path, json_body=body)
    assert r.status_code == 200, r.text[:300]


def test_an_answer_nested_too_deep_is_text_not_a_call():
    """The model's own output is parsed for tool calls the same way: too deep is not a call."""
    text = f'<tool_call>{{"name": "f", "arguments": {DEEP_TEXT}}}</tool_call>'
    content, calls = parse_tool_calls(text, forced=False)
    assert calls == [] and content == text
    assert parse_tool_calls(json.dumps({"name": "f", "arguments": nested(MAX_JSON_DEPTH + 1)}), forced=True)[1] == []


STOPS = [f"s{i}" for i in range(17)]  # one over the chat route's limit


@pytest.mark.parametrize(("path", "body"), [
    ("/api/chat", {"model": MODEL, "stream": False, "messages": HI}),
    ("/api/generate", {"model": MODEL, "stream": False, "prompt": "hi"}),
    ("/api/generate", {"model": MODEL, "stream": False, "prompt": "hi", "raw": True}),
], ids=["chat", "generate", "generate-raw"])
def test_ollama_stop_strings_past_the_limit_are_a_400_naming_options_stop(served, path, body):
    """options.stop went unchecked into the chat request, whose own check then raised a
    ValidationError in the handler: a 500 and a traceback."""
    r = request(served.base_url, "POST", path, json_body=body | {"options": {"stop": STOPS}})
    assert r.status_code == 400, r.text[:300]
    assert error_text(r).startswith("options.stop") and "at most 16 stop strings" in error_text(r)


def test_a_request_built_in_a_handler_that_fails_validation_is_a_400():
    """The translated routes build the chat request in the handler: what its checks refuse is the
    client's, a 400 naming the field, whichever check was missed before it."""
    with pytest.raises(APIError) as caught:
        valid_or_400(lambda: ChatCompletionRequest(model=MODEL, messages=HI, stop=STOPS))
    assert caught.value.status == 400 and caught.value.param == "stop"


BAD_ITEMS = [  # an input item the Responses API refuses, and the start of the error that names it
    ({"role": "tool", "content": "x"}, "input[1].role: Input should be 'user', 'system', 'developer' or 'assistant'"),
    ({"role": "user", "content": 5}, "input[1].content: send a string, or a list of text parts"),
    ({"role": "user", "content": [{"type": "input_text", "text": 5}]}, "input[1].content.0.text: "),
    ({"type": "function_call", "call_id": "c", "name": "f", "arguments": {"a": 1}}, "input[1].arguments: "),
    ({"type": "function_call_output", "call_id": "c", "output": {"a": 1}}, "input[1].output: send a string"),
    ({"type": "function_call", "name": "f", "arguments": "{}"}, "input[1].call_id: Field required"),
]


@pytest.mark.parametrize(("item", "named"), BAD_ITEMS, ids=[n.split(":")[0] for _, n in BAD_ITEMS])
def test_a_bad_input_item_is_named_by_its_own_field(served, item, named):
    """Every bad item was "input.str: Input should be a valid string" (the string branch of `input`),
    naming neither the item nor the field."""
    r = request(served.base_url, "POST", "/v1/responses", json_body={"model": MODEL, "input": [*HI, item]})
    assert r.status_code == 400 and "input.str" not in error_text(r)
    assert named in error_text(r), error_text(r)


CRASHER = {"type": "string", "maxLength": 20000}  # the 188-byte request that once segfaulted the server
FIELD_NAMED = {  # a value the chat path refuses, sent in a translated route's own field: that field is named
    "responses max_output_tokens": ("/v1/responses", {"model": MODEL, "input": "hi", "max_output_tokens": 10**6},
                                    "max_output_tokens=1000000 is above this server's cap of 256"),
    "responses text.format": ("/v1/responses", {"model": MODEL, "input": "hi", "text": {"format": {
        "type": "json_schema", "name": "x", "schema": CRASHER}}}, "text.format.schema.maxLength: maxLength is 20000"),
    "responses tool parameters": ("/v1/responses", {
        "model": MODEL, "input": "hi", "tool_choice": "required",
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object", "properties": {"s": CRASHER}}}]},
        "tools[0].parameters.properties.s.maxLength: maxLength is 20000"),
    "ollama format": ("/api/chat", {"model": MODEL, "stream": False, "messages": HI, "format": CRASHER},
                      "format.maxLength: maxLength is 20000"),
    "chat max_completion_tokens": ("/v1/chat/completions", {"model": MODEL, "messages": HI,
                                                            "max_completion_tokens": 10**6},
                                   "max_completion_tokens=1000000 is above this server's cap of 256"),
}


@pytest.mark.parametrize("case", sorted(FIELD_NAMED))
def test_a_refusal_names_the_field_the_client_sent(served, case):
    """The translated routes' refusals named the chat request's fields instead ("max_tokens=...",
    "response_format.json_schema.schema.maxLength", "tools[0].function.parameters"), which the
    client never sent."""
    path, body, named = FIELD_NAMED[case]
    r = request(served.base_url, "POST", path, json_body=body)
    assert r.status_code == 400 and error_text(r).startswith(named), error_text(r)
    assert "max_tokens" not in error_text(r) and "response_format" not in error_text(r)


@pytest.mark.parametrize(("method", "path", "status", "said"), [
    ("GET", "/api/chat", 405, "/api/chat takes POST, not GET"),
    ("POST", "/api/tags", 405, "/api/tags takes GET, not POST"),
    ("DELETE", "/api/show", 405, "/api/show takes POST, not DELETE"),
    ("POST", "/api/chat/", 404, "send it to /api/chat, without the trailing slash"),
    ("POST", "/api/push", 404, "/api/push is not served"),
    ("GET", "/api/pull", 405, "/api/pull takes POST, not GET"),
    ("POST", "/api/delete", 405, "/api/delete takes DELETE, not POST"),
])
def test_ollamas_routes_asked_the_wrong_way_say_how_to_ask(served, method, path, status, said):
    """The catch-all answered a served route asked with another method "/api/chat is not served:
    localspec serves Ollama's /api/chat, ...", contradicting itself."""
    r = request(served.base_url, method, path, json_body={} if method == "POST" else None)
    assert r.status_code == status and said in error_text(r), r.text
    if status == 405:
        assert r.headers["allow"] in ("GET", "POST", "DELETE")


KEY = "hostile-key"


@pytest.fixture(scope="module")
def keyed(module_home):
    tier = scripted_tier(model_id=MODEL, script=lambda prompt: "Red, green, blue.")
    backend = scripted_backend(pipeline=scripted_pipeline(tiers=[tier]))
    settings = ServerSettings(api_key=KEY, cache=False, router=False, max_tokens_cap=256, max_body_bytes=1024)
    with ServerThread(scripted_app(backend=backend, settings=settings)) as srv:
        yield srv


def test_the_guards_answer_ollamas_routes_in_ollamas_shape(served, keyed):
    """The guards before any route (key, Host/Origin, body limit) answered /api/ in OpenAI's shape,
    which Ollama's clients print as a dict ("{'message': 'Missing or incorrect API key ...', ...}")."""
    refused = [
        (request(keyed.base_url, "GET", "/api/tags"), 401, "Missing or incorrect API key"),
        (request(keyed.base_url, "GET", "/api/tags", key="wrong"), 401, "Missing or incorrect API key"),
        (request(served.base_url, "GET", "/api/tags", headers={"Host": "evil.example"}), 403, "Host 'evil.example'"),
        (request(served.base_url, "POST", "/api/chat", headers={"Origin": "http://evil.example"},
                 json_body={"model": MODEL, "messages": HI}), 403, "Origin 'http://evil.example'"),
        (request(keyed.base_url, "POST", "/api/chat", key=KEY,
                 json_body={"model": MODEL, "messages": [{"role": "user", "content": "x" * 2000}]}), 413, "limit"),
    ]
    for r, status, said in refused:
        assert r.status_code == status and isinstance(r.json()["error"], str) and said in r.json()["error"], r.text
    r = request(keyed.base_url, "GET", "/v1/models")  # the OpenAI routes keep OpenAI's
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert request(keyed.base_url, "GET", "/api/tags", key=KEY).status_code == 200


def test_the_guards_answer_llama_servers_routes_in_its_shape(served, keyed):
    """The guards before any route answered llama-server's routes in OpenAI's shape (`code` a string, where
    llama-server's clients read the HTTP status); the routes themselves answer in llama-server's."""
    refused = [
        (request(keyed.base_url, "POST", "/tokenize", json_body={"content": "hi"}), 401),
        (request(keyed.base_url, "POST", "/apply-template", json_body={"messages": HI}), 401),
        (request(keyed.base_url, "POST", "/completion", key="wrong", json_body={"prompt": "hi"}), 401),
        (request(served.base_url, "GET", "/props", headers={"Host": "evil.example"}), 403),
        (request(keyed.base_url, "POST", "/infill", key=KEY, json_body={"input_prefix": "x" * 2000}), 413),
    ]
    for r, status in refused:
        error = r.json()["error"]
        assert r.status_code == status and error["code"] == status and error["message"], r.text
        assert set(error) == {"code", "message", "type"}, r.text
    assert request(keyed.base_url, "POST", "/tokenize", key=KEY, json_body={"content": "hi"}).status_code == 200
    assert request(keyed.base_url, "POST", "/apply-template", key=KEY, json_body={"messages": HI}).status_code == 200


NOT_A_SCHEMA = {"type": "object", "properties": {"a": 5}}  # a number where a property's schema goes
SCHEMA_FIELDS = {  # where each face takes a JSON schema that becomes a grammar, and the path its 400 names
    "chat response_format": ("/v1/chat/completions", lambda v: {
        "model": MODEL, "messages": HI, "response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": v}}}, "response_format.json_schema.schema"),
    "chat forced tool": ("/v1/chat/completions", lambda v: {
        "model": MODEL, "messages": HI, "tool_choice": "required",
        "tools": [{"type": "function", "function": {"name": "f", "parameters": v}}]}, "tools[0].function.parameters"),
    "responses text.format": ("/v1/responses", lambda v: {
        "model": MODEL, "input": "hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": v}}},
        "text.format.schema"),
    "responses forced tool": ("/v1/responses", lambda v: {
        "model": MODEL, "input": "hi", "tool_choice": "required",
        "tools": [{"type": "function", "name": "f", "parameters": v}]}, "tools[0].parameters"),
    "messages output_config": ("/v1/messages", lambda v: {
        "model": MODEL, "max_tokens": 8, "messages": HI, "output_config": {"format": {"type": "json_schema",
                                                                                    "schema": v}}},
        "output_config.format.schema"),
    "messages forced tool": ("/v1/messages", lambda v: {
        "model": MODEL, "max_tokens": 8, "messages": HI, "tool_choice": {"type": "any"},
        "tools": [{"name": "f", "input_schema": v}]}, "tools[0].input_schema"),
    "ollama format": ("/api/chat", lambda v: {"model": MODEL, "stream": False, "messages": HI, "format": v},
                      "format"),
    "llama.cpp json_schema": ("/completion", lambda v: {"prompt": "hi", "n_predict": 4, "json_schema": v},
                              "json_schema"),
}


@pytest.mark.parametrize("case", sorted(SCHEMA_FIELDS))
def test_a_schema_with_a_non_schema_in_it_is_a_400_naming_its_path(served, case):
    """{"properties": {"a": 5}} was "Unsupported JSON schema: 'int' object has no attribute 'get'" on every face:
    the converter's Python error, naming neither the place nor the fix."""
    path, body, field = SCHEMA_FIELDS[case]
    r = request(served.base_url, "POST", path, json_body=body(NOT_A_SCHEMA))
    assert r.status_code == 400, r.text
    assert error_text(r).startswith(f"{field}.properties.a is a number, not a schema."), error_text(r)
    assert "object has no attribute" not in error_text(r)


UNION_FIELDS = {  # a value no branch of a field's union takes: the field itself is named, with every branch
    "chat content": ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": 5}]},
                     "messages.0.content: Input should be a valid string, or a valid list"),
    "chat stop": ("/v1/chat/completions", {"model": MODEL, "messages": HI, "stop": 5},
                  "stop: Input should be a valid string, or a valid list"),
    "chat tool_choice": ("/v1/chat/completions", {"model": MODEL, "messages": HI, "tool_choice": 5},
                         "tool_choice: Input should be 'none', 'auto' or 'required'"),
    "completions stop item": ("/v1/completions", {"model": MODEL, "prompt": "hi", "stop": [5]},
                              "stop.0: Input should be a valid string"),  # the list's branch: its item named
    "responses input": ("/v1/responses", {"model": MODEL, "input": 5},
                        "input: Input should be a valid string, or a valid list"),
    "messages keep_alive": ("/v1/messages", {"model": MODEL, "max_tokens": 8, "messages": HI, "keep_alive": [1]},
                            "keep_alive: Input should be a valid string, or a valid number"),
    "ollama format": ("/api/chat", {"model": MODEL, "stream": False, "messages": HI, "format": "yaml"},
                      "format: Input should be 'json' or '', or a valid dictionary"),
    "llama.cpp prompt": ("/completion", {"prompt": 5}, "prompt: Input should be a valid string, or a valid list"),
}


@pytest.mark.parametrize("case", sorted(UNION_FIELDS))
def test_a_value_no_branch_of_a_union_takes_names_the_field_not_a_branch(served, case):
    """Each was named by its first branch's tag ("stop.str: Input should be a valid string", "format.literal['json',
    '']: ...", OpenAI's param "tool_choice.literal['none','auto','required']"): a field the client never sent,
    and only one of the shapes it could have sent."""
    path, body, said = UNION_FIELDS[case]
    r = request(served.base_url, "POST", path, json_body=body)
    assert r.status_code == 400 and error_text(r) == said, error_text(r)
    if path.startswith("/v1/") and path != "/v1/messages":
        assert r.json()["error"]["param"] == said.split(":")[0]


NO_VALUE = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 3, "maximum": 1}}}
FORCED_TOOLS = {  # a forced call's tool whose bounds leave no value: named by the tool's own field on each face
    "chat": ("/v1/chat/completions", {"model": MODEL, "messages": HI, "tool_choice": "required", "tools": [
        {"type": "function", "function": {"name": "g"}},
        {"type": "function", "function": {"name": "f", "parameters": NO_VALUE}}]}, "tools[1].function.parameters"),
    "responses": ("/v1/responses", {"model": MODEL, "input": "hi", "tool_choice": "required", "tools": [
        {"type": "function", "name": "g"}, {"type": "function", "name": "f", "parameters": NO_VALUE}]},
        "tools[1].parameters"),
    "messages": ("/v1/messages", {"model": MODEL, "max_tokens": 8, "messages": HI, "tool_choice": {"type": "any"},
                                  "tools": [{"name": "g"}, {"name": "f", "input_schema": NO_VALUE}]},
                 "tools[1].input_schema"),
}


@pytest.mark.parametrize("face", sorted(FORCED_TOOLS))
def test_a_forced_tools_bounds_that_leave_no_value_name_the_tools_own_field(served, face):
    """They were "tools.$defs.tool0.properties.n: no integer is from 3 to 1": the path in the schema the server
    builds of every tool together, which the client never sent."""
    path, body, field = FORCED_TOOLS[face]
    r = request(served.base_url, "POST", path, json_body=body)
    assert r.status_code == 400, r.text
    assert error_text(r).startswith(f"{field}.properties.n: no integer is from 3 to 1"), error_text(r)


@pytest.mark.parametrize("tool", [None, 5, "web_search"])
def test_a_responses_tool_that_is_no_object_is_named_as_what_it_came(served, tool):
    """It was "tools[0] is a 'None' tool, which is not served" for null, a number and a string alike."""
    r = request(served.base_url, "POST", "/v1/responses", json_body={"model": MODEL, "input": "hi", "tools": [tool]})
    assert r.status_code == 400
    assert error_text(r).startswith(f"tools: tools[0] is {json.dumps(tool)}, not a tool: send"), error_text(r)


@pytest.mark.parametrize(("method", "path", "status", "said"), [
    ("POST", "/v1/messages/batches", 404, "POST /v1/messages/batches is not a route of this server: GET /openapi.json"),
    ("POST", "/v1/a%07b", 404, "POST /v1/a?b is not a route of this server"),  # printable, whatever the path held
    ("GET", "/v1/messages", 405, "/v1/messages takes POST, not GET; send a POST request."),
    ("GET", "/v1/chat/completions", 405, "/v1/chat/completions takes POST, not GET; send a POST request."),
    ("GET", "/infill", 405, "/infill takes POST, not GET; send a POST request."),
])
def test_a_path_not_served_or_asked_the_wrong_way_says_so_and_what_to_do(served, method, path, status, said):
    """They were Starlette's bare "Not Found" and "Method Not Allowed": neither the cause nor the fix."""
    r = request(served.base_url, method, path)
    assert r.status_code == status and error_text(r).startswith(said), error_text(r)


def test_a_bad_query_parameter_is_named_as_the_client_spelled_it(served):
    """It was named `query.limit`: FastAPI's part of the request, not a name the client sent."""
    r = request(served.base_url, "GET", "/v1/responses/resp_x/input_items?limit=abc")
    assert r.status_code == 400 and r.json()["error"]["param"] == "limit", r.text
    assert r.json()["error"]["message"].startswith("limit: ")
