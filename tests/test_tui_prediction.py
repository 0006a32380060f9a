"""Predicted Outputs in the faces: the chat app sends the code of the user's message as the prediction
(in process and over `--connect`), colours the tokens accepted from it (Ctrl+T), counts them in the
reply's line and the metrics pane, and still opens chats whose stored token runs it does not know.

The in-process case runs the real engine over the scripted model (tests/fake_tier.py), so the
prediction-origin tokens the view colours are the ones the engine emitted; no model files.
"""

from __future__ import annotations

import json

import pytest
from rich.style import Style

from localspec.cli.generate_cmd import ORIGIN_COLOURS, shown
from localspec.engine.config import GenerationRequest
from localspec.engine.events import Done, Stats, Token
from localspec.engine.sampling import SamplingParams
from localspec.tui import ChatApp, ChatParams, ChatStore, LocalBackend, ReplayBackend, SessionMetrics
from localspec.tui.dialogs import ChatSettingsDialog
from localspec.tui.store import reply_summary
from localspec.tui.widgets import ORIGIN_STYLES, MessageView, predicted_reply
from tests.fake_tier import scripted, scripted_app, scripted_engine, scripted_pipeline, scripted_tier
from tests.server_harness import ServerThread, request, wait_until
from tests.tui_support import wait_for

SIZE = (120, 36)
pytestmark = pytest.mark.anyio

FILE = ("def area(width, height):\n    return width * height\n\n\n"
        "def perimeter(width, height):\n    return 2 * (width + height)\n")
EDITED = FILE.replace("area(width, height):\n    return", "area(width: float, height: float) -> float:\n    return")
ASK = f"Add type hints to area:\n\n```python\n{FILE}```\n"
PREDICTION = f"```python\n{FILE.rstrip()}\n```"
REPLY = f"```python\n{EDITED}```"  # what the scripted model answers: the edited file, fenced


@pytest.fixture
def anyio_backend():
    return "asyncio"


def _colours(style) -> tuple:
    """Foreground and background as RGB: a Rich style string, or the Textual style it renders to."""
    if isinstance(style, str):
        rich = Style.parse(style)
        return tuple(tuple(c.get_truecolor()) if c else None for c in (rich.color, rich.bgcolor))
    return tuple(tuple(c.rgb) if c else None for c in (style.foreground, style.background))


def _styles_at(text, i: int) -> list[tuple]:
    return [_colours(s.style) for s in text.spans if s.start <= i < s.end]


# ---------------------------------------------------------------- the rule


def test_the_prediction_is_the_messages_code_blocks_fenced_as_a_model_writes_them():
    assert predicted_reply(ASK) == PREDICTION
    two = ("Rename x to y in both:\n```py  \nx = 1\n```\nand\n\n~~~\nprint(x)\n~~~\n")
    assert predicted_reply(two) == "```py\nx = 1\n```\n\n~~~\nprint(x)\n~~~"
    # A longer fence holds a shorter one; an unclosed last block runs to the end and is closed.
    nested = "````md\n```js\nf()\n```\n````\nthen\n```\nstill open\n"
    assert predicted_reply(nested) == "````md\n```js\nf()\n```\n````\n\n```\nstill open\n```"
    for none in ("No code here.", "Inline ```code``` only.", "```\n\n   \n```", ""):
        assert predicted_reply(none) is None, none


# ---------------------------------------------------------------- the app, in process


class Capturing(LocalBackend):
    """The real in-process backend, keeping each request it was given."""

    requests: list[GenerationRequest]

    def start(self, request: GenerationRequest, route: str | None = None):
        self.requests.append(request)
        return super().start(request, route=route)


def _assistant_views(app) -> list[MessageView]:
    return [v for v in app.query(MessageView) if v.role == "assistant"]


