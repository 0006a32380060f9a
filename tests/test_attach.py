"""One shared engine: `serve` announces itself in serve.json; `generate` and `chat` attach to it.

The servers here are the real app and uvicorn on loopback over the scripted tier (tests/fake_tier.py):
no model file is read, so what is asserted is the control flow of attaching, not a model's output.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys

from localspec import __version__
from localspec.attach.state import ServeState, read_state, state_path, write_state
from localspec.server import ServerSettings
from tests.fake_tier import scripted_app
from tests.server_harness import ServerThread


def test_serve_writes_its_state_file_0600_without_the_key_and_removes_it():
    settings = ServerSettings(api_key="sekrit-key-123")
    with ServerThread(scripted_app(settings=settings), announce=settings) as srv:
        path = state_path()
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        found = read_state()
        assert found is not None
        assert (found.pid, found.port, found.version, found.keyed) == (os.getpid(), srv.port, __version__, True)
        assert found.url == srv.base_url
        assert "sekrit" not in path.read_text()  # the key stays where it was given
    assert not path.exists()


def test_a_state_file_whose_process_is_gone_is_ignored():
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    write_state(ServeState(pid=int(dead.stdout), host="127.0.0.1", port=8123, version=__version__))
    assert read_state() is None
    write_state(ServeState(pid=os.getpid(), host="127.0.0.1", port=8123, version=__version__))
    assert read_state() is not None  # the same file, its process alive: read (the port is probe's check)


def test_a_state_file_others_may_write_is_ignored():
    path = write_state(ServeState(pid=os.getpid(), host="127.0.0.1", port=8123, version=__version__))
    path.chmod(0o666)
    assert read_state() is None
    path.write_text("{not json")
    path.chmod(0o600)
    assert read_state() is None
