"""/v1/responses (OpenAI's Responses API): a real server on loopback, the official `openai` client.

The server answers from a scripted target (tests/fake_tier.py) whose answers depend on the
prompt the endpoint rendered, so each test can see what the Responses request became: which
messages, in which roles, after which earlier response. What a real model writes under a schema
or a forced tool call is checked in test_server.py (`model_client`).
"""

from __future__ import annotations

import json
import re

import openai
import pytest
from fastapi.encoders import jsonable_encoder

from localspec.server import ServerSettings
from localspec.server.errors import APIError
from localspec.server.responses import ResponseObject, ResponsesRequest, ResponseStore, as_chat, input_messages
from localspec.server.routes.responses import event
from localspec.server.schemas import ChatMessageIn
from tests.fake_tier import Reply, one_model_app
from tests.server_harness import ServerThread, request

KEY = "responses-key"
MODEL = "scripted-responses"
TWO_CALLS = "".join(f'<tool_call>\n{{"name": "weather", "arguments": {{"city": "{c}"}}}}\n</tool_call>\n'
                    for c in ("Paris", "Rome"))
STORY = "Once upon a time there was a robot. " * 5
PREFILL, CONTINUATION = "```python\ndef reverse_string(", "s):\n    return s[::-1]\n```"
WEATHER = [{"type": "function", "name": "weather", "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]


def script(prompt: str) -> Reply | str:
    """Answers that show what the prompt held."""
    if prompt.endswith("<|im_start|>assistant\n" + PREFILL):  # the prefill, then no turn of its own
        return CONTINUATION
    if "What did the function do?" in prompt:
        whole = f"<|im_start|>assistant\n{PREFILL}{CONTINUATION}<|im_end|>\n<|im_start|>user"
        return "It reversed a string." if whole in prompt else "Two turns."
    if "Recall the call." in prompt:  # ChatML renders a turn of calls alone as an empty assistant turn
        return "A turn of calls." if "<|im_start|>assistant\n<|im_end|>" in prompt else "No call seen."
    if "What did you say?" in prompt:
        return "I said colours." if "<|im_start|>assistant\nRed, green, blue. Yes." in prompt else "Nothing."
    if "Speak like a pirate" in prompt and "Hello again" in prompt:
        return "Arr, again."
    if "Hello again" in prompt:
        return "Hello."
    if "What was the word?" in prompt:
        word = re.search(r"The word is (\w+)", prompt)
        return word.group(1) if word else "I was not told."
    if "Look up two cities" in prompt and "sunny, 21C" in prompt:  # the tools' outputs came back
        return "Paris: sunny."
    if "Look up two cities" in prompt:
        return TWO_CALLS
    if "Break down" in prompt:
        return Reply("Never said.", fail="llama_decode returned -3")
    if "Write a long story" in prompt:
        return Reply(STORY, pace_s=0.001)
    return "Red, green, blue. Yes."


@pytest.fixture(scope="module")
def served(module_home):
    app, _ = one_model_app(model_id=MODEL, script=script,
                           settings=ServerSettings(api_key=KEY, cache=False, router=False, max_tokens_cap=256))
    with ServerThread(app) as srv:
        yield srv


@pytest.fixture
def client(served) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{served.base_url}/v1", api_key=KEY, max_retries=0, timeout=120)


def test_a_text_answer_is_the_chat_answer_as_a_response(client):
    r = client.responses.create(model=MODEL, input="Name three colours.", temperature=0)
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Name three colours."}],
                                          temperature=0)
    assert r.output_text == chat.choices[0].message.content == "Red, green, blue. Yes."
    assert r.object == "response" and r.status == "completed" and r.id.startswith("resp_")
    [message] = r.output
    assert message.type == "message" and message.role == "assistant" and message.status == "completed"
    assert r.usage.input_tokens == chat.usage.prompt_tokens and r.usage.output_tokens == chat.usage.completion_tokens
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.model == MODEL and r.temperature == 0


def test_a_streamed_answer_is_the_typed_events_in_order(client, served):
    with client.responses.stream(model=MODEL, input="Write a long story.", temperature=0) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) > 5 and "".join(deltas) == final.output_text == STORY
    whole = client.responses.create(model=MODEL, input="Write a long story.", temperature=0)
    assert whole.output_text == final.output_text and whole.usage.output_tokens == final.usage.output_tokens
    # The stream ends with response.completed: no chat-style [DONE] after it for a strict client to choke on.
    raw = request(served.base_url, "POST", "/v1/responses", KEY, {"model": MODEL, "input": "hi", "stream": True})
    assert raw.text.rstrip().splitlines()[-1].startswith("data: {") and "[DONE]" not in raw.text
    assert raw.text.startswith("event: response.created\ndata: ")


