"""Chats on disk: one SQLite file under the data dir, written only from the UI thread.

Assistant messages keep their stats and the token origins (draft/prediction/target runs), so the
accepted-token view and the per-reply figures survive a restart. What a row holds is read as untrusted
(a hand-edited file, one written by another tool or a newer version): every column the app uses comes
back as the type it expects (text that is not UTF-8 or not text at all is shown with U+FFFD, settings
that are not a JSON object are the defaults, `messages` hands the app only well-formed meta), the row is
left as it is, and `take_notices` says what was repaired.
"""

from __future__ import annotations

import json
import logging
import math
import re
import sqlite3
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from localspec.engine.events import Stats
from localspec.errors import LocalspecError
from localspec.paths import resolve_paths
from localspec.tui.safe_text import terminal_safe

_SCHEMA = """
CREATE TABLE IF NOT EXISTS chats (
    id INTEGER PRIMARY KEY,
    title TEXT NOT NULL,
    system_prompt TEXT NOT NULL DEFAULT '',
    params TEXT NOT NULL DEFAULT '{}',
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused: ids order the conversation
    chat_id INTEGER NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    meta TEXT NOT NULL DEFAULT '{}',
    created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_by_chat ON messages(chat_id, id);
CREATE TABLE IF NOT EXISTS prefs (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


def default_db_path() -> Path:
    return resolve_paths().data_dir / "chats.sqlite"


@dataclass
class ChatParams:
    """Per-chat generation settings; None means the engine's or profile's default."""

    profile: str | None = None
    temperature: float = 0.7
    max_tokens: int = 1024
    mode: str | None = None  # off | draft | lookup
    draft_k: int | None = None
    route: str | None = None  # "auto" (the router), "small", "large"; None: the profile's target
    predict_code: bool = True  # send the code blocks of the user's message as the prediction (Predicted Outputs)
    think: bool | None = None  # a thinking model's thought on or off (the template's enable_thinking); None: its own

    @classmethod
    def from_json(cls, text: str) -> ChatParams:
        """Raises ValueError when `text` is not a JSON object (the caller decides what a bad row means)."""
        data = json.loads(text or "{}")
        if not isinstance(data, dict):
            raise ValueError(f"JSON {json.dumps(data)[:20]}, not an object")
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        if not isinstance(known.get("predict_code", True), bool):  # "false" would read as true
            del known["predict_code"]
        if not isinstance(known.get("think"), bool | None):
            del known["think"]
        return cls(**known)


ROLES = ("user", "assistant")  # what the app writes; a row may hold another (a newer version's, a hand edit)


@dataclass
class Message:
    id: int
    chat_id: int
    role: str  # one of ROLES, or whatever else a row holds
    content: str
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class Chat:
    id: int
    title: str
    system_prompt: str
    params: ChatParams
    created: float
    updated: float


class _Undecodable(str):
    """Text read from a TEXT column whose bytes were not UTF-8, decoded with U+FFFD in their place:
    the type says so, so that the store can tell the user which row it repaired."""


def _decode(raw: bytes) -> str:
    # sqlite's own decoding raises on the first bad byte and fails the whole query (every chat unreadable).
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return _Undecodable(raw.decode("utf-8", errors="replace"))


BUSY_TIMEOUT_S = 5.0  # how long a write waits for another process (a second chat app) to finish its own


# The columns the app reads and writes: a file whose tables lack one (another program's, an older
# layout) is not one this version can use, however readable.
_COLUMNS = {"chats": ("id", "title", "system_prompt", "params", "created", "updated"),
            "messages": ("id", "chat_id", "role", "content", "meta", "created"), "prefs": ("key", "value")}


class _ForeignSchema(sqlite3.DatabaseError):
    """A readable SQLite file whose tables are not the app's."""


def _check_schema(db: sqlite3.Connection) -> None:
    """Before anything is written: the tables the file already has are the app's (missing ones are made)."""
    for table, wanted in _COLUMNS.items():
        kind = db.execute("SELECT type FROM sqlite_master WHERE name = ?", (table,)).fetchone()
        if kind is None:
            continue
        missing = [c for c in wanted if c not in {row[1] for row in db.execute(f"PRAGMA table_info({table})")}]
        if kind[0] != "table" or missing:
            what = f"'{table}' is a {kind[0]}" if kind[0] != "table" else f"'{table}' has no column '{missing[0]}'"
            raise _ForeignSchema(f"is not a localspec chat database ({what})")


class ChatStoreBusy(LocalspecError):
    """Another program held the chat database's lock past the busy timeout while the app ran: what the
    action would have written is not saved, and the app says so instead of stopping."""


