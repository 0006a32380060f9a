"""Every answer names its request: `x-request-id` (the openai SDK's `_request_id`), `request-id` on
Anthropic's routes (the anthropic SDK's), a client's own well-formed id kept, a guard's refusal
included. A real server on loopback over a scripted model, the official clients."""

from __future__ import annotations

import re

import anthropic
import openai

from localspec.server import ServerSettings
from tests.fake_tier import one_model_app
from tests.server_harness import ServerThread, request

MODEL = "scripted-ids"
KEY = "request-id-key"
MADE = re.compile(r"req_[0-9a-f]{32}")


def test_each_answer_names_its_request_and_keeps_a_clients_own_id(module_home):
    app, _ = one_model_app(model_id=MODEL, script=lambda prompt: "Hi.",
                           settings=ServerSettings(api_key=KEY, cache=False, router=False))
    with ServerThread(app) as srv:
        client = openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key=KEY, max_retries=0)
        ask = dict(model=MODEL, messages=[{"role": "user", "content": "Hi."}], max_tokens=8)
        first = client.chat.completions.with_raw_response.create(**ask)
        second = client.chat.completions.with_raw_response.create(**ask)
        assert MADE.fullmatch(first.request_id or "") and first.request_id != second.request_id
        mine = client.chat.completions.with_raw_response.create(**ask, extra_headers={"X-Request-Id": "trace-42.a:b"})
        assert mine.request_id == "trace-42.a:b"
        odd = client.chat.completions.with_raw_response.create(**ask, extra_headers={"X-Request-Id": "x" * 129})
        assert MADE.fullmatch(odd.request_id or "")  # not a client's to choose any more: a made one
        message = anthropic.Anthropic(base_url=srv.base_url, api_key=KEY, max_retries=0).messages.with_raw_response \
            .create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "Hi."}])
        assert MADE.fullmatch(message.request_id or "") and message.headers["x-request-id"] == message.request_id
        refused = request(srv.base_url, "GET", "/v1/models")  # no key: the guard's 401
        assert refused.status_code == 401 and MADE.fullmatch(refused.headers["x-request-id"])