def test_a_streamed_response_object_is_spelled_as_the_whole_one():
    """The events' response is the whole answer's JSON: text.format's schema under its API name
    ("schema_", the attribute, went out before), and its null fields present."""
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    body = ResponsesRequest.model_validate({"model": MODEL, "input": "hi", "text": {"format": {
        "type": "json_schema", "name": "thing", "schema": schema, "strict": True}}})
    started = ResponseObject.started(body, id="resp_1", created_at=1)
    data = json.loads(event("response.created", 0, response=started).split(b"data: ", 1)[1])
    assert data["response"]["text"]["format"] == {"type": "json_schema", "name": "thing", "schema": schema,
                                                  "strict": True}
    assert data["response"] == json.loads(json.dumps(jsonable_encoder(started, by_alias=True)))


def test_max_output_tokens_makes_an_incomplete_response(client):
    r = client.responses.create(model=MODEL, input="Write a long story.", max_output_tokens=5, temperature=0)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 5 and r.output[0].status == "incomplete"
    with client.responses.stream(model=MODEL, input="Write a long story.", max_output_tokens=5) as stream:
        kinds = [e.type for e in stream]
    assert kinds[-1] == "response.incomplete"  # as OpenAI's (the SDK's get_final_response wants .completed)


def test_an_engine_failure_is_a_500_or_a_failed_response(client):
    with pytest.raises(openai.InternalServerError, match="llama_decode returned -3"):
        client.responses.create(model=MODEL, input="Break down.")
    with client.responses.stream(model=MODEL, input="Break down.") as stream:
        events = list(stream)
    last = events[-1]
    assert last.type == "response.failed" and last.response.status == "failed"
    assert "llama_decode returned -3" in last.response.error.message
    assert client.responses.create(model=MODEL, input="Name three colours.").status == "completed"  # it goes on


@pytest.mark.parametrize("stream", [False, True])
def test_tool_calls_are_function_call_items_and_their_outputs_answer_them(client, stream):
    ask = dict(model=MODEL, input="Look up two cities.", tools=WEATHER, temperature=0)
    if stream:
        with client.responses.stream(**ask) as s:
            kinds = [e.type for e in s]
            r = s.get_final_response()
        assert kinds.count("response.function_call_arguments.done") == 2
    else:
        r = client.responses.create(**ask)
    calls = [o for o in r.output if o.type == "function_call"]
    assert [json.loads(c.arguments) for c in calls] == [{"city": "Paris"}, {"city": "Rome"}]
    assert [o.type for o in r.output] == ["function_call", "function_call"]  # no empty message beside them
    assert all(c.call_id.startswith("call_") and c.name == "weather" for c in calls)
    # The results go back as function_call_output items, after the earlier response's conversation.
    outputs = [{"type": "function_call_output", "call_id": c.call_id, "output": f"{c.call_id}: sunny, 21C"}
               for c in calls]
    after = client.responses.create(model=MODEL, previous_response_id=r.id, input=outputs, tools=WEATHER)
    assert after.output_text == "Paris: sunny."
    assert client.responses.create(**ask, max_tool_calls=1).output[0].type == "function_call"
    assert len(client.responses.create(**ask, max_tool_calls=1).output) == 1