class _Connection(sqlite3.Connection):
    """Once the store is open, SQLite's bare "database is locked" becomes a ChatStoreBusy naming the file."""

    path: Path | None = None  # set when the store is open; None while opening, where the store decides

    def execute(self, *args: Any, **kwargs: Any) -> sqlite3.Cursor:
        try:
            return super().execute(*args, **kwargs)
        except sqlite3.OperationalError as exc:
            if (busy := self._busy_error(exc)) is None:
                raise
            raise busy from exc

    def commit(self) -> None:
        try:
            super().commit()
        except sqlite3.OperationalError as exc:
            if (busy := self._busy_error(exc)) is None:
                raise
            raise busy from exc

    def _busy_error(self, exc: sqlite3.OperationalError) -> ChatStoreBusy | None:
        if self.path is None or not _busy(exc):
            return None
        return ChatStoreBusy(f"The chat database {self.path} is locked by another program (another `localspec chat`, "
                             "a backup, or an sqlite3 shell in a transaction); nothing was changed.",
                             "Let that program finish or close it, then do it again.")


def _open(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, factory=_Connection)
    try:
        db.text_factory = _decode
        db.row_factory = sqlite3.Row
        db.execute("PRAGMA foreign_keys = ON")
        _check_schema(db)
        db.executescript(_SCHEMA)
        db.commit()
        db.execute("SELECT count(*) FROM chats").fetchone()
    except BaseException:
        db.close()
        raise
    db.path = path
    return db


