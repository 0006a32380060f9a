"""`localspec service install`: units that say exactly what they mean, and no unit that cannot work.

systemd's own parser checks the unit where `systemd-analyze` is installed: its debug dump of the
loaded unit shows the command line and environment file as systemd read them. launchd plists are
read back with plistlib.
"""

from __future__ import annotations

import json
import os
import plistlib
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from localspec.cli import main
from localspec.cli.service_cmd import ServiceSpec, UnitValueError, render_launchd, render_systemd
from tests.common import TARGET_ID

# Values a user or a path can bring: systemd specifiers and variables, quotes, escapes, spaces,
# a lone semicolon (systemd's command separator), control characters, non-ASCII text.
AWKWARD = ["100%", "%h", "$HOME", "${USER}", "a b", 'say "hi"', "it's", "back\\slash", ";", "tab\there",
           "new\nline", "bell\x07", "del\x7f", "é ü", "`cmd`", "--flag=x y"]

needs_systemd = pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")


def _spec(tmp_path: Path, *, executable: str | None = None, profile: str | None = None,
          env_file: Path | None = None) -> ServiceSpec:
    return ServiceSpec(executable=[executable or "/usr/bin/localspec"], host="127.0.0.1", port=8123, profile=profile,
                       env_file=env_file or tmp_path / "service.env", log_dir=tmp_path / "logs")


def _unquote_systemd_dump(line: str) -> list[str]:
    """The words of systemd's "Command Line:" dump (shell-style quoting with C escapes)."""
    words, i = [], 0
    simple = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "f": "\f", "v": "\v"}
    while i < len(line):
        if line[i] == " ":
            i += 1
            continue
        if line[i] != '"':
            j = line.find(" ", i)
            j = len(line) if j < 0 else j
            words.append(line[i:j])
            i = j
            continue
        i += 1
        word = []
        while line[i] != '"':
            c = line[i]
            if c != "\\":
                word.append(c)
                i += 1
                continue
            nxt = line[i + 1]
            if nxt in simple:
                word.append(simple[nxt])
                i += 2
            elif nxt.isdigit():
                word.append(chr(int(line[i + 1:i + 4], 8)))
                i += 4
            else:  # \\ \" \$ \`
                word.append(nxt)
                i += 2
        words.append("".join(word))
        i += 1
    return words


def _systemd_expands(word: str) -> str:
    """What the program receives for a dumped word: systemd expands $NAME and ${NAME} when it starts
    the command (shown here as <$NAME>, never the literal text) and turns "$$" into "$"."""
    return re.sub(r"\$\$|\$\{?[A-Za-z_][A-Za-z0-9_]*\}?", lambda m: "$" if m.group() == "$$" else f"<{m.group()}>", word)


def _systemd_reads(unit_text: str, tmp_path: Path) -> tuple[list[str], str]:
    """What systemd reads from the unit: the ExecStart words and the EnvironmentFile setting."""
    unit = tmp_path / "localspec.service"
    unit.write_text(unit_text, encoding="utf-8")
    proc = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)], capture_output=True, text=True,
                          env={**os.environ, "SYSTEMD_LOG_LEVEL": "debug"}, timeout=60, cwd=tmp_path)
    log = proc.stdout + proc.stderr
    complaints = [ln for ln in log.splitlines() if re.search(r"localspec\.service:\d+:", ln)]
    assert not complaints, complaints  # unknown escapes, bad specifiers, an unparsable line
    command = re.search(r"Command Line: (.*)", log)
    env_file = re.search(r"EnvironmentFile: (.*)", log)
    assert command and env_file, log[-2000:]
    return _unquote_systemd_dump(command.group(1)), env_file.group(1)


@needs_systemd
def test_systemd_reads_back_exactly_the_arguments_and_env_file(tmp_path):
    exe_dir = tmp_path / "my env %x $y"
    exe_dir.mkdir()
    exe = exe_dir / "localspec"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    env_dir = tmp_path / "conf 100% \\ \t $x"  # taken as it stands, but for "%%"
    for value in AWKWARD:
        spec = _spec(tmp_path, executable=str(exe), profile=value, env_file=env_dir / "service.env")
        words, env_file = _systemd_reads(render_systemd(spec), tmp_path)
        # The dump shows "%" specifiers resolved and "$" not yet expanded.
        assert [_systemd_expands(w) for w in words] == spec.argv, value
        assert env_file == f"-{env_dir / 'service.env'}"


def test_systemd_refuses_an_env_file_path_it_cannot_carry(tmp_path):
    for bad in ("conf\nExecStartPre=/bin/evil", "carriage\rreturn"):
        with pytest.raises(UnitValueError, match="cannot carry"):
            render_systemd(_spec(tmp_path, env_file=tmp_path / bad / "service.env"))


