"""`<data dir>/serve.json`: where a running `localspec serve` listens, and what it serves.

Written once the port is bound (so `--port 0` records the real port), mode 0600 and atomically
(a reader never sees half a file), and removed on a clean exit. A file left by a server that died
is recognised as stale by its pid, and by the port not answering as localspec (`probe`).

The API key itself is never written: a key given on the command line or in the environment stays
there, and a key file is named by its path, which is already owner-only (0600, `read_key_file`
refuses anything wider). One copy of a secret is one fewer to leak through backups or a shared
data directory, and the file outlives a crashed server.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from localspec.paths import resolve_paths

STATE_NAME = "serve.json"
_MAX_BYTES = 64 << 10  # a state file is a few hundred bytes: anything bigger is not ours


@dataclass(frozen=True)
class ServeState:
    pid: int
    host: str
    port: int
    version: str
    scheme: str = "http"
    profile: str | None = None
    target: str | None = None
    draft: str | None = None
    keyed: bool = False  # the server wants a Bearer key
    api_key_file: str | None = None  # where the key is, when it came from a file

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "", "localhost") else self.host
        host = f"[{host}]" if ":" in host and not host.startswith("[") else host
        return f"{self.scheme}://{host}:{self.port}"


class _StateFile(BaseModel):
    """The file as read back: untrusted (any local user's process may have written the directory)."""

    model_config = ConfigDict(extra="ignore")

    pid: int = Field(gt=0)
    host: str = Field(min_length=1, max_length=255)
    port: int = Field(gt=0, le=65535)
    version: str = Field(max_length=64)
    scheme: str = Field("http", pattern="^https?$")
    profile: str | None = Field(None, max_length=255)
    target: str | None = Field(None, max_length=255)
    draft: str | None = Field(None, max_length=255)
    keyed: bool = False
    api_key_file: str | None = Field(None, max_length=4096)


def state_path() -> Path:
    return resolve_paths().data_dir / STATE_NAME


def write_state(state: ServeState, path: Path | None = None) -> Path:
    """Write atomically: a temporary file created 0600 in the same folder, then renamed over."""
    path = path or state_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".serve-", suffix=".json", dir=path.parent)  # mkstemp creates it 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(asdict(state), f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def read_state(path: Path | None = None) -> ServeState | None:
    """The recorded server, or None: no file, not ours (unparseable, too big, writable by others),
    or its process is gone. Whether the port answers as localspec is `probe`'s check."""
    path = path or state_path()
    try:
        st = path.stat()
        if st.st_size > _MAX_BYTES or st.st_mode & 0o022 or st.st_uid != os.getuid():
            return None
        parsed = _StateFile.model_validate_json(path.read_bytes())
    except (OSError, ValidationError):
        return None
    if not pid_alive(parsed.pid):
        return None
    return ServeState(**parsed.model_dump())


def remove_state(pid: int, path: Path | None = None) -> None:
    """Remove the file if it is still this server's (a second server may have written its own since)."""
    path = path or state_path()
    try:
        parsed = _StateFile.model_validate_json(path.read_bytes())
    except (OSError, ValidationError):
        return
    if parsed.pid == pid:
        with contextlib.suppress(OSError):
            path.unlink()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, another user's: the port check decides
    except OSError:
        return False
    return True
