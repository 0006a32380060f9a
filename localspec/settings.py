"""The one settings model: settings.toml and the LOCALSPEC_* environment, read and checked in one place.

    profile = "default"        # the active profile: serve, generate and chat use it (the chat app writes it)
    [engine]                   # any EngineConfig field (localspec/engine/config.py)
    [server]                   # how `localspec serve` runs: host, port, limits, models
    [cache]                    # the answer cache of the endpoint
    [router]                   # model "auto" routes between the profile's tiers
    [metrics]                  # privacy, retention, prices, drift limits (localspec/metrics/settings.py)

Precedence: defaults < the profile < settings.toml < the environment < a model's own settings
(models.toml [models.settings]) < explicit command-line flags. An adapter is not an [engine] setting
(it would reach every engine): --lora, or models.toml's `lora =`.
The environment spells a key `LOCALSPEC_<TABLE>__<KEY>` (`LOCALSPEC_SERVER__PORT=9000`, a list as
`a,b`); `LOCALSPEC_PROFILE` and the older `LOCALSPEC_THREADS` ([engine] n_threads) also count.
The file is untrusted: an unknown key or a bad value is one line naming the key, where it came
from and the fix. The API key never lives here (the service's private env file, or `api_key_file`).
"""

from __future__ import annotations

import difflib
import os
import stat
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from localspec.engine.config import EngineConfig
from localspec.errors import ConfigError
from localspec.metrics.settings import MetricsSettings
from localspec.paths import resolve_paths

ENV_PREFIX = "LOCALSPEC_"
PROFILE_ENV = "LOCALSPEC_PROFILE"
THREADS_ENV = "LOCALSPEC_THREADS"  # older name of LOCALSPEC_ENGINE__N_THREADS
MAX_SETTINGS_BYTES = 1 << 20  # a settings file is a few lines: a bigger one is the wrong file
SERVE_PARALLEL = 4  # serve's slots when [engine] parallel is unset (one-user faces keep EngineConfig's 1)


def _keep_alive(value: str) -> str:
    from localspec.server.keepalive import parse_keep_alive

    parse_keep_alive(value)
    return value