def test_the_whole_conversation_can_also_be_sent_as_items(client, served):
    """store: false, the client keeps the conversation (as Codex does): calls and outputs as input items."""
    first = client.responses.create(model=MODEL, input="Look up two cities.", tools=WEATHER, store=False)
    items = [{"role": "user", "content": [{"type": "input_text", "text": "Look up two cities."}]},
             *[{"type": "function_call", "call_id": c.call_id, "name": c.name, "arguments": c.arguments}
               for c in first.output],
             *[{"type": "function_call_output", "call_id": c.call_id, "output": "sunny, 21C"} for c in first.output],
             {"type": "reasoning", "id": "rs_1", "summary": []}]
    assert client.responses.create(model=MODEL, input=items, tools=WEATHER).output_text == "Paris: sunny."
    with pytest.raises(openai.NotFoundError, match="previous_response_not_found|not known here"):
        client.responses.create(model=MODEL, previous_response_id=first.id, input="Hello again")


def test_previous_response_id_continues_the_conversation_without_its_instructions(client):
    first = client.responses.create(model=MODEL, input="The word is platypus. Say ok.",
                                    instructions="Speak like a pirate.")
    assert client.responses.create(model=MODEL, previous_response_id=first.id,
                                   input="What was the word?").output_text == "platypus"
    # As OpenAI's: instructions are this request's own; the earlier ones are not carried over.
    assert client.responses.create(model=MODEL, previous_response_id=first.id, input="Hello again").output_text \
        == "Hello."
    assert client.responses.create(model=MODEL, previous_response_id=first.id, input="Hello again",
                                   instructions="Speak like a pirate.").output_text == "Arr, again."
    assert client.responses.create(model=MODEL, input="What was the word?").output_text == "I was not told."


@pytest.mark.parametrize("stream", [False, True])
def test_an_assistant_message_item_last_is_continued_and_kept_as_one_turn(client, stream):
    """The input's last item the assistant's text (a prefill): the answer is its continuation, and
    previous_response_id continues one assistant turn, the prefill and the answer."""
    ask = dict(model=MODEL, temperature=0, input=[
        {"role": "user", "content": "Write a Python function that reverses a string."},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": PREFILL}]}])
    if stream:
        with client.responses.stream(**ask) as s:
            deltas = [e.delta for e in s if e.type == "response.output_text.delta"]
            r = s.get_final_response()
        assert "".join(deltas) == CONTINUATION
    else:
        r = client.responses.create(**ask)
    assert r.output_text == CONTINUATION and r.status == "completed"
    after = client.responses.create(model=MODEL, previous_response_id=r.id, input="What did the function do?")
    assert after.output_text == "It reversed a string."


@pytest.mark.parametrize("extra, field, words", [
    ({"tools": [{"type": "file_search", "vector_store_ids": ["vs_1"]}]}, "tools", "'file_search' tool"),
    ({"tools": [{"type": "custom", "name": "apply_patch"}]}, "tools", "'custom' tool"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}]},
     "input", "'input_image'"),
    ({"background": True}, "background", "background runs"),
    ({"background": True, "previous_response_id": "resp_gone"}, "background", "background runs"),  # not its 404
    ({"conversation": "conv_1"}, "conversation", "stored conversations"),
    ({"include": ["message.output_text.logprobs"]}, "include", "Log probabilities"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format", "'schema'"),
    ({"input": []}, "input", "no message"),
])
def test_what_a_local_server_cannot_do_is_a_400_naming_it(client, extra, field, words):
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(**{"model": MODEL, "input": "hi", **extra})
    error = caught.value.body
    assert error["param"] == field and words in error["message"], error


def test_the_response_store_keeps_each_keys_own_and_forgets_the_oldest():
    store = ResponseStore(max_responses=2, max_chars=10_000)
    said = [ChatMessageIn(role="user", content="hi")]
    for n in range(3):
        store.keep(f"resp_{n}", owner="key:a", messages=said)
    with pytest.raises(APIError, match="not known here"):
        store.history("resp_0", owner="key:a")  # the oldest, dropped beyond 2
    assert store.history("resp_2", owner="key:a")[0].content == "hi"
    with pytest.raises(APIError):
        store.history("resp_2", owner="key:b")  # another key's is unknown to this one
    store.keep("resp_big", owner="key:a", messages=[ChatMessageIn(role="user", content="x" * 20_000)])
    assert len(store) == 2  # one bigger than the whole room is not kept, and evicts nothing
    store.history("resp_2", owner="key:a")[0].content = "changed"
    assert store.history("resp_2", owner="key:a")[0].content == "hi"  # a request gets a copy