def test_launchd_plist_reads_back_exactly(tmp_path):
    for value in [*AWKWARD, "carriage\rreturn", "<tag> & </string>"]:
        if any(ord(c) < 0x20 and c not in "\t\n\r" for c in value):
            with pytest.raises(UnitValueError, match="control character"):
                render_launchd(_spec(tmp_path, profile=value))
            continue
        spec = _spec(tmp_path, profile=value, env_file=tmp_path / value.replace("/", "_") / "service.env")
        plist = plistlib.loads(render_launchd(spec).encode())
        assert plist["ProgramArguments"][3] == str(spec.env_file) and plist["ProgramArguments"][4:] == spec.argv


def _home(tmp_path: Path, monkeypatch) -> tuple[Path, Path]:
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.delenv("LOCALSPEC_API_KEY", raising=False)
    unit = tmp_path / "user" / ".config" / "systemd" / "user" / "localspec.service"
    return unit, Path(os.environ["LOCALSPEC_HOME"]) / "config" / "service.env"


def _overlay_profile(name: str) -> None:
    """A profile of that name in the registry overlay: install refuses a profile `serve` does not know."""
    overlay = Path(os.environ["LOCALSPEC_HOME"]) / "config" / "models.toml"
    overlay.parent.mkdir(parents=True, exist_ok=True)
    overlay.write_text(f'[profiles.{json.dumps(name)}]\ntarget = "{TARGET_ID}"\n', encoding="utf-8")


def test_dry_run_prints_the_escaped_unit_and_writes_nothing(tmp_path, monkeypatch, capsys):
    unit, env_file = _home(tmp_path, monkeypatch)
    _overlay_profile("100% $HOME")
    assert main(["service", "install", "--dry-run", "--profile", "100% $HOME"]) == 0
    out = capsys.readouterr().out
    assert 'ExecStart=' in out and '--profile "100%% $$HOME"' in out
    assert not unit.exists() and not env_file.exists()


def test_install_writes_the_unit_and_a_private_env_file(tmp_path, monkeypatch, capsys):
    unit, env_file = _home(tmp_path, monkeypatch)
    _overlay_profile("a b%")
    assert main(["service", "install", "--no-start", "--profile", "a b%"]) == 0
    assert '--profile "a b%%"' in unit.read_text()
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600


@pytest.mark.parametrize("flags, code, says", [
    (["--port", "99999"], 2, "error: Invalid port: Input should be less than or equal to 65535."),
    (["--port", "-1"], 2, "error: Invalid port: Input should be greater than or equal to 0."),
    (["--profile", "nope"], 1, "error: Unknown profile 'nope'."),
])
def test_a_port_or_profile_serve_refuses_is_refused_before_anything_is_written(tmp_path, monkeypatch, capsys,
                                                                              flags, code, says):
    unit, env_file = _home(tmp_path, monkeypatch)
    assert main(["service", "install", "--dry-run", *flags]) == code
    assert main(["service", "install", "--no-start", *flags]) == code
    assert capsys.readouterr().err.splitlines()[-2] == says
    assert not unit.exists() and not env_file.exists()