def _busy(exc: sqlite3.DatabaseError) -> bool:
    """SQLITE_BUSY or SQLITE_LOCKED (and their extended codes): another connection holds the lock."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


class ChatStore:
    def __init__(self, path: Path | None = None, clock=time.time) -> None:
        self.path = path or default_db_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._clock = clock
        self.recovered_from: Path | None = None
        self._notices: list[str] = []  # repairs made on reading, not yet shown
        self._noticed: set[str] = set()  # each repair is said once a session, however often the row is read
        try:
            self._db = _open(self.path)
        except sqlite3.DatabaseError as exc:  # a corrupt file must not stop the app: keep it aside, start afresh
            if _busy(exc):  # held by another process, not broken: moving it aside would hide every chat
                raise LocalspecError(
                    f"The chat database {self.path} is locked by another program (another `localspec chat`, "
                    "a backup, or an sqlite3 shell in a transaction).",
                    "Let that program finish or close it, then start the chat again.") from None
            self.recovered_from = self.path.with_name(f"{self.path.name}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}")
            self.path.replace(self.recovered_from)
            problem = str(exc) if isinstance(exc, _ForeignSchema) else f"could not be read ({_short(exc)})"
            aside = self.recovered_from.name
            self._notice(f"{self.path.name} {problem}; moved it to {aside} and started a new one. Fix: none needed "
                         f"to chat; the earlier chats stay in {aside} (`sqlite3 {aside} .recover` may save them).")
            self._db = _open(self.path)

    def close(self) -> None:
        self._db.close()

    def take_notices(self) -> list[str]:
        """The repairs made on reading since the last call: one line each, with the cause and the fix."""
        notices, self._notices = self._notices, []
        return notices

    def _notice(self, line: str) -> None:
        if line not in self._noticed:
            self._noticed.add(line)
            self._notices.append(line)
            logging.getLogger(__name__).warning("%s: %s", self.path, line)

    def _text(self, value: object, *, what: str, fix: str) -> str:
        text, problem = stored_text(value)
        if problem:
            self._notice(f"{what} {problem}. Fix: {fix}.")
        return text

    # ------------------------------------------------------------------ chats

    def create_chat(self, title: str = "New chat", system_prompt: str = "", params: ChatParams | None = None) -> Chat:
        now = self._clock()
        params = params or ChatParams()
        cur = self._db.execute(
            "INSERT INTO chats (title, system_prompt, params, created, updated) VALUES (?, ?, ?, ?, ?)",
            (encodable(title), encodable(system_prompt), json.dumps(asdict(params)), now, now),
        )
        self._db.commit()
        return self.get_chat(_inserted_id(cur))

    def get_chat(self, chat_id: int) -> Chat:
        row = self._db.execute("SELECT * FROM chats WHERE id = ?", (chat_id,)).fetchone()
        if row is None:
            raise KeyError(chat_id)
        return self._chat(row)

    def list_chats(self) -> list[Chat]:
        """Most recently used first."""
        rows = self._db.execute("SELECT * FROM chats ORDER BY updated DESC, id DESC").fetchall()
        return [self._chat(r) for r in rows]

    def rename_chat(self, chat_id: int, title: str) -> None:
        self._db.execute("UPDATE chats SET title = ? WHERE id = ?", (encodable(title.strip() or "Untitled"), chat_id))
        self._db.commit()

    def update_settings(self, chat_id: int, system_prompt: str, params: ChatParams) -> None:
        self._db.execute(
            "UPDATE chats SET system_prompt = ?, params = ? WHERE id = ?",
            (encodable(system_prompt), json.dumps(asdict(params)), chat_id),
        )
        self._db.commit()

    def delete_chat(self, chat_id: int) -> None:
        self._db.execute("DELETE FROM chats WHERE id = ?", (chat_id,))
        self._db.commit()

    def touch(self, chat_id: int) -> None:
        self._db.execute("UPDATE chats SET updated = ? WHERE id = ?", (self._clock(), chat_id))
        self._db.commit()

    # ------------------------------------------------------------------ messages

    def add_message(self, chat_id: int, role: str, content: str, meta: dict[str, Any] | None = None) -> Message:
        cur = self._db.execute(
            "INSERT INTO messages (chat_id, role, content, meta, created) VALUES (?, ?, ?, ?, ?)",
            (chat_id, encodable(role), encodable(content), json.dumps(meta or {}), self._clock()),
        )
        self._db.execute("UPDATE chats SET updated = ? WHERE id = ?", (self._clock(), chat_id))
        self._db.commit()
        return Message(_inserted_id(cur), chat_id, role, content, dict(meta or {}))

    def messages(self, chat_id: int) -> list[Message]:
        rows = self._db.execute("SELECT * FROM messages WHERE chat_id = ? ORDER BY id", (chat_id,)).fetchall()
        return [self._message(r) for r in rows]

    def update_meta(self, message_id: int, meta: dict[str, Any]) -> None:
        self._db.execute("UPDATE messages SET meta = ? WHERE id = ?", (json.dumps(meta), message_id))
        self._db.commit()

    def update_message(self, message_id: int, content: str, meta: dict[str, Any]) -> None:
        self._db.execute("UPDATE messages SET content = ?, meta = ? WHERE id = ?",
                         (encodable(content), json.dumps(meta), message_id))
        self._db.commit()

    def delete_message(self, message_id: int) -> None:
        self._db.execute("DELETE FROM messages WHERE id = ?", (message_id,))
        self._db.commit()

    def delete_from(self, chat_id: int, message_id: int) -> None:
        """Drop a message and everything after it (regenerate, edit and resend)."""
        self._db.execute("DELETE FROM messages WHERE chat_id = ? AND id >= ?", (chat_id, message_id))
        self._db.commit()

    # ------------------------------------------------------------------ preferences

    def get_pref(self, key: str, default: str | None = None) -> str | None:
        row = self._db.execute("SELECT value FROM prefs WHERE key = ?", (key,)).fetchone()
        if row is None:
            return default
        return self._text(row["value"], what=f"The saved setting '{key}'", fix="set it again in the app")

    def set_pref(self, key: str, value: str) -> None:
        self._db.execute("INSERT OR REPLACE INTO prefs (key, value) VALUES (?, ?)", (key, encodable(value)))
        self._db.commit()

    # ------------------------------------------------------------------ reading rows (untrusted)

    def _chat(self, row: sqlite3.Row) -> Chat:
        chat_id = row["id"]
        title = self._text(row["title"], what=f"Chat {chat_id}'s title", fix="rename the chat (F2)")
        system_prompt = self._text(row["system_prompt"], what=f"Chat {chat_id}'s system prompt",
                                   fix="edit it in the chat settings (Ctrl+S)")
        return Chat(chat_id, title, system_prompt, self._params(chat_id, row["params"]), row["created"],
                    row["updated"])

    def _params(self, chat_id: int, value: object) -> ChatParams:
        text, _ = stored_text(value)
        try:
            return ChatParams.from_json(text)
        except (ValueError, RecursionError) as exc:  # not JSON (or nested past the parser), not an object
            cause = "not JSON" if isinstance(exc, json.JSONDecodeError) else _short(exc)
            self._notice(f"Chat {chat_id}'s settings could not be read ({cause}); the chat uses the defaults. "
                         "Fix: set them again in the chat settings (Ctrl+S).")
            return ChatParams()

    def _message(self, row: sqlite3.Row) -> Message:
        chat_id = row["chat_id"]
        fix = "none needed, the row is kept as it is"
        role = self._text(row["role"], what=f"A message's role in chat {chat_id}", fix=fix)
        if role not in ROLES:
            self._notice(f"Chat {chat_id} has a message with the role '{role[:40]}', which this version does not "
                         f"know; it is shown as it is. Fix: {fix}.")
        content = self._text(row["content"], what=f"A message in chat {chat_id}", fix=fix)
        meta, _ = stored_text(row["meta"])
        return Message(row["id"], chat_id, role, content, stored_meta(meta))


# ---------------------------------------------------------------------- replies in flight

SAVE_PARTIAL_EVERY_S = 0.5  # a killed app loses at most this much of a streaming reply


def interrupted_meta(segments: list[list[str]]) -> dict[str, Any]:
    """What a reply's row holds while it streams: if the app dies now, it reopens marked interrupted."""
    return {"interrupted": True, "segments": segments}