def test_one_keys_flood_forgets_its_own_responses_not_another_keys():
    """The store's room is shared: 256 tiny requests from one key forgot every other key's
    conversation, oldest first. Now the key holding the most gives up its own oldest."""
    said = [ChatMessageIn(role="user", content="hi")]
    store = ResponseStore(max_responses=4, max_chars=10_000)
    store.keep("resp_b", owner="key:b", messages=said)
    for n in range(10):
        store.keep(f"resp_a{n}", owner="key:a", messages=said)
    assert store.history("resp_b", owner="key:b")[0].content == "hi"
    assert len(store) == 4 and store.history("resp_a9", owner="key:a")
    with pytest.raises(APIError, match="not known here"):
        store.history("resp_a6", owner="key:a")  # its own oldest went
    big = [ChatMessageIn(role="user", content="x" * 4000)]
    by_size = ResponseStore(max_responses=100, max_chars=10_000)
    by_size.keep("resp_b", owner="key:b", messages=said)
    for n in range(5):
        by_size.keep(f"resp_a{n}", owner="key:a", messages=big)
    assert by_size.history("resp_b", owner="key:b")[0].content == "hi"  # over the characters: the same


def test_function_calls_join_the_assistant_turn_before_them():
    body = ResponsesRequest.model_validate({"model": "m", "instructions": "Be brief.", "input": [
        {"role": "user", "content": "Two cities?"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Looking."}]},
        {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{\"city\": \"Paris\"}"},
        {"type": "function_call", "call_id": "c2", "name": "weather", "arguments": "{\"city\": \"Rome\"}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "rain"}]},
    ]})
    chat = as_chat(body, input_messages(body))
    assert [m.role for m in chat.messages] == ["system", "user", "assistant", "tool", "tool"]
    assistant = chat.messages[2]
    assert assistant.content == "Looking." and [c.id for c in assistant.tool_calls] == ["c1", "c2"]
    assert [(m.tool_call_id, m.content) for m in chat.messages[3:]] == [("c1", "sunny"), ("c2", "rain")]


def sse_events(text: str) -> list[dict]:
    """The `data:` payloads of an SSE body, as a client reading only `data:` lines (Codex) sees them."""
    return [json.loads(line[len("data: "):]) for line in text.splitlines() if line.startswith("data: ")]


SHELL = {"type": "function", "name": "shell_command", "description": "Runs a shell command", "strict": False,
         "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"],
                        "additionalProperties": False}}


def codex_request(text: str) -> dict:
    """A turn as the Codex CLI sends it to a custom `wire_api = "responses"` provider
    (codex-rs ResponsesApiRequest): instructions, developer and user messages as items, function
    tools and the `web_search` tool it adds by default (web_search mode "cached" for any provider
    but Azure), reasoning null, store false, stream, an empty include, prompt_cache_key."""
    return {"model": MODEL, "instructions": "You are a coding agent.",
            "input": [{"type": "message", "role": "developer",
                       "content": [{"type": "input_text", "text": "<permissions instructions>"}]},
                      {"type": "message", "role": "user",
                       "content": [{"type": "input_text", "text": "<environment_context/>"}]},
                      {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}],
            "tools": [SHELL, {"type": "web_search", "external_web_access": False}, *WEATHER],
            "tool_choice": "auto", "parallel_tool_calls": False, "reasoning": None, "store": False, "stream": True,
            "include": [], "prompt_cache_key": "0199a6c1-codex-session"}


def test_a_codex_turn_is_answered_with_the_events_codex_reads(served):
    """Codex reads only `data:` lines: each item from response.output_item.done, and the turn ends at
    response.completed with its id and usage (without it: "stream closed before response.completed")."""
    raw = request(served.base_url, "POST", "/v1/responses", KEY, codex_request("Look up two cities."))
    assert raw.status_code == 200, raw.text
    events = sse_events(raw.text)
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    # parallel_tool_calls: false (Codex's for models it does not know): the first call only
    assert [(i["type"], i["name"], json.loads(i["arguments"])) for i in done] == [
        ("function_call", "weather", {"city": "Paris"})]
    [completed] = [e["response"] for e in events if e["type"] == "response.completed"]
    assert completed["id"].startswith("resp_") and completed["usage"]["output_tokens"] > 0
    assert [t["name"] for t in completed["tools"]] == ["shell_command", "weather"]  # what the model was offered
    # The next turn sends the whole conversation back (store: false): the calls and their outputs as items.
    turn = codex_request("Look up two cities.")
    turn["input"] += [*({k: i[k] for k in ("type", "call_id", "name", "arguments")} for i in done),
                      *({"type": "function_call_output", "call_id": i["call_id"], "output": "sunny, 21C"}
                        for i in done)]
    events = sse_events(request(served.base_url, "POST", "/v1/responses", KEY, turn).text)
    [message] = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert message["content"][0]["text"] == "Paris: sunny." and events[-1]["type"] == "response.completed"


def test_a_hosted_web_search_the_model_must_use_is_refused(client):
    """Offered, web_search is dropped (the model answers without it); forced by tool_choice, it would
    change the answer in a way this server cannot, so it is a 400 naming tool_choice."""
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model=MODEL, input="hi", tools=[{"type": "web_search"}],
                                tool_choice={"type": "web_search"})
    assert caught.value.body["param"] == "tool_choice" and "web_search" in caught.value.body["message"]