def test_non_loopback_without_a_key_is_refused_before_anything_is_written(tmp_path, monkeypatch, capsys):
    unit, env_file = _home(tmp_path, monkeypatch)
    monkeypatch.setenv("LOCALSPEC_API_KEY", "in-the-shell-only")  # the service never sees this shell
    assert main(["service", "install", "--no-start", "--host", "0.0.0.0", "--dry-run"]) == 2
    assert not env_file.exists()  # a dry run creates nothing
    assert main(["service", "install", "--no-start", "--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-2].startswith("error: Refusing a service on 0.0.0.0 without an API key")
    assert err[-1].startswith("  fix: Put LOCALSPEC_API_KEY=") and str(env_file) in err[-1]
    assert not unit.exists()
    # The env file is ready for the key, private; with the key in it the unit is written, without it.
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    with env_file.open("a") as f:
        f.write("LOCALSPEC_API_KEY='sk-a-long-secret'\n")
    assert main(["service", "install", "--no-start", "--host", "0.0.0.0"]) == 0
    text = unit.read_text()
    assert "--host 0.0.0.0" in text and "sk-a-long-secret" not in text and f"EnvironmentFile=-{env_file}" in text


def test_a_commented_or_empty_key_is_no_key(tmp_path, monkeypatch, capsys):
    unit, env_file = _home(tmp_path, monkeypatch)
    env_file.parent.mkdir(parents=True)
    env_file.write_text("# LOCALSPEC_API_KEY=change-me\nLOCALSPEC_API_KEY=\n")
    env_file.chmod(0o600)
    assert main(["service", "install", "--no-start", "--host", "192.168.1.5"]) == 2
    assert not unit.exists()


def test_an_env_file_others_can_read_is_refused(tmp_path, monkeypatch, capsys):
    unit, env_file = _home(tmp_path, monkeypatch)
    env_file.parent.mkdir(parents=True)
    env_file.write_text("LOCALSPEC_API_KEY=k\n")
    env_file.chmod(0o644)
    assert main(["service", "install", "--no-start"]) == 1
    err = capsys.readouterr().err
    assert "mode 0644" in err and "chmod 600" in err
    assert not unit.exists()


# Each [server] setting with a value unlike its default, so that the dry run can only show it by reading the file.
_SERVER_VALUES = {"host": "127.0.0.1", "port": 9123, "api_key_file": "/srv/keys file", "allowed_hosts": ["h.local"],
                  "allowed_origins": ["https://o.example"], "ssl_certfile": "/srv/c.pem", "ssl_keyfile": "/srv/k.pem",
                  "model": "m-1", "draft_model": "d-1", "max_queue": 7, "max_tokens_cap": 777, "max_body_mb": 2.5,
                  "max_embedding_inputs": 33, "max_embedding_tokens": 4444, "retry_after_s": 9, "embeddings": False,
                  "keep_alive": "17m", "pull": False, "request_timeout_s": 45.5, "max_connections": 99}


def test_dry_run_carries_every_server_setting_and_no_key_in_clear(tmp_path, monkeypatch, capsys):
    import json

    from localspec.settings import ServerTable

    assert set(_SERVER_VALUES) == set(ServerTable.model_fields)  # a new [server] setting joins this test
    unit, env_file = _home(tmp_path, monkeypatch)
    settings = env_file.parent / "settings.toml"
    settings.parent.mkdir(parents=True)
    body = "\n".join(f"{k} = {json.dumps(v)}" for k, v in _SERVER_VALUES.items() if k != "max_queue")
    settings.write_text(f'profile = "p-9"\n[server]\n{body}\n')
    env_file.write_text("LOCALSPEC_API_KEY='sk-never-in-clear'\nLOCALSPEC_SERVER__MAX_QUEUE=7\n")
    env_file.chmod(0o600)
    monkeypatch.setenv("LOCALSPEC_SERVER__PORT", "1111")  # this shell's: the service never sees it
    assert main(["service", "install", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "sk-never-in-clear" not in out and not unit.exists()
    for key, value in _SERVER_VALUES.items():
        assert f"#   {key} = {json.dumps(value)}\n" in out, key
    assert '#   profile = "p-9"' in out and "LOCALSPEC_API_KEY: set there" in out
    # The unit reads the settings file; it bakes none of its values as flags.
    exec_start = next(line for line in out.splitlines() if line.startswith("ExecStart="))
    assert f"serve --settings {settings}" in exec_start
    assert not {"--host", "--port", "--profile", "--model"} & set(exec_start.split())
    # A flag given to `service install` is baked, and shown as such.
    assert main(["service", "install", "--dry-run", "--port", "9555"]) == 0
    out = capsys.readouterr().out
    assert "--port 9555" in out and "#   port = 9555  (flag in the unit)" in out


def test_a_bad_settings_file_is_refused_before_the_unit_is_written(tmp_path, monkeypatch, capsys):
    unit, env_file = _home(tmp_path, monkeypatch)
    env_file.parent.mkdir(parents=True)
    (env_file.parent / "settings.toml").write_text("[server]\nport = 99999\n")
    assert main(["service", "install", "--no-start"]) == 1
    assert "server.port" in capsys.readouterr().err and not unit.exists()


def test_a_non_loopback_host_from_the_settings_needs_a_key_too(tmp_path, monkeypatch, capsys):
    unit, env_file = _home(tmp_path, monkeypatch)
    env_file.parent.mkdir(parents=True)
    (env_file.parent / "settings.toml").write_text('[server]\nhost = "0.0.0.0"\n')
    assert main(["service", "install", "--no-start"]) == 2
    assert "Refusing a service on 0.0.0.0" in capsys.readouterr().err and not unit.exists()


def test_an_export_line_systemd_would_skip_is_refused_not_listed(tmp_path, monkeypatch, capsys):
    unit, env_file = _home(tmp_path, monkeypatch)
    env_file.parent.mkdir(parents=True)
    env_file.write_text("# mine\nexport LOCALSPEC_API_KEY=sk-never-in-clear\n")
    env_file.chmod(0o600)
    assert main(["service", "install", "--manager", "systemd", "--dry-run", "--host", "0.0.0.0"]) == 1
    err = capsys.readouterr().err
    assert f"{env_file}:2: `export LOCALSPEC_API_KEY=...` is skipped by systemd" in err
    assert "sk-never-in-clear" not in err and not unit.exists()
    # launchd's shell sources the file: there `export` sets the variable.
    assert main(["service", "install", "--manager", "launchd", "--dry-run", "--host", "0.0.0.0"]) == 0
    assert "LOCALSPEC_API_KEY: set there" in capsys.readouterr().out