async def test_code_in_the_message_is_the_prediction_its_tokens_blue_and_counted(tmp_path):
    engine = scripted_engine(script=scripted(default=REPLY), mode="lookup", parallel=1)
    backend = Capturing(engine, profile="default", target="scripted", owns_engine=False)
    backend.requests = []
    app = ChatApp(lambda _p, **_: backend, store=ChatStore(tmp_path / "chats.sqlite"), metrics=SessionMetrics(),
                  new_chat_params=ChatParams(temperature=0.0, max_tokens=400))
    try:
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: app.backend is not None, 30, "the backend")
            await pilot.press("ctrl+g")
            await app.send(ASK)
            await wait_for(pilot, lambda: not app.generating, 60, "the reply")
            assert [r.prediction for r in backend.requests] == [PREDICTION]
            view = _assistant_views(app)[-1]
            assert view.content == REPLY
            stats = view.stats()
            assert stats is not None and stats.prediction_accepted > 0 and stats.prediction_rejected >= 0

            # The accepted-token view: every character keeps its token's origin and that origin's colour.
            await pilot.press("ctrl+t")
            text = view.query_one(".origins").render()
            assert text.plain == REPLY
            origins = {origin for _, origin in view.segments}
            assert "prediction" in origins and "target" in origins
            pos = 0
            for run, origin in view.segments:
                for i in (pos, pos + len(run) - 1):
                    assert _styles_at(text, i) == [_colours(ORIGIN_STYLES[origin])], (i, origin)
                pos += len(run)
            assert len({_colours(ORIGIN_STYLES[o]) for o in ("draft", "prediction", "target")}) == 3
            # The scripted model's tokens are bytes: the blue text is exactly the accepted prediction tokens.
            assert sum(len(run) for run, o in view.segments if o == "prediction") == stats.prediction_accepted
            assert any("blue" in str(n.message) for n in app._notifications)

            counts = f"prediction {stats.prediction_accepted} accepted, {stats.prediction_rejected} rejected"
            assert counts in str(view.query_one(".stats").render())
            body = str(app.query_one("#metrics-body").render())
            assert f"{stats.prediction_accepted} accepted, {stats.prediction_rejected} rejected" in body
            stored = app.store.messages(app.chat_id)[-1]
            assert ["prediction" == o for _, o in stored.meta["segments"]] == [o == "prediction" for _, o in view.segments]
    finally:
        engine.close()


async def test_a_message_without_code_sends_no_prediction_and_the_setting_turns_it_off(tmp_path):
    replay = ReplayBackend([[Token("ok", (1,), "target"), Done("stop", Stats(completion_tokens=1), "ok")]])
    app = ChatApp(lambda _p, **_: replay, store=ChatStore(tmp_path / "chats.sqlite"), metrics=SessionMetrics())
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.backend is not None, 10, "the backend")
        for text in ("hello", ASK):
            await app.send(text)
            await wait_for(pilot, lambda: not app.generating, 10, "the reply")
        assert [replay.requests.get_nowait().prediction for _ in range(2)] == [None, PREDICTION]
        # No prediction, no prediction figures: the pane and the line stay as they were.
        assert "prediction" not in str(app.query_one("#metrics-body").render())
        assert "prediction" not in str(_assistant_views(app)[-1].query_one(".stats").render())

        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: isinstance(app.screen, ChatSettingsDialog), 5, "the settings")
        box = app.screen.query_one("#predict_code")
        assert box.value is True
        box.value = False
        app.screen.query_one("#save").press()
        await wait_for(pilot, lambda: not isinstance(app.screen, ChatSettingsDialog), 5)
        assert app.store.get_chat(app.chat_id).params.predict_code is False
        await app.send(ASK)
        await wait_for(pilot, lambda: not app.generating, 10, "the reply")
        assert replay.requests.get_nowait().prediction is None


def test_chat_params_from_an_untrusted_row_keep_a_boolean_setting():
    assert ChatParams.from_json(json.dumps({"predict_code": False})).predict_code is False
    assert ChatParams.from_json(json.dumps({"predict_code": "false"})).predict_code is True  # the default
    assert ChatParams.from_json("{}").predict_code is True  # a chat saved before the setting


# ---------------------------------------------------------------- stored chats


def _stored_chat(store: ChatStore, meta: str) -> int:
    chat = store.create_chat("old")
    store.add_message(chat.id, "user", "hi")
    msg = store.add_message(chat.id, "assistant", "abcdefg")
    store._db.execute("UPDATE messages SET meta = ? WHERE id = ?", (meta, msg.id))  # as another version wrote it
    store._db.commit()
    return chat.id