def test_a_prompt_longer_than_the_context_names_input(client):
    """Its 400 named `messages`, a field a Responses client never sent; Codex shows the body as is."""
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model=MODEL, input="word " * 2000)
    error = caught.value.body
    assert error["code"] == "context_length_exceeded" and error["param"] == "input", error


def test_item_references_bring_back_an_earlier_responses_items(client):
    """The Vercel AI SDK (store on) sends an earlier answer back as {"type": "item_reference", "id": ...}
    rather than its content: refused before, so its every second turn was a 400."""
    said = client.responses.create(model=MODEL, input="Name three colours.")
    assert client.responses.create(model=MODEL, input=[
        {"role": "user", "content": "Name three colours."}, {"type": "item_reference", "id": said.output[0].id},
        {"role": "user", "content": "What did you say?"}]).output_text == "I said colours."
    calls = client.responses.create(model=MODEL, input="Look up two cities.", tools=WEATHER)
    rome = calls.output[1]
    assert client.responses.create(model=MODEL, tools=WEATHER, input=[
        {"role": "user", "content": "Look up two cities."}, {"type": "item_reference", "id": rome.id},
        {"role": "user", "content": "Recall the call."}]).output_text == "A turn of calls."
    unkept = client.responses.create(model=MODEL, input="Name three colours.", store=False)
    for missing in ("msg_nope", unkept.output[0].id):
        with pytest.raises(openai.NotFoundError, match="item_reference"):
            client.responses.create(model=MODEL, input=[{"type": "item_reference", "id": missing}])


def test_a_referenced_call_joins_the_assistant_turn_as_an_inline_call_does():
    from localspec.server.schemas import FunctionCall, ToolCall

    body = ResponsesRequest.model_validate({"model": "m", "input": [
        {"role": "user", "content": "Two cities?"}, {"type": "item_reference", "id": "fc_1"},
        {"type": "function_call", "call_id": "c2", "name": "weather", "arguments": "{}"}]})
    stored = ToolCall(id="c1", function=FunctionCall(name="weather", arguments="{}"))
    messages = input_messages(body, referenced={"fc_1": stored}.__getitem__)
    assert [m.role for m in messages] == ["user", "assistant"]
    assert [c.id for c in messages[1].tool_calls] == ["c1", "c2"]
    with pytest.raises(APIError, match="item_reference"):
        input_messages(body)  # nothing to resolve it from


