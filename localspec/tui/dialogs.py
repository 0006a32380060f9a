"""Modal dialogs: confirm, one-line text, chat settings, key-binding help, errors.

What they show (chat titles, error text, model ids, profile descriptions) is never parsed as
markup: `markup=False` on text widgets, `Text` objects for options and table cells; and it is
drawn through `terminal_safe`, so that no control character in it reaches the terminal.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Checkbox, DataTable, Input, Label, Select, Static, TextArea
from textual.widgets.select import NoSelection

from localspec.engine.config import MODES  # every mode a request takes, "auto" included
from localspec.tui.safe_text import terminal_safe
from localspec.tui.store import ChatParams


class _Dialog(ModalScreen):
    BINDINGS = [Binding("escape", "dismiss_none", "Close")]

    def action_dismiss_none(self) -> None:
        self.dismiss(None)


class ConfirmDialog(_Dialog):
    def __init__(self, question: str, yes: str = "Yes", no: str = "No") -> None:
        super().__init__()
        self.question, self.yes, self.no = question, yes, no

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static(terminal_safe(self.question), classes="question", markup=False)
            with Horizontal(classes="buttons"):
                yield Button(self.yes, variant="primary", id="yes")
                yield Button(self.no, id="no")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")


class ErrorDialog(_Dialog):
    """A failure that needs reading: what went wrong and the fix."""

    def __init__(self, cause: str, fix: str | None = None) -> None:
        super().__init__()
        self.cause, self.fix = cause, fix

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog error"):
            yield Label("Error", classes="dialog-title")
            yield Static(terminal_safe(self.cause), classes="question", markup=False)
            if self.fix:
                yield Static(terminal_safe(f"Fix: {self.fix}"), classes="fix", markup=False)
            with Horizontal(classes="buttons"):
                yield Button("OK", variant="primary", id="ok")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(None)


class TextPrompt(_Dialog):
    def __init__(self, title: str, value: str = "") -> None:
        super().__init__()
        self.title_text, self.value = title, value

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.title_text, classes="dialog-title", markup=False)
            yield Input(self.value, id="value")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip() or None)


class ChoiceDialog(_Dialog):
    """Pick one of several options (e.g. the active profile)."""

    def __init__(self, title: str, options: Sequence[tuple[str, str]], value: str | None = None) -> None:
        super().__init__()
        self.title_text, self.options, self.value = title, list(options), value

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.title_text, classes="dialog-title", markup=False)
            options = [(Text(terminal_safe(label)), value) for label, value in self.options]
            yield Select(options, value=self.value if self.value else Select.NULL, id="choice")
            with Horizontal(classes="buttons"):
                yield Button("OK", variant="primary", id="ok")
                yield Button("Cancel", id="cancel")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        value = self.query_one("#choice", Select).value
        self.dismiss(value if event.button.id == "ok" and value is not Select.NULL else None)


ROUTES = ("auto", "small", "large")


THINKING = ("on", "off")


class ChatSettingsDialog(_Dialog):
    """The chat's system prompt and parameters. Dismisses with (system_prompt, params) or None."""

    def __init__(self, system_prompt: str, params: ChatParams, profiles: Sequence[str]) -> None:
        super().__init__()
        self.system_prompt, self.params, self.profiles = system_prompt, params, list(profiles)
        self.unavailable: list[str] = []  # stored choices the lists no longer offer, as "profile 'x'"

    def _stored_choice(self, what: str, stored: object, options: Sequence[str]) -> str | NoSelection:
        """The chat's stored choice when the list offers it, else none. Select refuses a value it does
        not offer, and a stored one may be gone (a profile models.toml dropped) or a newer version's."""
        if stored is None or stored == "":
            return Select.NULL
        if isinstance(stored, str) and stored in options:
            return stored
        self.unavailable.append(f"{what} '{stored}'")
        return Select.NULL

    def compose(self) -> ComposeResult:
        p = self.params
        profile = self._stored_choice("profile", p.profile, self.profiles)
        route = self._stored_choice("model", p.route, ROUTES)
        mode = self._stored_choice("speculative mode", p.mode, MODES)
        with VerticalScroll(classes="dialog settings"):
            yield Label("Chat settings", classes="dialog-title")
            if self.unavailable:
                yield Static(terminal_safe(f"Not available any more: {', '.join(self.unavailable)}. Save stores the "
                                           "choices shown instead; Cancel keeps the chat's settings as they are."),
                             id="settings-notice", classes="fix", markup=False)
            yield Label("System prompt")
            yield TextArea(terminal_safe(self.system_prompt), id="system")  # a TextArea draws text as written
            yield Label("Profile (models)")
            yield Select([(Text(terminal_safe(name)), name) for name in self.profiles], value=profile, id="profile",
                         prompt="active profile")
            yield Label("Temperature (0 = greedy)")
            yield Input(str(p.temperature), id="temperature")
            yield Label("Max tokens")
            yield Input(str(p.max_tokens), id="max_tokens")
            yield Label("Model (auto: the router picks small or large per request)")
            yield Select([(r, r) for r in ROUTES], value=route, id="route", prompt="large (the profile's target)")
            yield Label("Speculative mode")
            yield Select([(m, m) for m in MODES], value=mode, id="mode", prompt="engine default")
            yield Label("Draft k (most tokens drafted per step; empty = default)")
            yield Input("" if p.draft_k is None else str(p.draft_k), id="draft_k")
            yield Checkbox("Predict the reply from code in my message (Predicted Outputs)", p.predict_code,
                           id="predict_code")
            yield Label("Thinking (a thinking model's thought, where its template can turn it off)")
            yield Select([(label, label) for label in THINKING], id="think", prompt="the model's default",
                         value=Select.NULL if p.think is None else THINKING[0 if p.think else 1])
            yield Static("", id="settings-error", classes="fix", markup=False)
            with Horizontal(classes="buttons"):
                yield Button("Save", variant="primary", id="save")
                yield Button("Cancel", id="cancel")

    def _params(self) -> ChatParams:
        def select(id_: str) -> str | None:
            v = self.query_one(id_, Select).value
            return None if v is Select.NULL else str(v)

        temperature = float(self.query_one("#temperature", Input).value)
        max_tokens = int(self.query_one("#max_tokens", Input).value)
        k_text = self.query_one("#draft_k", Input).value.strip()
        k = int(k_text) if k_text else None
        if not 0.0 <= temperature <= 5.0:
            raise ValueError("temperature must be between 0 and 5")
        if max_tokens <= 0:
            raise ValueError("max tokens must be positive")
        if k is not None and not 0 <= k <= 64:
            raise ValueError("draft k must be between 0 and 64")
        think = select("#think")
        return ChatParams(profile=select("#profile"), temperature=temperature, max_tokens=max_tokens,
                          mode=select("#mode"), draft_k=k, route=select("#route"),
                          predict_code=self.query_one("#predict_code", Checkbox).value,
                          think=None if think is None else think == THINKING[0])

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id != "save":
            self.dismiss(None)
            return
        try:
            params = self._params()
        except ValueError as exc:
            self.query_one("#settings-error", Static).update(f"Invalid value: {exc}")
            return
        shown = self.query_one("#system", TextArea).text
        # Unedited, the stored prompt stays as it was (the box showed its escapes as stand-ins).
        system_prompt = self.system_prompt if shown == terminal_safe(self.system_prompt) else shown
        self.dismiss((system_prompt, params))


class HelpScreen(_Dialog):
    """Every key binding, with what it does."""

    def __init__(self, keys: Sequence[tuple[str, str]]) -> None:
        super().__init__()
        self.keys = list(keys)

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog help"):
            yield Label("Keys  (Esc closes; Ctrl+P opens the command palette)", classes="dialog-title")
            yield DataTable(id="keys", show_cursor=False)

    def on_mount(self) -> None:
        table = self.query_one("#keys", DataTable)
        table.add_columns("key", "action")
        for key, action in self.keys:
            table.add_row(key, action)  # the app's own key table, not untrusted text
