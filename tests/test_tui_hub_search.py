"""The chat app's models screen searches the Hub (`/`): quants with size and fit as `models search`
gives them, Enter pulls one, an offline or unreachable Hub is one line, repo names show as written."""

from __future__ import annotations

import socket
import threading
from types import SimpleNamespace

import pytest
from huggingface_hub import constants as hf_constants
from textual.app import App
from textual.widgets import DataTable, Static

from localspec.cli.models_cmd import _search_row
from localspec.models import ModelManager
from localspec.models import hub
from localspec.models.hub import HubFile, HubQuant, SearchHit
from localspec.models.hub_header import remote_fit
from localspec.models.hub_search import default_n_ctx
from localspec.models.units import human_bytes
from localspec.tui.models_screen import ModelsScreen
from tests.models_helpers import tmp_store  # noqa: F401
from tests.test_models_hub import TINY, fake_hub, files  # noqa: F401
from tests.tui_demo import fixed_model_rows
from tests.tui_support import wait_for

SIZE = (120, 40)
pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


class Host(App):
    """Just the models screen: no chat backend to start."""

    def __init__(self, screen: ModelsScreen) -> None:
        super().__init__()
        self.models = screen

    def on_mount(self) -> None:
        self.push_screen(self.models)


@pytest.fixture
def hub_at(monkeypatch, tmp_store):  # noqa: F811
    """Point localspec's Hub calls at ``url``: huggingface-hub reads HF_ENDPOINT only at import, and
    every search, listing and header read of localspec's names its endpoint from hub.endpoint()."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)

    def point(url: str) -> None:
        monkeypatch.setattr(hub, "endpoint", lambda: url)

    return point


def _shown(widget: Static) -> str:
    visual = widget.visual if hasattr(widget, "visual") else widget.render()
    return getattr(visual, "plain", None) or str(visual)


def _cells(table: DataTable) -> list[list[str]]:
    return [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]


async def _search(app: Host, pilot, query: str) -> None:
    await wait_for(pilot, lambda: app.screen is app.models, 5, "the models screen")
    await pilot.press("slash")
    await pilot.press(*query)
    await pilot.press("enter")
    status = app.models.query_one("#hub-status", Static)
    await wait_for(pilot, lambda: _shown(status) and not _shown(status).startswith("Searching"), 30,
                   "the search's answer")


async def test_a_query_lists_each_quant_with_size_and_fit_and_enter_pulls_it(hub_at, fake_hub, files,  # noqa: F811
                                                                              monkeypatch):
    hub_at(fake_hub.url)
    pulled: list[str] = []

    def fake_pull(self, reference, progress=None, force=False, *, draft=None):
        pulled.append(reference)
        return SimpleNamespace(record=SimpleNamespace(model_id="tiny-q4_k_m"))

    monkeypatch.setattr(ModelManager, "pull_hub", fake_pull)
    app = Host(ModelsScreen(fixed_model_rows))
    async with app.run_test(size=SIZE) as pilot:
        await _search(app, pilot, "tiny")
        rows = _cells(app.models.query_one("#hub-table", DataTable))
        assert [r[:3] for r in rows] == [[TINY, "Q8_0", human_bytes(len(files["q8"]))],
                                         [TINY, "Q4_K_M", human_bytes(len(files["q4"]))]]
        # the CLI's verdicts: its own rows for the same search, judged at the default profile's context
        cli = [q["fit"] for h in hub.search("tiny") for q in _search_row(h, default_n_ctx(ModelManager()))["quants"]]
        assert [r[3] for r in rows] == cli and set(cli) <= {"fits in RAM", "fits in VRAM"}  # kilobytes fit
        assert all(q.fit.estimate is not None for q in app.models.hub_rows)  # the header was read, KV counted
        assert fake_hub.header_reads() and fake_hub.gets() == []  # nothing downloaded by a search
        assert "2 quant(s) in 1 repo(s)" in _shown(app.models.query_one("#hub-status", Static))

        await pilot.press("down", "enter")
        await wait_for(pilot, lambda: not app.models.busy and pulled, 10, "the pull")
        assert pulled == [f"hf.co/{TINY}:Q4_K_M"]
        assert _shown(app.models.query_one("#pull-status", Static)) == "Installed tiny-q4_k_m."


@pytest.mark.parametrize("where", ["offline", "unreachable"])
async def test_an_offline_or_unreachable_hub_is_one_line_and_the_list_stays(hub_at, monkeypatch, where):
    if where == "offline":
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        says = "Offline (HF_HUB_OFFLINE is set)"
    else:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()  # nothing listens there now
        hub_at(f"http://127.0.0.1:{port}")
        says = "Cannot reach the Hub"
    app = Host(ModelsScreen(fixed_model_rows))
    async with app.run_test(size=SIZE) as pilot:
        await _search(app, pilot, "qwen")
        line = _shown(app.models.query_one("#hub-status", Static))
        assert line.startswith(f"Hub search failed: {says}") and "\n" not in line
        assert not app.models.query_one("#hub-table").display
        assert app.models.query_one("#models-table", DataTable).row_count == len(fixed_model_rows())


async def test_repo_names_and_queries_show_as_written():
    evil = "acme/[bold]x[/]-GGUF"
    hit = SearchHit(evil, 1, False, (HubQuant("Q4_K_M", (HubFile("x-Q4_K_M.gguf", 5_000, None),)),))
    seen: list[str] = []

    def search(query: str) -> list[SearchHit]:
        seen.append(query)
        return [hit] if query == "x" else []

    app = Host(ModelsScreen(fixed_model_rows, hub_search=search))
    async with app.run_test(size=SIZE) as pilot:
        await _search(app, pilot, "x")
        rows = _cells(app.models.query_one("#hub-table", DataTable))
        assert rows == [[evil, "Q4_K_M", human_bytes(5_000), remote_fit(5_000, None, default_n_ctx(ModelManager())).verdict]]
        assert evil in app.export_screenshot()  # drawn as written, not as bold "x"
        await pilot.press("slash", "backspace")
        await pilot.press(*"[red]none", "enter")
        await wait_for(pilot, lambda: len(seen) == 2, 10, "the second search")
        status = app.models.query_one("#hub-status", Static)
        await wait_for(pilot, lambda: "No GGUF" in _shown(status), 10, "no results")
        assert _shown(status) == "No GGUF models on the Hub match '[red]none'."
        assert not app.models.query_one("#hub-table").display


async def test_a_slow_earlier_search_does_not_replace_the_latest_answer():
    release = threading.Event()

    def search(query: str) -> list[SearchHit]:
        if query == "slow":
            release.wait(10)
        return [SearchHit(f"acme/{query}-GGUF", 1, False, (HubQuant("Q4_K_M", (HubFile("m.gguf", 5_000, None),)),))]

    app = Host(ModelsScreen(fixed_model_rows, hub_search=search))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.screen is app.models, 5, "the models screen")
        await pilot.press("slash", *"slow", "enter")
        await pilot.press(*["backspace"] * 4, *"fast", "enter")
        table = app.models.query_one("#hub-table", DataTable)
        await wait_for(pilot, lambda: table.row_count == 1, 10, "the fast answer")
        release.set()
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert _cells(table)[0][0] == "acme/fast-GGUF"
        assert [r.repo for r in app.models.hub_rows] == ["acme/fast-GGUF"]