def test_a_kept_response_can_be_retrieved_listed_and_deleted(client):
    """GET /v1/responses/{id} (client.responses.retrieve), its input_items and DELETE were 404s: a client
    that stores a response's id to read it back later found nothing."""
    items = [{"role": "user", "content": "The word is wombat. Say ok."},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Now say it."}]}]
    made = client.responses.create(model=MODEL, input=items, instructions="Be brief.", metadata={"run": "7"})
    got = client.responses.retrieve(made.id)
    assert got.model_dump(exclude={"localspec"}) == made.model_dump(exclude={"localspec"})
    assert got.status == "completed" and got.metadata == {"run": "7"} and got.instructions == "Be brief."
    listed = client.responses.input_items.list(made.id, order="asc")
    assert [i.content[0].text for i in listed.data] == ["The word is wombat. Say ok.", "Now say it."]
    assert all(i.id for i in listed.data) and len({i.id for i in listed.data}) == 2
    newest = client.responses.input_items.list(made.id, limit=1)  # newest first, as OpenAI pages them
    assert [i.content[0].text for i in newest.data] == ["Now say it."] and newest.has_more
    after = client.responses.input_items.list(made.id, limit=1, after=newest.data[0].id)
    assert [i.content[0].text for i in after.data] == ["The word is wombat. Say ok."] and not after.has_more
    text_input = client.responses.create(model=MODEL, input="Name three colours.")
    [item] = client.responses.input_items.list(text_input.id).data
    assert item.role == "user" and item.content[0].text == "Name three colours."

    client.responses.delete(made.id)
    for gone in (lambda: client.responses.retrieve(made.id), lambda: client.responses.delete(made.id),
                 lambda: client.responses.input_items.list(made.id)):
        with pytest.raises(openai.NotFoundError, match="No response"):
            gone()
    with pytest.raises(openai.NotFoundError, match="not known here"):
        client.responses.create(model=MODEL, previous_response_id=made.id, input="What was the word?")
    unkept = client.responses.create(model=MODEL, input="Name three colours.", store=False)
    with pytest.raises(openai.NotFoundError, match="store: false"):
        client.responses.retrieve(unkept.id)


def test_a_streamed_response_is_kept_as_its_final_event_says(client):
    with client.responses.stream(model=MODEL, input="Write a long story.", temperature=0) as stream:
        final = stream.get_final_response()
    got = client.responses.retrieve(final.id)
    assert got.output_text == final.output_text == STORY and got.usage == final.usage


def test_another_keys_response_is_as_unknown_as_a_forgotten_one():
    store = ResponseStore()
    body = ResponsesRequest.model_validate({"model": MODEL, "input": "hi"})
    store.keep("resp_1", owner="key:a", messages=[], response=ResponseObject.started(body, id="resp_1", created_at=1))
    assert store.response("resp_1", owner="key:a").id == "resp_1"
    for read in (store.response, store.inputs, store.delete):
        with pytest.raises(APIError, match="No response 'resp_1'"):
            read("resp_1", owner="key:b")
    store.delete("resp_1", owner="key:a")
    assert len(store) == 0


def test_a_reference_is_listed_as_the_item_it_stands_for_and_paging_ends(client):
    """An item_reference was listed under the id it points to: the same item referenced twice was one
    id twice, and paging `after` it returned to the same page for ever (the SDK's auto-paging looped)."""
    said = client.responses.create(model=MODEL, input="Name three colours.")
    calls = client.responses.create(model=MODEL, input="Look up two cities.", tools=WEATHER)
    ref, call_ref = ({"type": "item_reference", "id": i} for i in (said.output[0].id, calls.output[1].id))
    made = client.responses.create(model=MODEL, tools=WEATHER, input=[
        {"role": "user", "content": "Name three colours."}, ref, ref, call_ref, {"role": "user", "content": "Hello again"}])
    listed = list(client.responses.input_items.list(made.id, limit=1, order="asc"))  # follows every page
    assert len(listed) == 5 and len({i.id for i in listed}) == 5
    assert [i.type for i in listed] == ["message", "message", "message", "function_call", "message"]
    assert listed[1].role == "assistant" and listed[1].content[0].text == said.output_text
    assert listed[3].name == "weather" and listed[3].call_id == calls.output[1].call_id
