"""Installed and available models: size, fit, pull with progress, delete, pick the active profile, and
search the Hugging Face Hub for any GGUF (its quants with size and fit, the same as `models search`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message as TextualMessage
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Input, Label, ProgressBar, Static

from localspec.errors import LocalspecError
from localspec.models import ModelManager, ModelRow, ProgressEvent
from localspec.models.hub import SearchHit, parse_hub_ref
from localspec.models.hub_search import QuantRow, default_n_ctx, quant_rows
from localspec.models.units import human_bytes
from localspec.tui.dialogs import ChoiceDialog, ConfirmDialog
from localspec.tui.safe_text import terminal_safe

if TYPE_CHECKING:
    from localspec.tui.app import ChatApp

HubSearch = Callable[[str], list[SearchHit]]
HUB_LIMIT = 10  # repos per search, as `localspec models search` shows by default


def _search_hub(query: str) -> list[SearchHit]:
    from localspec.models import hub

    return hub.search(query, limit=HUB_LIMIT)


def fit_label(row: ModelRow) -> str:
    if row.fit is None:
        return "–"
    return f"{row.fit.verdict} ({human_bytes(row.fit.total_bytes)})"


class ModelsChanged(TextualMessage):
    """Posted to the app after a pull, delete or profile change."""


class HubResults(TextualMessage):
    """The Hub search worker's answer: the quants found, or the one line saying why there are none."""

    def __init__(self, query: str, rows: list[QuantRow], failure: str | None, unlisted: int) -> None:
        super().__init__()
        self.query = query
        self.rows = rows
        self.failure = failure
        self.unlisted = unlisted  # repos whose files could not be listed (gated, gone)


def hub_summary(results: HubResults) -> str:
    if results.failure is not None:
        return f"Hub search failed: {results.failure}"
    if not results.rows:
        return f"No GGUF models on the Hub match {results.query!r}."
    repos = len({r.repo for r in results.rows})
    skipped = f"; {results.unlisted} repo(s) could not be listed" if results.unlisted else ""
    return f"{len(results.rows)} quant(s) in {repos} repo(s){skipped}. Enter pulls the selected one."