class PartialReply:
    """Writes a streaming reply into its row as it grows: the first token at once, then at most every
    `every_s` (not per token), and a last time on `flush` when the app closes mid-reply."""

    def __init__(self, store: ChatStore, message_id: int, every_s: float = SAVE_PARTIAL_EVERY_S,
                 clock=time.monotonic) -> None:
        self.store, self.message_id, self.every_s, self._clock = store, message_id, every_s, clock
        self._saved_at: float | None = None
        self._content = ""
        self._segments: list[list[str]] = []

    def grew(self, content: str, segments: list[list[str]]) -> bool:
        """The reply is now `content`; save it if due. Returns whether it saved."""
        self._content, self._segments = content, segments
        if self._saved_at is not None and self._clock() - self._saved_at < self.every_s:
            return False
        self.flush()
        return True

    def flush(self) -> None:
        self._saved_at = self._clock()
        try:
            self.store.update_message(self.message_id, self._content, interrupted_meta(self._segments))
        except ChatStoreBusy as exc:  # another program holds the file: the next save (or the last) tries again
            logging.getLogger(__name__).warning("%s", exc)


def _inserted_id(cur: sqlite3.Cursor) -> int:
    """The row id an INSERT just made (sqlite sets it on every successful insert)."""
    if cur.lastrowid is None:
        raise RuntimeError("sqlite reported no row id for an insert")
    return cur.lastrowid


def encodable(text: str) -> str:
    """`text` in a form UTF-8 can hold (sqlite and the clipboard need one). A lone surrogate (half of a pair that a
    token boundary split) has none and failed the write; it becomes U+FFFD, and halves that meet again
    are joined (UTF-16 with surrogatepass pairs them up)."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _short(exc: BaseException) -> str:
    return str(exc).splitlines()[0][:80] if str(exc) else type(exc).__name__


# ---------------------------------------------------------------------- export

_UNSAFE = re.compile(r"[^A-Za-z0-9._ -]+")


def safe_filename(title: str, suffix: str = ".md") -> str:
    """A file name from a chat title: no separators, no leading dots, never empty."""
    name = _UNSAFE.sub("_", title).strip(" ._-")[:80] or "chat"
    return name + suffix


_FENCE_LINE = re.compile(r" {0,3}(`{3,}|~{3,})(.*)")


def _fences_closed(text: str) -> str:
    """`text` with a code fence it leaves open (a reply cut off mid-block) closed: in the export the
    rest of the chat, headings included, would otherwise be part of that block."""
    open_fence: str | None = None
    for line in text.splitlines():
        m = _FENCE_LINE.fullmatch(line)
        if m is None or (m.group(1)[0] == "`" and "`" in m.group(2)):  # ```x``` is inline code, not a fence
            continue
        fence = m.group(1)
        if open_fence is None:
            open_fence = fence
        elif fence[0] == open_fence[0] and len(fence) >= len(open_fence) and not line.strip().strip(fence[0]):
            open_fence = None
    return text if open_fence is None else f"{text}\n{open_fence}"


def _exported(text: str) -> str:
    """A message as the export holds it: no control character (the file is read with `cat` too, where
    an escape would act on the terminal), no code block left open."""
    return _fences_closed(terminal_safe(text))


def _heading(text: str) -> str:
    return " ".join(_exported(text).split())  # one line: a title or role may hold newlines


def export_markdown(chat: Chat, messages: list[Message]) -> str:
    lines = [f"# {_heading(chat.title)}", ""]
    if chat.system_prompt:
        lines += ["**System:**", "", _exported(chat.system_prompt), ""]
    for m in messages:
        lines += [f"## {_heading(m.role.capitalize())}", "", _exported(m.content), ""]
        stats = m.meta.get("stats")
        if m.role == "assistant" and stats:
            lines += [f"*{reply_summary(stats)}*", ""]
    return "\n".join(lines)


def export_chat(chat: Chat, messages: list[Message], directory: Path) -> Path:
    """Write the chat as Markdown into `directory`; the name cannot leave it."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / safe_filename(chat.title)
    n = 1
    while path.exists():
        n += 1
        path = directory / safe_filename(f"{chat.title} {n}")
    if path.resolve().parent != directory.resolve():  # belt and braces
        raise ValueError(f"refusing to write outside {directory}")
    path.write_text(export_markdown(chat, messages), encoding="utf-8")
    return path