async def test_a_stored_chat_with_unknown_origins_and_malformed_runs_opens(tmp_path):
    store = ChatStore(tmp_path / "chats.sqlite")
    runs = [["a", "draft"], ["b", "telepathy"], ["c", 5], ["d"], 7, ["e", ["x"]], [None, "target"],
            ["f", "prediction"], ["g", "target", "extra"]]
    stats = {"completion_tokens": "many", "ttft_ms": 12.0, "decode_ms": 10**400, "prompt_tokens": 10**30, "prediction_tokens": 9, "prediction_drafted": 4,
             "prediction_accepted": 3, "drafted": [1], "auto_steps": {"lookup": "x"}, "mode": "lookup"}
    chat_id = _stored_chat(store, json.dumps({"stats": stats, "segments": runs, "finish_reason": "stop"}))
    _stored_chat(store, "not json")
    _stored_chat(store, "[" * 100_000)
    _stored_chat(store, json.dumps([["a", "draft"]]))
    _stored_chat(store, json.dumps({"segments": "abc", "stats": [1, 2], "cache_entry": {"id": 1}}))

    meta = store.messages(chat_id)[-1].meta
    assert meta["segments"] == [["a", "draft"], ["b", "telepathy"], ["c", ""], ["e", ""], ["f", "prediction"]]
    line = reply_summary(meta["stats"])
    assert line.startswith("0 tokens") and "prediction 3 accepted, 1 rejected" in line and "mode lookup" in line

    replay = ReplayBackend([[Done("stop", Stats(), "")]])
    app = ChatApp(lambda _p, **_: replay, store=store, metrics=SessionMetrics())
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.backend is not None, 10, "the backend")
        for chat in store.list_chats():
            await app.chat_screen.chats.open(chat.id)
            await pilot.pause()
        await app.chat_screen.chats.open(chat_id)
        await pilot.press("ctrl+t")
        await pilot.pause()
        view = _assistant_views(app)[-1]
        text = view.query_one(".origins").render()
        assert text.plain == "abcef"
        assert [_styles_at(text, i) for i in range(len(text.plain))] == [  # an unknown origin has no colour
            [_colours(ORIGIN_STYLES["draft"])], [], [], [], [_colours(ORIGIN_STYLES["prediction"])]]
        assert "prediction 3 accepted, 1 rejected" in str(view.query_one(".stats").render())


# ---------------------------------------------------------------- --connect


def test_the_remote_backend_sends_the_prediction_and_reads_its_counts(module_home):
    from localspec.server import ServerSettings
    from localspec.tui import RemoteBackend

    tier = scripted_tier(model_id="scripted-large", script=scripted(default=REPLY), mode="lookup", parallel=1,
                         n_ctx=512)
    settings = ServerSettings(parallel=1, n_ctx=512, cache=False, router=False)
    with ServerThread(scripted_app(pipeline=scripted_pipeline(tiers=[tier]), settings=settings)) as srv:
        assert wait_until(lambda: request(srv.base_url, "GET", "/health").status_code == 200, timeout=60)
        backend = RemoteBackend(srv.base_url)
        try:
            results = {}
            for prediction in (PREDICTION, None):
                req = GenerationRequest(messages=[{"role": "user", "content": ASK}], max_tokens=400,
                                        sampling=SamplingParams(temperature=0.0), prediction=prediction)
                events = list(backend.start(req))
                done = events[-1]
                assert isinstance(done, Done) and done.error is None, done
                assert done.text == REPLY
                results[prediction] = done.stats
        finally:
            backend.close()
    st = results[PREDICTION]
    assert st.prediction_accepted > 0 and st.prediction_drafted == st.prediction_accepted + st.prediction_rejected
    assert "prediction" in reply_summary(st)
    plain = results[None]
    assert (plain.prediction_drafted, plain.prediction_accepted) == (0, 0) and "prediction" not in reply_summary(plain)


# ---------------------------------------------------------------- generate --show-draft


def test_generate_show_draft_colours_prediction_tokens_apart():
    def token(origin):
        return Token("x", (1,), origin)

    assert shown(token("prediction"), colour=True) == f"{ORIGIN_COLOURS['prediction']}x\x1b[0m"
    assert shown(token("draft"), colour=True) == f"{ORIGIN_COLOURS['draft']}x\x1b[0m"
    assert ORIGIN_COLOURS["prediction"] != ORIGIN_COLOURS["draft"]
    assert shown(token("target"), colour=True) == "x" and shown(token("prediction"), colour=False) == "x"