class ModelsScreen(Screen):
    BINDINGS = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("p", "pull", "Pull"),
        Binding("P", "pull_profile", "Pull profile"),
        Binding("d", "delete", "Delete"),
        Binding("a", "pick_profile", "Active profile"),
        Binding("r", "refresh", "Refresh"),
        Binding("slash", "search", "Search Hub"),
    ]

    def __init__(self, rows: Callable[[], list[ModelRow]] | None = None, active_profile: str | None = None,
                 pull_profile: str | None = None, *, hub_search: HubSearch | None = None) -> None:
        super().__init__()
        self._rows_source = rows or (lambda: ModelManager().list())
        self._hub_search = hub_search or _search_hub
        self.hub_rows: list[QuantRow] = []
        self._hub_query: str | None = None  # the latest search: a slower earlier one's answer is dropped
        self.active_profile = active_profile
        self._pull_on_mount = pull_profile
        self.rows: list[ModelRow] = []
        self.busy = False

    def compose(self) -> ComposeResult:
        with Vertical(id="models-body"):
            yield Label("Models", classes="pane-title")
            yield Static("", id="profile-line", markup=False)  # registry text and error causes: plain
            yield DataTable(id="models-table", cursor_type="row", zebra_stripes=True)
            yield Input(id="hub-query", placeholder="Search the Hugging Face Hub for GGUF models, Enter to search")
            yield Static("", id="hub-status", markup=False)  # Hub error causes and queries: plain
            yield DataTable(id="hub-table", cursor_type="row", zebra_stripes=True)
            yield Static("", id="pull-status", markup=False)
            yield ProgressBar(id="pull-progress", show_eta=False)
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one("#models-table", DataTable)
        table.add_columns("model", "role", "quant", "size", "installed", "fit")
        self.query_one("#hub-table", DataTable).add_columns("hub repo", "quant", "size", "fit")
        for hidden in ("#pull-progress", "#hub-query", "#hub-status", "#hub-table"):
            self.query_one(hidden).display = False
        self.action_refresh()
        if self._pull_on_mount:
            self._pull(profile=self._pull_on_mount)

    def _profile_line(self) -> str:
        try:
            mgr = ModelManager()
            name = self.active_profile or mgr.registry.default_profile or "default"
            prof = mgr.profile(name)
            return f"Active profile: {name} — {prof.description}"
        except LocalspecError as exc:
            return f"Active profile: {self.active_profile or '?'} ({exc.cause})"

    def action_refresh(self) -> None:
        try:
            self.rows = self._rows_source()
        except LocalspecError as exc:  # models.toml broken (a hand edit): the screen says so, the app goes on
            self.rows = []
            self.notify(str(exc), title="Models", severity="error", timeout=15)
        table = self.query_one("#models-table", DataTable)
        table.clear()
        for r in self.rows:
            cells = (r.id, r.role, r.quant or "", human_bytes(r.size), "yes" if r.installed else "no", fit_label(r))
            table.add_row(*(Text(terminal_safe(c)) for c in cells), key=r.id)
        self.query_one("#profile-line", Static).update(terminal_safe(self._profile_line()))

    def _selected(self) -> ModelRow | None:
        table = self.query_one("#models-table", DataTable)
        if not self.rows or table.cursor_row is None or table.cursor_row >= len(self.rows):
            return None
        return self.rows[table.cursor_row]

    # ------------------------------------------------------------------ Hub search

    def action_search(self) -> None:
        box = self.query_one("#hub-query", Input)
        box.display = True
        box.focus()

    @on(Input.Submitted, "#hub-query")
    def _search_submitted(self, event: Input.Submitted) -> None:
        query = event.value.strip()
        if not query:
            return
        self._hub_query = query
        self._show_hub_status(f"Searching the Hub for {query!r}…")
        self._search_worker(query)

    @work(thread=True, group="hub-search", exclusive=True)
    def _search_worker(self, query: str) -> None:
        try:
            hits = self._hub_search(query)
            n_ctx = default_n_ctx(ModelManager())
            rows = [row for hit in hits for row in quant_rows(hit, n_ctx)]
            unlisted = sum(hit.error is not None for hit in hits)
            self.post_message(HubResults(query, rows, None, unlisted))
        except LocalspecError as exc:  # offline, unreachable: the curated list above still works
            self.post_message(HubResults(query, [], exc.cause, 0))
        except Exception as exc:  # noqa: BLE001  never crash the app on a search problem
            first = (str(exc).strip().splitlines() or [""])[0][:160]
            self.post_message(HubResults(query, [], f"{type(exc).__name__}: {first}", 0))

    def on_hub_results(self, results: HubResults) -> None:
        if results.query != self._hub_query:  # a thread worker cannot be cancelled, only outlived
            return
        self.hub_rows = results.rows
        table = self.query_one("#hub-table", DataTable)
        table.clear()
        for r in results.rows:  # repo names are untrusted text: Text cells never parse markup
            cells = (r.repo, r.quant, human_bytes(r.size), r.fit.verdict)
            table.add_row(*(Text(terminal_safe(c)) for c in cells))
        table.display = bool(results.rows)
        self._show_hub_status(hub_summary(results))
        if results.rows:
            table.focus()

    def _show_hub_status(self, line: str) -> None:
        status = self.query_one("#hub-status", Static)
        status.display = True
        status.update(terminal_safe(line))

    @on(DataTable.RowSelected, "#hub-table")
    def _hub_row_chosen(self, event: DataTable.RowSelected) -> None:
        if 0 <= event.cursor_row < len(self.hub_rows):
            self._pull(model_id=self.hub_rows[event.cursor_row].pull_ref)

    # ------------------------------------------------------------------ pull

    def action_pull(self) -> None:
        row = self._selected()
        if row is None:
            return
        if row.installed:
            self.notify(f"{row.id} is already installed.")
            return
        self._pull(model_id=row.id)

    def action_pull_profile(self) -> None:
        self._pull(profile=self.active_profile)  # None: the registry's default, read in the worker (it may be broken)

    def _pull(self, model_id: str | None = None, profile: str | None = None) -> None:
        if self.busy:
            self.notify("A download is already running.", severity="warning")
            return
        self.busy = True
        bar = self.query_one("#pull-progress", ProgressBar)
        bar.display = True
        bar.update(total=None, progress=0)
        self._pull_worker(model_id, profile)

    @work(thread=True, group="pull", exclusive=True)
    def _pull_worker(self, model_id: str | None, profile: str | None) -> None:
        def progress(ev: ProgressEvent) -> None:
            self.app.call_from_thread(self.show_progress, ev)

        try:
            mgr = ModelManager()
            if model_id and parse_hub_ref(model_id) is not None:  # hf.co/USER/REPO:QUANT from a search
                what = mgr.pull_hub(model_id, progress=progress).record.model_id
            elif model_id:
                mgr.pull(model_id, progress=progress)
                what = model_id
            else:
                mgr.pull_profile(profile, progress=progress)
                what = f"profile {profile or 'default'}"
            self.app.call_from_thread(self._pull_finished, f"Installed {what}.", None)
        except LocalspecError as exc:
            self.app.call_from_thread(self._pull_finished, None, exc)
        except Exception as exc:  # never crash the app on a download problem
            self.app.call_from_thread(self._pull_finished, None, LocalspecError(f"Download failed: {exc}."))

    def show_progress(self, ev: ProgressEvent) -> None:
        bar = self.query_one("#pull-progress", ProgressBar)
        if ev.bytes_total:
            bar.update(total=ev.bytes_total, progress=ev.bytes_done)
        done = f" {human_bytes(ev.bytes_done)} / {human_bytes(ev.bytes_total)}" if ev.bytes_total else ""
        src = f" from {ev.source}" if ev.source else ""
        msg = f" — {ev.message}" if ev.message else ""
        self.query_one("#pull-status", Static).update(terminal_safe(f"{ev.model_id}: {ev.phase}{src}{done}{msg}"))

    def _pull_finished(self, message: str | None, error: LocalspecError | None) -> None:
        self.busy = False
        self.query_one("#pull-progress").display = False
        if error is not None:
            self.query_one("#pull-status", Static).update(terminal_safe(f"Failed: {error.cause}"))
            self.notify(str(error), title="Pull failed", severity="error", timeout=10)
        else:
            self.query_one("#pull-status", Static).update(terminal_safe(message or ""))
            self.notify(message or "Done.")
        self.action_refresh()
        self.app.post_message(ModelsChanged())

    # ------------------------------------------------------------------ delete, profile

    def action_delete(self) -> None:
        row = self._selected()
        if row is None or not row.installed:
            self.notify("Select an installed model to delete.", severity="warning")
            return

        def confirmed(yes: bool | None) -> None:
            if not yes:
                return
            try:
                freed = ModelManager().remove(row.id)
            except LocalspecError as exc:
                self.notify(str(exc), severity="error")
                return
            self.notify(f"Deleted {row.id} ({human_bytes(freed)} freed).")
            self.action_refresh()
            self.app.post_message(ModelsChanged())

        self.app.push_screen(ConfirmDialog(f"Delete {row.id} from the model store?", yes="Delete"), confirmed)

    def action_pick_profile(self) -> None:
        try:
            options = [(f"{name} — {p.description}", name) for name, p in ModelManager().registry.profiles.items()]
        except LocalspecError as exc:
            self.notify(str(exc), title="Profiles", severity="error", timeout=15)
            return

        def picked(name: str | None) -> None:
            if name:
                self.active_profile = name
                cast("ChatApp", self.app).set_active_profile(name)
                self.action_refresh()

        self.app.push_screen(ChoiceDialog("Active profile", options, self.active_profile), picked)