# ---------------------------------------------------------------------- reading stored values


def stored_text(value: object) -> tuple[str, str | None]:
    """A stored TEXT value as str, and what was wrong with it (None: nothing). sqlite keeps whatever
    a writer gave it: bytes that are not UTF-8, a BLOB, a number, NULL where the schema was edited."""
    if isinstance(value, _Undecodable):
        return str(value), "is not valid UTF-8; it is shown with \ufffd for the unreadable bytes"
    if isinstance(value, str):
        return value, None
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace"), "is binary data, not text; it is shown as text"
    if value is None:
        return "", "is missing; it is shown empty"
    return str(value), None  # a number: its digits are what the user typed or meant


def stored_meta(text: str) -> dict[str, Any]:
    """A message's meta as the app may use it: a dict whose token runs and stats are well formed.
    Anything else a row holds (not JSON, not an object, runs or stats of the wrong shape) is dropped
    or repaired here, so a bad row shows what it can instead of stopping the app."""
    try:
        meta = json.loads(text or "{}")
    except (ValueError, RecursionError):  # not JSON, or nested deeper than the parser goes
        return {}
    if not isinstance(meta, dict):
        return {}
    if "segments" in meta:
        meta["segments"] = stored_runs(meta["segments"])
    if not isinstance(meta.get("stats", {}), dict):
        del meta["stats"]
    if not isinstance(meta.get("cache_entry"), str | None):
        meta["cache_entry"] = None
    return meta


def stored_runs(raw: object) -> list[list[str]]:
    """Token runs ([text, origin] pairs) from a stored reply. A run whose text is not a string is
    dropped; an origin this version does not know (a newer one's, say) is kept as it is: it shows
    without a colour and is saved back unchanged. An origin that is not a string becomes ""."""
    runs: list[list[str]] = []
    for item in raw if isinstance(raw, list) else []:
        if not isinstance(item, list | tuple) or len(item) != 2 or not isinstance(item[0], str):
            continue
        runs.append([item[0], item[1] if isinstance(item[1], str) else ""])
    return runs


def stats_from_dict(data: object) -> Stats:
    """Stats from a stored reply; a field of the wrong type keeps its default (rows are untrusted)."""
    if not isinstance(data, dict):
        return Stats()
    defaults = Stats()
    known = {k: v for k, v in data.items()
             if k in Stats.__dataclass_fields__ and _same_kind(v, getattr(defaults, k))}
    return Stats(**known)


_EXACT = 2**53  # ints past this do not convert to float exactly, and far past it not at all (OverflowError)


def _same_kind(value: object, default: object) -> bool:
    def count(v: object) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and abs(v) < _EXACT

    if isinstance(default, float):
        return count(value) or (isinstance(value, float) and math.isfinite(value))
    if isinstance(default, int):
        return count(value)
    if isinstance(default, str):
        return isinstance(value, str)
    if isinstance(default, list):
        return isinstance(value, list) and all(count(v) for v in value)
    if isinstance(default, dict):
        return isinstance(value, dict) and all(isinstance(k, str) and count(v) for k, v in value.items())
    return False


def had_prediction(s: Stats) -> bool:
    """Whether the reply was asked with a prediction: the engine tokenized one, or a server reported
    prediction tokens (a remote backend knows no token count of its own)."""
    return s.prediction_tokens > 0 or s.prediction_drafted > 0


def reply_summary(stats: dict[str, Any] | Stats) -> str:
    """The one line under a reply: tokens, speed, TTFT, the draft's acceptance and, when the reply had
    a prediction, how many of the prediction's tokens were accepted and rejected."""
    s = stats if isinstance(stats, Stats) else stats_from_dict(stats)
    parts = [f"{s.completion_tokens} tokens", f"{s.tokens_per_second:.1f} tok/s", f"TTFT {s.ttft_ms:.0f} ms"]
    if s.drafted:
        parts.append(f"accepted {s.accepted}/{s.drafted} ({s.acceptance_rate:.0%})")
    if had_prediction(s):
        parts.append(f"prediction {s.prediction_accepted} accepted, {s.prediction_rejected} rejected")
    parts.append(f"mode {s.mode}")
    return " · ".join(parts)