class ServerTable(BaseModel):
    """`[server]`: what `localspec serve` flags set, but the engine's and the cache's (their own tables)."""

    model_config = ConfigDict(extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    api_key_file: Path | None = None  # the key itself never goes here: LOCALSPEC_API_KEY or this file
    allowed_hosts: list[str] = Field(default_factory=list)
    allowed_origins: list[str] = Field(default_factory=list)
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    model: str | None = Field(None, min_length=1)  # target id overriding the profile's (--model)
    draft_model: str | None = Field(None, min_length=1)
    max_queue: int = Field(16, ge=0)
    max_tokens_cap: int = Field(4096, ge=1)
    max_body_mb: float = Field(4.0, gt=0, le=1024)
    request_timeout_s: float = Field(60.0, gt=0, le=3600, allow_inf_nan=False)  # to send a head, then a body
    max_connections: int | None = Field(None, ge=8, le=65536)  # default: 512, or half the descriptor limit
    max_embedding_inputs: int = Field(2048, ge=1)
    max_embedding_tokens: int = Field(65536, ge=1)
    retry_after_s: int = Field(2, ge=1)
    embeddings: bool = True
    keep_alive: str = "5m"
    pull: bool = True  # fetch missing models at start (--no-pull)

    _check_keep_alive = field_validator("keep_alive")(_keep_alive)


class CacheTable(BaseModel):
    """`[cache]`: the one cache-settings object (serve's --no-cache, --cache-* flags)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    semantic: bool = False  # near-duplicates too (embedding similarity + guard + judge)
    sampled: bool = False  # also cache sampled answers (temperature > 0 without a seed)
    judge: Literal["model", "scorer", "rules"] = "model"


class RouterTable(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = True  # model "auto" routes between the profile's tiers


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    profile: str | None = Field(None, min_length=1, max_length=255)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    server: ServerTable = Field(default_factory=ServerTable)
    cache: CacheTable = Field(default_factory=CacheTable)
    router: RouterTable = Field(default_factory=RouterTable)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)

    @field_validator("profile")
    @classmethod
    def _printable(cls, value: str | None) -> str | None:
        if value is not None and not value.isprintable():
            raise ValueError("a profile name holds no control characters")
        return value

    def engine_values(self) -> dict[str, Any]:
        """The [engine] keys the file or the environment set (the rest stay the profile's or defaults)."""
        return self.engine.model_dump(exclude_unset=True)

    @property
    def serve_parallel(self) -> int:
        return self.engine.parallel if "parallel" in self.engine.model_fields_set else SERVE_PARALLEL


@dataclass(frozen=True)
class _Origin:
    """Where each value came from, so that an error names the file or the variable."""

    file: Path
    env: dict[tuple[str, ...], str]

    def of(self, loc: tuple[str, ...]) -> str:
        for n in range(len(loc), 0, -1):
            if loc[:n] in self.env:
                return f"${self.env[loc[:n]]}"
        return str(self.file)


def settings_path() -> Path:
    return resolve_paths().settings_file


def _read_text(path: Path) -> str | None:
    """The file's text, None when there is none. Only a regular file of at most MAX_SETTINGS_BYTES is
    read: opened without blocking and checked before a byte is read (a FIFO or /dev/zero never hangs)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(f"Cannot read the settings file {path}: {exc}.", "Make it a readable UTF-8 text file.") \
            from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConfigError(f"Cannot read the settings file {path}: it is not a regular file.",
                              "Make it a readable UTF-8 text file.")
        data = b""
        while len(data) <= MAX_SETTINGS_BYTES and (chunk := os.read(fd, MAX_SETTINGS_BYTES + 1 - len(data))):
            data += chunk
    except OSError as exc:
        raise ConfigError(f"Cannot read the settings file {path}: {exc}.", "Make it a readable UTF-8 text file.") \
            from exc
    finally:
        os.close(fd)
    if len(data) > MAX_SETTINGS_BYTES:
        raise ConfigError(f"The settings file {path} is over {MAX_SETTINGS_BYTES >> 20} MiB.",
                          "A settings file is a few lines of TOML: check that the path names the right file.")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"Cannot read the settings file {path}: {exc}.", "Make it a readable UTF-8 text file.") \
            from exc


def _read_file(path: Path) -> dict[str, Any]:
    text = _read_text(path)
    if text is None:
        return {}
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: {exc}.", "Fix the TOML syntax or delete the file.") from exc


def _field_model(model: type[BaseModel], key: str) -> type[BaseModel] | None:
    field = model.model_fields.get(key)
    ann = field.annotation if field else None
    return ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None


def _env_layer(environ: Mapping[str, str]) -> tuple[dict[str, Any], dict[tuple[str, ...], str]]:
    """LOCALSPEC_<TABLE>__<KEY>[__<KEY>] as nested tables; other LOCALSPEC_* variables are not settings."""
    layer: dict[str, Any] = {}
    names: dict[tuple[str, ...], str] = {}

    def put(loc: tuple[str, ...], value: Any, name: str) -> None:
        table = layer
        for part in loc[:-1]:
            table = table.setdefault(part, {})
        table[loc[-1]] = value
        names[loc] = name

    if environ.get(THREADS_ENV):
        put(("engine", "n_threads"), environ[THREADS_ENV], THREADS_ENV)
    if environ.get(PROFILE_ENV):
        put(("profile",), environ[PROFILE_ENV], PROFILE_ENV)
    for name in sorted(environ):
        parts = name[len(ENV_PREFIX):].lower().split("__") if name.startswith(ENV_PREFIX) else []
        if len(parts) < 2 or parts[0] not in Settings.model_fields or _field_model(Settings, parts[0]) is None:
            continue
        model: type[BaseModel] | None = Settings
        for part in parts[:-1]:
            model = _field_model(model, part) if model else None
        value: Any = environ[name]
        field = model.model_fields.get(parts[-1]) if model else None
        if field is not None and get_origin(field.annotation) is list:
            value = [v.strip() for v in value.split(",") if v.strip()]
        put(tuple(parts), value, name)
    return layer, names


def _merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        below = out.get(key)
        out[key] = _merge(below, value) if isinstance(below, dict) and isinstance(value, dict) else value
    return out


def _explain(exc: ValidationError, origin: _Origin) -> ConfigError:
    err = exc.errors()[0]
    loc = tuple(str(p) for p in err["loc"])
    key = ".".join(loc)
    where = origin.of(loc)
    if err["type"] == "extra_forbidden":
        parent: type[BaseModel] | None = Settings
        for part in loc[:-1]:
            parent = _field_model(parent, part) if parent else None
        known = sorted(parent.model_fields) if parent else []
        close = difflib.get_close_matches(loc[-1], known, n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        table = f"[{'.'.join(loc[:-1])}]" if len(loc) > 1 else "the top level"
        return ConfigError(f"{where}: unknown setting '{key}'.",
                           f"{hint}Remove it; {table} takes: {', '.join(known)}.")
    got = repr(err.get("input"))
    got = got if len(got) <= 80 else got[:77] + "..."
    fix = f"Correct or unset {where}." if where.startswith("$") else f"Correct or remove it in {where}."
    return ConfigError(f"{where}: setting '{key}': {err['msg']} (got {got}).",
                       f"{fix} docs/configuration.md lists each table.")


def load_settings(path: Path | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    """settings.toml (default: the config dir's), then the environment over it; checked."""
    path = path or settings_path()
    environ = os.environ if environ is None else environ
    data = _read_file(path)
    server = data.get("server")
    if isinstance(server, dict) and "api_key" in server:
        raise ConfigError(f"{path}: setting 'server.api_key' would keep the API key in clear in the settings file.",
                          "Remove it; put LOCALSPEC_API_KEY=... in the service's env file (mode 0600), or set "
                          "[server] api_key_file to a file of keys (mode 0600).")
    env, names = _env_layer(environ)
    merged = _merge(data, env)
    _refuse_engine_lora(merged, _Origin(path, names))
    try:
        settings = Settings.model_validate(merged)
    except ValidationError as exc:
        raise _explain(exc, _Origin(path, names)) from None
    return _anchor_paths(settings, path, names)


def _refuse_engine_lora(merged: Mapping[str, Any], origin: _Origin) -> None:
    """An adapter in [engine] would reach every engine (the router's small tier, the judge), whose
    base it was not trained on: it is named per run (--lora) or per model (models.toml `lora =`)."""
    engine = merged.get("engine")
    key = next((k for k in ("lora_path", "lora_scale") if isinstance(engine, dict) and k in engine), None)
    if key is not None:
        where = origin.of(("engine", key))
        raise ConfigError(f"{where}: setting 'engine.{key}' is not a setting: an adapter belongs to one model.",
                          "Remove it; give --lora PATH[:SCALE] to serve, generate or chat, or bind it to its model "
                          "with `lora = \"PATH[:SCALE]\"` in that entry of models.toml (docs/lora.md).")


_SERVER_PATHS = ("api_key_file", "ssl_certfile", "ssl_keyfile")


def _anchor_paths(settings: Settings, path: Path, from_env: Mapping[tuple[str, ...], str]) -> Settings:
    """A relative path in the file means beside the file, whatever directory a service starts in;
    `~` is the user's home. A path from the environment keeps the shell's meaning (the current directory)."""
    update: dict[str, Path] = {}
    for name in _SERVER_PATHS:
        value = getattr(settings.server, name)
        if value is None:
            continue
        value = value.expanduser()
        if not value.is_absolute() and ("server", name) not in from_env:
            value = path.absolute().parent / value
        update[name] = value
    if not update:
        return settings
    return settings.model_copy(update={"server": settings.server.model_copy(update=update)})


def write_profile(name: str, path: Path | None = None) -> Path:
    """Make `name` the active profile in settings.toml (the chat app's choice), keeping the rest of the
    file as it is: a top-level key goes before the first table, so it replaces or inserts one line there."""
    import json

    path = path or settings_path()
    try:
        Settings(profile=name)  # the same check as a hand-written value
    except ValidationError as exc:
        raise _explain(exc, _Origin(path, {})) from None
    text = _read_text(path) or ""
    _read_file(path)  # a broken file is refused, not rewritten
    line = f"profile = {json.dumps(name)}"  # a JSON string is a TOML basic string
    lines = text.splitlines()
    first_table = next((i for i, ln in enumerate(lines) if ln.lstrip().startswith("[")), len(lines))
    at = next((i for i in range(first_table) if lines[i].split("=", 1)[0].strip() == "profile"), None)
    if at is None:
        lines.insert(0, line)
    else:
        lines[at] = line
    eol = "\r\n" if "\r\n" in text else "\n"  # a file written on Windows keeps its line ends
    new = eol.join(lines) + eol
    try:
        same = tomllib.loads(new).get("profile") == name
    except tomllib.TOMLDecodeError:
        same = False
    if not same:  # e.g. a multi-line value that one line cannot replace
        raise ConfigError(f"Cannot set the profile in {path} without rewriting it.",
                          f"Set profile = {json.dumps(name)} at the top of {path} by hand.")
    target = path.resolve()  # a symlinked settings file (a dotfiles repository) keeps its link
    target.parent.mkdir(parents=True, exist_ok=True)
    _replace_text(target, new)
    return target


def _replace_text(target: Path, text: str) -> None:
    """Write `target` whole through a fresh temporary file beside it (mkstemp: never a planted name
    or link), keeping the file's permissions (a private 0600 file stays private)."""
    import tempfile

    try:
        mode: int | None = stat.S_IMODE(target.stat().st_mode)
    except FileNotFoundError:
        mode = None  # a new file stays mkstemp's 0600: only its user needs it
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            if mode is not None:
                os.fchmod(fh.fileno(), mode)
            fh.write(text.encode("utf-8"))
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def active_profile(explicit: str | None = None) -> str | None:
    """The profile a face uses: its --profile, else the settings' (None: the registry's default)."""
    return explicit or load_settings().profile


def checked_active_profile(explicit: str | None) -> str | None:
    """`active_profile`, with one from the settings refused now if the registry has no such profile,
    naming where it was set (an explicit --profile gets the registry's own error when it is used)."""
    profile = active_profile(explicit)
    if explicit is None:
        require_known_profile(profile)
    return profile


def require_known_profile(name: str | None) -> None:
    """Refuse the settings' profile (settings.toml's or $LOCALSPEC_PROFILE) when the registry has no such
    profile, saying where it was set: the registry's own error, raised later, names no file."""
    if name is None:
        return
    from localspec.errors import ModelNotFoundError
    from localspec.models.registry import load_registry

    try:
        registry = load_registry()
    except ConfigError:
        return  # a registry that cannot be read is refused by its next reader, naming its own file
    try:
        registry.profile(name)
    except ModelNotFoundError as exc:
        env = bool(os.environ.get(PROFILE_ENV))
        where = f"${PROFILE_ENV}" if env else str(settings_path())
        fix = f"Correct or unset {where}." if env else f"Correct or remove it in {where}."
        raise ConfigError(f"{where}: setting 'profile': {exc.cause}", f"{exc.fix} {fix}") from None
