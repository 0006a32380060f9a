"""Ollama's API (/api/chat, /api/generate, ...): a real server on loopback, the official `ollama` client.

The server answers from a scripted target (tests/fake_tier.py) whose answers depend on the prompt
the endpoint rendered, so each test sees what the Ollama request became. What the real model says
through these routes is checked in test_server.py (`model_client`'s server).
"""

from __future__ import annotations

import json

import ollama
import pytest

from localspec.server import ServerSettings
from tests.fake_tier import Reply, ScriptedEmbedder, scripted_app, scripted_backend, scripted_pipeline, scripted_tier
from tests.server_harness import ServerThread, request

MODEL = "scripted-ollama"
EMBEDDER = "scripted-embedder"
STORY = "Once upon a time there was a robot. " * 3
TWO_CALLS = "".join(f'<tool_call>\n{{"name": "weather", "arguments": {{"city": "{c}"}}}}\n</tool_call>\n'
                    for c in ("Paris", "Rome"))
PREFILL, CONTINUATION = "```python\ndef reverse_string(", "s):\n    return s[::-1]\n```"
WEATHER = [{"type": "function", "function": {"name": "weather", "description": "Weather for a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def script(prompt: str) -> Reply | str:
    if prompt.endswith("<|im_start|>assistant\n" + PREFILL):  # the prefill, then no turn of its own
        return Reply(CONTINUATION, pace_s=0.001)
    if "Be a pirate" in prompt and "Greet me" in prompt:
        return "Arr."
    if "Greet me" in prompt:
        return "Hello."
    if "Look up two cities" in prompt and "sunny, 21C" in prompt:
        return "Paris is sunny."
    if "Look up two cities" in prompt:
        return TWO_CALLS
    if "Write a story" in prompt:
        return Reply(STORY, pace_s=0.001)
    if "Break down" in prompt:
        return Reply("Never said.", fail="llama_decode returned -3")
    return "Red, green, blue."


@pytest.fixture(scope="module")
def served(module_home):
    tier = scripted_tier(model_id=MODEL, script=script)
    backend = scripted_backend(pipeline=scripted_pipeline(tiers=[tier]), embedder=ScriptedEmbedder(),
                               embedding_id=EMBEDDER)
    app = scripted_app(backend=backend, settings=ServerSettings(cache=False, router=False, max_tokens_cap=256))
    with ServerThread(app) as srv:
        srv.tier = tier
        yield srv


@pytest.fixture
def client(served) -> ollama.Client:
    return ollama.Client(host=served.base_url, timeout=120)


def test_chat_whole_and_streamed_in_ollamas_shapes(client):
    r = client.chat(model=MODEL, messages=[{"role": "user", "content": "Name three colours."}], stream=False,
                    options={"temperature": 0})
    assert r.message.role == "assistant" and r.message.content == "Red, green, blue."
    assert r.done and r.done_reason == "stop" and r.model == MODEL
    assert r.prompt_eval_count > 0 and r.eval_count > 0 and r.total_duration > 0
    parts = list(client.chat(model=MODEL, messages=[{"role": "user", "content": "Write a story."}], stream=True))
    assert len(parts) > 5 and not any(p.done for p in parts[:-1]) and parts[-1].done
    assert "".join(p.message.content for p in parts) == STORY
    assert parts[-1].eval_count > 0 and all(p.eval_count is None for p in parts[:-1])  # counts on the last line


def test_a_final_assistant_message_is_continued_as_ollama_does(client):
    """Ollama continues a chat's last assistant message, and answers with the continuation alone."""
    messages = [{"role": "user", "content": "Write a Python function that reverses a string."},
                {"role": "assistant", "content": PREFILL}]
    r = client.chat(model=MODEL, messages=messages, stream=False, options={"temperature": 0})
    assert r.message.role == "assistant" and r.message.content == CONTINUATION and r.done_reason == "stop"
    parts = list(client.chat(model=MODEL, messages=messages, stream=True, options={"temperature": 0}))
    assert len(parts) > 2 and "".join(p.message.content for p in parts) == CONTINUATION


def test_num_predict_stops_the_answer_at_length_and_past_the_cap_is_the_cap(client):
    r = client.chat(model=MODEL, messages=[{"role": "user", "content": "Write a story."}],
                    options={"num_predict": 4})
    assert r.done_reason == "length" and r.eval_count == 4
    # Ollama bounds num_predict rather than refusing it (Continue sends 4096 on every request): the cap, 256.
    for call in (lambda o: client.chat(model=MODEL, messages=[{"role": "user", "content": "Write a story."}],
                                       options=o),
                 lambda o: client.generate(model=MODEL, prompt="Write a story.", raw=True, options=o)):
        whole = call({"num_predict": 10**6})
        assert whole.done and whole.eval_count <= 256


def test_generate_is_a_chat_turn_with_its_system_and_raw_is_the_prompt_itself(client):
    assert client.generate(model=MODEL, prompt="Greet me.").response == "Hello."
    assert client.generate(model=MODEL, prompt="Greet me.", system="Be a pirate.").response == "Arr."
    raw = client.generate(model=MODEL, prompt="Greet me.", raw=True)
    assert raw.response == "Hello." and raw.done_reason == "stop"
    streamed = list(client.generate(model=MODEL, prompt="Write a story.", stream=True))
    assert "".join(p.response for p in streamed) == STORY and streamed[-1].done


def test_tool_calls_come_back_with_object_arguments_and_tool_results_answer_them(client, served):
    messages = [{"role": "user", "content": "Look up two cities."}]
    r = client.chat(model=MODEL, messages=messages, tools=WEATHER)
    calls = r.message.tool_calls
    assert [(c.function.name, dict(c.function.arguments)) for c in calls] == [("weather", {"city": "Paris"}),
                                                                              ("weather", {"city": "Rome"})]
    assert r.message.content == ""  # the calls alone
    messages += [r.message.model_dump(exclude_none=True),
                 *({"role": "tool", "content": "sunny, 21C", "tool_name": "weather"} for _ in calls)]
    assert client.chat(model=MODEL, messages=messages, tools=WEATHER).message.content == "Paris is sunny."
    # Some clients send the calls' turn with "content": null (the ollama client leaves it out): that is no text.
    raw = [messages[0], {**messages[1], "content": None}, *messages[2:]]
    r = request(served.base_url, "POST", "/api/chat", json_body={"model": MODEL, "stream": False,
                                                                 "messages": raw, "tools": WEATHER})
    assert r.status_code == 200 and r.json()["message"]["content"] == "Paris is sunny.", r.text
    [last] = [p for p in client.chat(model=MODEL, messages=messages[:1], tools=WEATHER, stream=True) if p.done]
    assert len(last.message.tool_calls) == 2  # streamed: held to the end, on the last line


def test_format_json_schema_reaches_the_grammar(served):
    """format carries a schema as response_format does: a schema the grammar refuses is Ollama's 400."""
    bad = {"model": MODEL, "stream": False, "messages": [{"role": "user", "content": "hi"}],
           "format": {"type": "object", "properties": {"n": {"$ref": "#/$defs/missing"}}}}
    r = request(served.base_url, "POST", "/api/chat", json_body=bad)
    assert r.status_code == 400 and isinstance(r.json()["error"], str) and "$ref" in r.json()["error"]


def test_an_empty_request_loads_the_model_and_errors_are_ollamas_shape(client, served):
    assert client.chat(model=MODEL, messages=[]).done_reason == "load"
    assert client.generate(model=MODEL, prompt="").done_reason == "load"
    with pytest.raises(ollama.ResponseError) as caught:
        client.chat(model="nope", messages=[{"role": "user", "content": "hi"}])
    assert caught.value.status_code == 404 and "nope" in caught.value.error
    for options, words in (({"mirostat": 2}, "options.mirostat"), ({"num_predict": 0}, "num_predict")):
        with pytest.raises(ollama.ResponseError, match=words) as caught:
            client.chat(model=MODEL, messages=[{"role": "user", "content": "hi"}], options=options)
        assert caught.value.status_code == 400
    with pytest.raises(ollama.ResponseError, match="images are not served"):
        client.chat(model=MODEL, messages=[{"role": "user", "content": "hi", "images": ["aGk="]}])
    r = request(served.base_url, "POST", "/api/chat", json_body={"model": MODEL, "messages": "not a list"})
    assert r.status_code == 400 and isinstance(r.json()["error"], str)  # not OpenAI's error object


def test_an_engine_failure_is_a_500_or_an_error_line(client):
    with pytest.raises(ollama.ResponseError, match="llama_decode returned -3") as caught:
        client.chat(model=MODEL, messages=[{"role": "user", "content": "Break down."}])
    assert caught.value.status_code == 500
    with pytest.raises(ollama.ResponseError, match="llama_decode returned -3"):
        list(client.chat(model=MODEL, messages=[{"role": "user", "content": "Break down."}], stream=True))


def test_listings_and_embeddings(client, served):
    listed = request(served.base_url, "GET", "/api/tags").json()["models"]  # tagged, as Ollama lists them
    assert {f"{MODEL}:latest", f"{EMBEDDER}:latest"} <= {m["model"] for m in listed} == {m["name"] for m in listed}
    show = client.show(MODEL)
    assert "completion" in show.capabilities and client.show(EMBEDDER).capabilities == ["embedding"]
    assert "insert" in show.capabilities  # the scripted tokenizer has the fill-in-the-middle tokens
    # Where Ollama's clients read a model's context window: "<arch>.context_length", the slot's.
    assert show.modelinfo == {"general.architecture": "scripted", "scripted.context_length": 1024,
                              "general.basename": MODEL}  # Copilot's name for the model
    with pytest.raises(ollama.ResponseError) as caught:
        client.show("nope")
    assert caught.value.status_code == 404
    vectors = client.embed(model=EMBEDDER, input=["red", "blue"]).embeddings
    assert len(vectors) == 2 and len(vectors[0]) == len(vectors[1]) > 0
    legacy = request(served.base_url, "POST", "/api/embeddings", json_body={"model": EMBEDDER, "prompt": "red"})
    assert legacy.json()["embedding"] == vectors[0]
    loaded = request(served.base_url, "GET", "/api/ps").json()["models"]  # with their expiry, named as listed
    assert {m["model"] for m in loaded} == {m["name"] for m in loaded} == {f"{MODEL}:latest", f"{EMBEDDER}:latest"}
    assert {m.model for m in client.ps().models} == {f"{MODEL}:latest", f"{EMBEDDER}:latest"}
    with pytest.raises(ollama.ResponseError, match="localspec models") as caught:
        client.pull(MODEL)  # Ollama's store is not ours
    assert caught.value.status_code == 404


def test_an_empty_request_with_keep_alive_zero_unloads():
    """On a server of its own: the scripted load hands back the same backend, closed by the unload, so
    a later test on the module's server hung whenever the reaper unloaded before its request came."""
    tier = scripted_tier(model_id=MODEL, script=script)
    app = scripted_app(backend=scripted_backend(pipeline=scripted_pipeline(tiers=[tier])),
                       settings=ServerSettings(cache=False, router=False))
    with ServerThread(app) as srv:
        client = ollama.Client(host=srv.base_url, timeout=120)
        assert client.chat(model=MODEL, messages=[], keep_alive="0m").done_reason == "unload"


def test_show_reads_name_as_continue_sends_it(served):
    """Continue's Ollama provider asks /api/show with {"name": ...} (the field's older spelling, which
    Ollama still reads) and reads the context window and FIM support from the answer."""
    r = request(served.base_url, "POST", "/api/show", json_body={"name": MODEL})
    assert r.status_code == 200, r.text
    assert r.json()["model_info"]["scripted.context_length"] == 1024
    assert r.json()["parameters"] == "num_ctx 1024"  # where Continue reads it: a Modelfile's parameter lines
    r = request(served.base_url, "POST", "/api/show", json_body={})
    assert r.status_code == 400 and "model" in r.json()["error"]


def test_version_is_the_ollama_api_version_clients_check(served):
    """VS Code Copilot's Ollama provider reads /api/version and refuses a server below Ollama 0.6.4
    (it compared localspec's own 0.1.0, and listed no models)."""
    version = json.loads(request(served.base_url, "GET", "/api/version").text)["version"]
    assert tuple(int(p) for p in version.split(".")) >= (0, 6, 4)


def test_a_name_with_ollamas_default_tag_is_the_name(client):
    """Ollama reads `x:latest` as `x`; names copied from Ollama (or tagged by a client: Open WebUI adds
    `:latest` to a name without a tag) carry it."""
    tagged = MODEL + ":latest"
    r = client.chat(model=tagged, messages=[{"role": "user", "content": "Name three colours."}])
    assert r.message.content == "Red, green, blue."
    assert client.generate(model=tagged, prompt="Greet me.").response == "Hello."
    assert "completion" in client.show(tagged).capabilities
    assert len(client.embed(model=EMBEDDER + ":latest", input="red").embeddings) == 1
    with pytest.raises(ollama.ResponseError) as caught:  # another tag is another model
        client.chat(model=MODEL + ":7b", messages=[{"role": "user", "content": "hi"}])
    assert caught.value.status_code == 404


def test_the_root_answers_the_probe_ollamas_clients_send_first(served):
    """The `ollama` CLI (OLLAMA_HOST=...) sends HEAD / before any command and gives up on an error."""
    for method in ("HEAD", "GET"):
        r = request(served.base_url, method, "/")
        assert r.status_code == 200, (method, r.status_code)
    assert request(served.base_url, "GET", "/").text == "Ollama is running"


def test_a_model_not_loaded_says_insert_as_its_vocabulary_has_the_fim_tokens(tmp_path):
    """/api/show loads nothing: for a model not loaded, whether `suffix` works is read from its GGUF's
    vocabulary (Continue offers autocomplete to a model that says "insert")."""
    from tests.gguf_factory import BASE_TOKENS, make_gguf

    from localspec.server.routes.completions import fim_in_vocabulary

    with_fim = make_gguf(tmp_path / "fim.gguf", tokens=[*BASE_TOKENS, "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"])
    without = make_gguf(tmp_path / "plain.gguf", tokens=[*BASE_TOKENS, "<|fim_prefix|>", "<|fim_middle|>"])
    assert fim_in_vocabulary(with_fim) and not fim_in_vocabulary(without)
    assert not fim_in_vocabulary(tmp_path / "gone.gguf")
    (tmp_path / "junk.gguf").write_bytes(b"GGUF" + b"\xff" * 64)
    assert not fim_in_vocabulary(tmp_path / "junk.gguf")  # unreadable: not claimed, and no error


def test_a_loaded_model_without_fim_tokens_does_not_claim_insert(client, served, monkeypatch):
    """"insert" (suffix, so autocomplete) was claimed for every model; one whose tokenizer has no
    fill-in-the-middle tokens answers a suffix with a 400."""
    monkeypatch.setattr(served.tier.engine.target, "tokenize",  # bytes only: no special token at all
                        lambda text, add_special=True, parse_special=True: list(text.encode()))
    assert client.show(MODEL).capabilities == ["completion", "tools"]
    with pytest.raises(ollama.ResponseError, match="fill-in-the-middle"):
        client.generate(model=MODEL, prompt="def f(", suffix="    return 1")


def test_embed_cuts_a_text_past_the_window_as_ollamas_truncate_says(client, served):
    """Ollama's truncate (true by default) cuts a text to the embedding model's window; ours refused
    it with a 400. truncate: false is still that 400."""
    long_text = " ".join(f"word{i}" for i in range(400))  # the scripted window: 256 tokens
    [cut] = client.embed(model=EMBEDDER, input=long_text).embeddings
    [head] = client.embed(model=EMBEDDER, input=" ".join(f"word{i}" for i in range(254))).embeddings
    assert cut == head
    legacy = request(served.base_url, "POST", "/api/embeddings", json_body={"model": EMBEDDER, "prompt": long_text})
    assert legacy.status_code == 200 and legacy.json()["embedding"] == head
    with pytest.raises(ollama.ResponseError, match="takes at most 256") as caught:
        client.embed(model=EMBEDDER, input=long_text, truncate=False)
    assert caught.value.status_code == 400


def test_a_loaded_models_tokenizer_is_asked_on_the_event_loop(client, served, monkeypatch):
    """/api/show asked a loaded model's tokenizer for the FIM tokens on a worker thread, holding nothing:
    an unload (keep_alive, `stop`, room for another model) detaches and frees the model on the event
    loop's say meanwhile, and the tokenizer read freed memory. On the loop, no close comes in between
    finding the model and reading it (as model_info reads it)."""
    import asyncio

    from localspec.server.routes import ollama as ollama_routes

    seen: list[bool] = []
    real = ollama_routes.fim_supported

    def on_the_loop(b):
        try:
            asyncio.get_running_loop()
            seen.append(True)
        except RuntimeError:  # a worker thread has no running loop
            seen.append(False)
        return real(b)

    monkeypatch.setattr(ollama_routes, "fim_supported", on_the_loop)
    assert "insert" in client.show(MODEL).capabilities
    assert seen == [True]


def test_a_request_over_its_token_budget_is_refused_before_cutting_every_text():
    """Each text past the window is cut by a binary search of tokenizations: a 4 MB /api/embed body of
    long texts, refused anyway for its tokens in all, took ~5 s of the embedder's lock (0.01 s as a 400
    before truncate). The budget is checked as texts are measured: no text past it is cut."""
    from localspec.errors import RequestError
    from localspec.server.embeddings import EmbeddingModel

    class Counting(ScriptedEmbedder):
        cuts = 0

        def truncated(self, text: str) -> str:
            Counting.cuts += 1
            return super().truncated(text)

    model = EmbeddingModel("unused.gguf", embedder=Counting())  # type: ignore[arg-type]
    texts = [" ".join(["word"] * 400)] * 1000  # each cut to the window's 256 tokens
    with pytest.raises(RequestError, match="embeds at most 1000"):
        model.embed(texts, max_tokens=1000, truncate=True)
    assert Counting.cuts <= 4  # 256 tokens a text: the fourth is past 1,000


@pytest.mark.parametrize("content_type", [None, "application/octet-stream", "application/x-www-form-urlencoded"])
def test_a_body_is_read_as_json_whatever_its_content_type_as_ollama_reads_it(served, content_type):
    """litellm's `ollama/` and `ollama_chat/` send no Content-Type (its async client octet-stream), Ollama's
    own curl examples curl's form type: Ollama reads the JSON anyway, and each was a 400 here."""
    import httpx

    body = json.dumps({"model": MODEL, "stream": False, "messages": [{"role": "user", "content": "Greet me."}]})
    headers = {"Content-Type": content_type} if content_type else {}
    r = httpx.post(served.base_url + "/api/chat", content=body, headers=headers, timeout=120)
    assert r.status_code == 200 and r.json()["message"]["content"] == "Hello.", r.text
    r = httpx.post(served.base_url + "/api/embed", content=json.dumps({"model": EMBEDDER, "input": "hi"}),
                   headers=headers, timeout=120)
    assert r.status_code == 200 and len(r.json()["embeddings"]) == 1, r.text
    # a web page's form post (no CORS preflight) is still refused, by its Origin, not by its type
    r = httpx.post(served.base_url + "/api/chat", content=body, headers={**headers, "Origin": "http://evil.example"})
    assert r.status_code == 403 and "evil.example" in r.text
