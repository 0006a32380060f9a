"""A thinking model's thought in the chat app: folded apart from the answer while it streams, when it
is stored and reopened, never copied or sent back; an attached server's `reasoning_content` is put
back in its tags so the app shows one shape. Recorded replies through Textual's pilot; the server
is the real app on loopback over a scripted model."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.text import Text
from textual.widgets import Collapsible, Markdown, Static

from localspec.attach.remote import RemoteGeneration, ThoughtTags, openai_client
from localspec.engine.config import GenerationRequest
from localspec.engine.events import Done, Stats, Token
from localspec.server import ServerSettings
from localspec.tui import ChatApp, ChatStore, ReplayBackend
from localspec.tui.backend import BackendInfo
from localspec.tui.widgets import MessageView
from tests.fake_tier import scripted_app, scripted_backend, scripted_pipeline, scripted_tier
from tests.server_harness import ServerThread
from tests.tui_demo import DEMO_RSS, fixed_model_rows
from tests.tui_support import wait_for

SIZE = (120, 36)
pytestmark = pytest.mark.anyio
THOUGHT = "The user wants colours. [bold]Three[/] will do.\x1b[2J"
RAW = f"<think>\n{THOUGHT}\n</think>\n\nRed, green, blue."


@pytest.fixture
def anyio_backend():
    return "asyncio"


def _reply(text: str, *, piece: int = 3) -> list:
    tokens = [Token(text[i:i + piece], (i,), "target") for i in range(0, len(text), piece)]
    return [*tokens, Done("stop", Stats(mode="off", prompt_tokens=9, completion_tokens=len(tokens)), text)]


def _app(tmp_path: Path, backend: ReplayBackend) -> ChatApp:
    return ChatApp(lambda _p, **_: backend, store=ChatStore(tmp_path / "chats.sqlite"), memory_probe=lambda: DEMO_RSS,
                   model_rows=fixed_model_rows, export_dir=tmp_path / "exports")


def _reply_view(app) -> MessageView:
    return [v for v in app.query(MessageView) if v.role == "assistant"][-1]


def _shown(view: MessageView) -> tuple[str, str, bool, bool]:
    """(the Markdown body's source, the thought's text, whether the fold shows, whether it is collapsed)."""
    folded = view.query_one(".thought", Collapsible)
    thought = view.query_one(".thought-body", Static).render()
    return (view.query_one(".body", Markdown).source, thought.plain if isinstance(thought, Text) else str(thought),
            bool(folded.display), folded.collapsed)


async def test_a_thought_streams_folded_apart_and_only_the_answer_is_copied_and_sent_back(tmp_path):
    backend = ReplayBackend([_reply(RAW), _reply("Cyan.")], delay=0.01)
    app = _app(tmp_path, backend)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.backend is not None, 10, "the backend")
        await app.send("Name three colours.")
        await wait_for(pilot, lambda: "Thinking" in str(_reply_view(app).query_one(".thought", Collapsible).title),
                       10, "the thought, while it streams")
        assert _shown(_reply_view(app))[0] == ""  # nothing of the thought in the answer
        _reply_view(app).query_one(".thought", Collapsible).collapsed = False  # opened while it streams
        await wait_for(pilot, lambda: "colours" in _shown(_reply_view(app))[1], 10, "the thought so far, drawn")
        _reply_view(app).query_one(".thought", Collapsible).collapsed = True
        await wait_for(pilot, lambda: not app.generating, 20, "the reply")
        view = _reply_view(app)
        assert _shown(view) == ("Red, green, blue.", THOUGHT.replace("\x1b", "\N{SYMBOL FOR ESCAPE}"), True, True)
        assert view.query_one(".thought", Collapsible).title == f"Thought ({len(THOUGHT):,} characters)"
        assert [m.content for m in app.store.messages(app.chat_id)][-1] == RAW  # stored as the model wrote it
        await pilot.press("f9")
        assert app.clipboard == "Red, green, blue."
        await app.send("And one more?")
        await wait_for(pilot, lambda: not app.generating, 20, "the second reply")
        backend.requests.get_nowait()
        sent = backend.requests.get_nowait().messages
        assert [(m.role, m.content) for m in sent[-2:]] == [("assistant", "Red, green, blue."), ("user", "And one more?")]


async def test_a_thought_the_prompt_opened_is_kept_so_when_reopened_and_a_quoted_close_is_not_a_thought(tmp_path):
    """Guessed from the text, a reply that quoted `</think>` lost what came before it, on screen and in
    the history sent back; a reply whose prompt opened its thought stores that, for when it is reopened."""
    quoting = "The answer ends at the closing tag </think>, and the answer follows."
    info = BackendInfo(kind="replay", target="recorded", n_ctx=4096, opens_thought=True)
    app = _app(tmp_path, ReplayBackend([_reply("Let me think.\n</think>\n\nHi.")], info=info))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.backend is not None, 10, "the backend")
        await app.send("Hello?")
        await wait_for(pilot, lambda: not app.generating, 20, "the reply")
        assert _shown(_reply_view(app)) == ("Hi.", "Let me think.", True, True)
    plain = ReplayBackend([_reply(quoting), _reply("Just an answer.")])  # its prompt opens no thought
    app = _app(tmp_path, plain)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: any(v.role == "assistant" for v in app.query(MessageView)), 10, "the chat")
        assert _shown(_reply_view(app)) == ("Hi.", "Let me think.", True, True)  # reopened: still a thought
        await app.send("Quote it?")
        await wait_for(pilot, lambda: not app.generating, 20, "the reply")
        assert _shown(_reply_view(app))[::2] == (quoting, False)
        await app.send("Again?")
        await wait_for(pilot, lambda: not app.generating, 20, "the second reply")
        plain.requests.get_nowait()
        sent = plain.requests.get_nowait().messages
        assert [m.content for m in sent if m.role == "assistant"] == ["Hi.", quoting]


def test_the_in_process_backend_asks_the_template_with_the_chats_variables():
    from localspec.tui.backend import LocalBackend
    from tests.fake_tier import scripted_engine
    from tests.test_template_vars import OPENING_TEMPLATE

    engine = scripted_engine(chat_template=OPENING_TEMPLATE)
    backend = LocalBackend(engine, target="scripted", owns_engine=False)
    hi = [{"role": "user", "content": "Hi."}]
    assert backend.opens_thought(GenerationRequest(messages=hi)) is True
    assert backend.opens_thought(GenerationRequest(messages=hi, template_vars={"enable_thinking": False})) is False
    engine.close()


async def test_a_template_that_opens_the_thought_shows_it_as_thought_from_the_first_token(tmp_path):
    info = BackendInfo(kind="replay", target="recorded", n_ctx=4096, opens_thought=True)
    backend = ReplayBackend([_reply("Pondering the question at some length. " * 3 + "</think>\n\nDone.")],
                            info=info, delay=0.02)
    app = _app(tmp_path, backend)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.backend is not None, 10, "the backend")
        await app.send("Think first.")
        await wait_for(pilot, lambda: "Thinking…" in str(_reply_view(app).query_one(".thought", Collapsible).title)
                       and "Pondering" in _reply_view(app).content, 10, "the thought under way")
        assert _shown(_reply_view(app))[0] == ""
        await wait_for(pilot, lambda: not app.generating, 20, "the reply")
        assert _shown(_reply_view(app))[:2] == ("Done.", "Pondering the question at some length. " * 2
                                                + "Pondering the question at some length.")


async def test_a_stored_reply_with_a_thought_reopens_folded(tmp_path):
    store = ChatStore(tmp_path / "chats.sqlite")
    chat = store.create_chat("stored")
    store.add_message(chat.id, "user", "Colours?")
    store.add_message(chat.id, "assistant", RAW, {"stats": Stats().to_dict(), "finish_reason": "stop"})
    store.close()
    app = _app(tmp_path, ReplayBackend([_reply("x")]))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: any(v.role == "assistant" for v in app.query(MessageView)), 10, "the chat")
        source, thought, shows, collapsed = _shown(_reply_view(app))
        assert (source, shows, collapsed) == ("Red, green, blue.", True, True) and "[bold]Three[/]" in thought


def test_a_thought_sent_apart_goes_back_in_its_tags_before_the_content():
    tags = ThoughtTags()
    pieces = [tags.wrap("Hmm", None), tags.wrap(", yes.", None), tags.wrap(None, "Answer"), tags.wrap(None, " two.")]
    assert "".join(pieces) == "<think>\nHmm, yes.\n</think>\n\nAnswer two."
    assert ThoughtTags().wrap(None, "plain") == "plain" and ThoughtTags().wrap(None, None) == ""


def test_an_attached_servers_reasoning_content_comes_back_as_the_model_wrote_it(module_home):
    """The server splits the thought into `reasoning_content`; the remote reply was its content alone."""
    tier = scripted_tier(model_id="thinker", script=lambda prompt: "<think>\nShort thought.\n</think>\n\nAn answer.")
    app = scripted_app(backend=scripted_backend(pipeline=scripted_pipeline(tiers=[tier])),
                       settings=ServerSettings(cache=False, router=False))
    with ServerThread(app) as srv:
        client = openai_client(f"{srv.base_url}/v1")
        request = GenerationRequest(messages=[{"role": "user", "content": "Think."}], max_tokens=64)
        events = list(RemoteGeneration(client, "thinker", request, localspec=True))
    done = events[-1]
    assert isinstance(done, Done) and done.finish_reason == "stop", done
    assert done.text == "<think>\nShort thought.\n</think>\n\nAn answer."


async def test_the_chat_settings_turn_the_thought_off_for_that_chat(tmp_path):
    from localspec.tui import ChatParams
    from localspec.tui.dialogs import ChatSettingsDialog

    backend = ReplayBackend([_reply("Red.")])
    app = _app(tmp_path, backend)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.backend is not None, 10, "the backend")
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: isinstance(app.screen, ChatSettingsDialog), 5, "the settings")
        app.screen.query_one("#think").value = "off"
        app.screen.query_one("#save").press()
        await wait_for(pilot, lambda: not isinstance(app.screen, ChatSettingsDialog), 5, "the settings to close")
        assert app.store.get_chat(app.chat_id).params == ChatParams(think=False)
        await app.send("Colours?")
        await wait_for(pilot, lambda: not app.generating, 20, "the reply")
        assert backend.requests.get_nowait().template_vars == {"enable_thinking": False}


@pytest.mark.parametrize(("stored", "read"), [('{"think": false}', False), ('{"think": "false"}', None),
                                              ('{"think": null}', None), ("{}", None)])
def test_a_stored_thinking_setting_is_read_only_when_it_is_a_boolean(stored, read):
    from localspec.tui import ChatParams

    assert ChatParams.from_json(stored).think is read
