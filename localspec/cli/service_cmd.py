"""`localspec service install|uninstall|status`: run `localspec serve` as a user service.

Linux gets a systemd user unit, macOS a launchd agent. Secrets such as LOCALSPEC_API_KEY never go
into the unit: it reads them from an environment file (mode 0600) in the config directory.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from typing import TYPE_CHECKING, Literal

from localspec.errors import ConfigError, LocalspecError, UsageError
from localspec.paths import resolve_paths

if TYPE_CHECKING:
    from localspec.settings import Settings

UNIT_NAME = "localspec.service"
LAUNCHD_LABEL = "dev.localspec.serve"
ENV_FILE_NAME = "service.env"
API_KEY_ENV = "LOCALSPEC_API_KEY"
_ENV_TEMPLATE = """\
# Environment for the localspec service (read by the systemd unit / launchd agent).
# Keep secrets here, not in the unit file. This file is private (mode 0600).
# Other settings belong in settings.toml ([server], [engine], [cache]...), which the service reads too.
# LOCALSPEC_API_KEY=change-me
# LOCALSPEC_THREADS=8
"""


@dataclass(frozen=True)
class ServiceSpec:
    """What the service runs: `<localspec> serve --settings FILE [--host H] [--port P] [--profile NAME]`.

    Everything else comes from that settings file ([server], [engine], [cache], [router], `profile`)
    and the environment file, so a later edit of either needs a restart, not a new unit; only what
    `service install` was told explicitly becomes a flag."""

    executable: list[str]  # absolute path of the localspec command (or python -m localspec)
    host: str | None = None
    port: int | None = None
    profile: str | None = None
    env_file: Path = Path()
    log_dir: Path = Path()
    settings_file: Path | None = None
    manager: Literal["systemd", "launchd"] = "systemd"  # who reads the environment file, and how

    @property
    def argv(self) -> list[str]:
        args = [*self.executable, "serve"]
        args += ["--settings", str(self.settings_file)] if self.settings_file else []
        args += ["--host", self.host] if self.host is not None else []
        args += ["--port", str(self.port)] if self.port is not None else []
        return args + (["--profile", self.profile] if self.profile else [])


def localspec_command() -> list[str]:
    """The absolute command that runs this localspec: the console script beside this Python."""
    script = Path(sys.executable).parent / ("localspec.exe" if os.name == "nt" else "localspec")
    if script.is_file():
        return [str(script.absolute())]
    found = shutil.which("localspec")
    if found:
        return [str(Path(found).absolute())]
    return [str(Path(sys.executable).absolute()), "-m", "localspec"]


class UnitValueError(LocalspecError):
    """A value (a path, --host, --profile) that a unit file cannot carry."""


def render_systemd(spec: ServiceSpec) -> str:
    exec_start = " ".join(systemd_exec_word(a) for a in spec.argv)
    return (
        "[Unit]\n"
        "Description=localspec OpenAI-compatible endpoint (localspec serve)\n"
        "After=network.target\n\n"
        "[Service]\n"
        "Type=simple\n"
        f"ExecStart={exec_start}\n"
        # "-": a missing file is not an error; the key, if any, lives only there.
        f"EnvironmentFile=-{systemd_path(spec.env_file)}\n"
        "Restart=on-failure\n"
        "RestartSec=5\n"
        "TimeoutStopSec=30\n\n"
        "[Install]\n"
        "WantedBy=default.target\n"
    )


# C escapes that systemd's command-line parser knows (systemd.service(5), "Command lines").
_SYSTEMD_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r", "\a": "\\a",
                    "\b": "\\b", "\f": "\\f", "\v": "\\v"}
_SYSTEMD_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/._-:=+@,")


def _check_text(value: str, what: str) -> None:
    if any(0xD800 <= ord(c) <= 0xDFFF for c in value):
        raise UnitValueError(f"{what} {value!r} is not valid text (undecodable bytes), so no unit file can name it.",
                             "Use a name or path made of valid UTF-8.")


def systemd_exec_word(arg: str) -> str:
    """One ExecStart= word that systemd reads back as exactly `arg`: double-quoted with C escapes,
    "%%" for a literal "%" (specifiers) and "$$" for a literal "$" (variable expansion)."""
    _check_text(arg, "The argument")
    if arg and all(c in _SYSTEMD_PLAIN for c in arg):
        return arg
    out = []
    for c in arg:
        if c in _SYSTEMD_ESCAPES:
            out.append(_SYSTEMD_ESCAPES[c])
        elif ord(c) < 0x20 or ord(c) == 0x7F:
            out.append(f"\\x{ord(c):02x}")
        elif c in "%$":
            out.append(c * 2)
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def systemd_path(path: Path) -> str:
    """A path for EnvironmentFile=, which resolves specifiers ("%%" for "%") but takes the rest of
    the line as it stands: no quotes, no escapes, so no way to write a line break."""
    text = str(path)
    _check_text(text, "The path")
    if "\n" in text or "\r" in text or text != text.strip():  # a line break would end the setting there
        raise UnitValueError(f"The path {text!r} holds a line break or an edge space, which a systemd unit cannot "
                             "carry in EnvironmentFile=.",
                             "Set LOCALSPEC_HOME (or XDG_CONFIG_HOME) to a plain directory and run this again.")
    return text.replace("%", "%%")


def plist_string(value: str) -> str:
    """XML text for a plist <string>: &, < and > escaped, a carriage return as a character reference
    (XML would turn it into a newline); other control characters have no XML form at all."""
    _check_text(value, "The value")
    bad = [c for c in value if (ord(c) < 0x20 and c not in "\t\n\r") or ord(c) in (0xFFFE, 0xFFFF)]
    if bad:
        raise UnitValueError(f"{value!r} holds a control character that a launchd plist (XML) cannot carry.",
                             "Use a value without control characters.")
    return html.escape(value, quote=False).replace("\r", "&#13;")


def render_launchd(spec: ServiceSpec) -> str:
    # launchd cannot read an env file, so a POSIX shell sources it and then execs localspec.
    loader = 'set -a; [ -f "$0" ] && . "$0"; set +a; exec "$@"'
    argv = ["/bin/sh", "-c", loader, str(spec.env_file), *spec.argv]
    items = "\n".join(f"    <string>{plist_string(a)}</string>" for a in argv)
    log = plist_string(str(spec.log_dir / "serve.log"))
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        '<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">\n'
        '<plist version="1.0">\n<dict>\n'
        f"  <key>Label</key>\n  <string>{LAUNCHD_LABEL}</string>\n"
        f"  <key>ProgramArguments</key>\n  <array>\n{items}\n  </array>\n"
        "  <key>RunAtLoad</key>\n  <true/>\n"
        # Restart after a crash, not after a clean exit.
        "  <key>KeepAlive</key>\n  <dict>\n    <key>SuccessfulExit</key>\n    <false/>\n  </dict>\n"
        "  <key>ThrottleInterval</key>\n  <integer>5</integer>\n"
        f"  <key>StandardOutPath</key>\n  <string>{log}</string>\n"
        f"  <key>StandardErrorPath</key>\n  <string>{log}</string>\n"
        "</dict>\n</plist>\n"
    )


def default_manager() -> str:
    return "launchd" if sys.platform == "darwin" else "systemd"


def unit_path(manager: str) -> Path:
    if manager == "launchd":
        return Path.home() / "Library" / "LaunchAgents" / f"{LAUNCHD_LABEL}.plist"
    config_home = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return config_home / "systemd" / "user" / UNIT_NAME


def _commands(manager: str, action: str, path: Path) -> list[list[str]]:
    if manager == "systemd":
        return {
            "install": [["systemctl", "--user", "daemon-reload"],
                        ["systemctl", "--user", "enable", "--now", UNIT_NAME]],
            "uninstall": [["systemctl", "--user", "disable", "--now", UNIT_NAME]],
            "after-uninstall": [["systemctl", "--user", "daemon-reload"]],
            "status": [["systemctl", "--user", "status", "--no-pager", UNIT_NAME]],
        }[action]
    return {
        "install": [["launchctl", "load", "-w", str(path)]],
        "uninstall": [["launchctl", "unload", "-w", str(path)]],
        "after-uninstall": [],
        "status": [["launchctl", "list", LAUNCHD_LABEL]],
    }[action]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("service", help="run `localspec serve` as a user service (systemd / launchd)",
                       description=__doc__)
    verbs = p.add_subparsers(dest="verb", metavar="VERB")
    p.set_defaults(func=lambda args: (p.print_help(), 0)[1])
    for verb, helptext in (("install", "write the unit and start it"), ("uninstall", "stop it and remove the unit"),
                           ("status", "show whether it is installed and running")):
        v = verbs.add_parser(verb, help=helptext)
        v.add_argument("--manager", choices=("systemd", "launchd"), default=default_manager(),
                       help="service manager (default: launchd on macOS, else systemd)")
        v.add_argument("--dry-run", action="store_true", help="print the file and commands; change nothing")
        if verb == "install":
            v.add_argument("--host", help="address to serve on, baked into the unit (default: [server] host of "
                                          "settings.toml); any but loopback needs LOCALSPEC_API_KEY in the env file")
            v.add_argument("--port", type=int, help="port to serve on, baked into the unit (default: [server] port)")
            v.add_argument("--profile", help="model profile, baked into the unit (default: settings.toml's profile)")
            v.add_argument("--no-start", action="store_true", help="write the unit but do not enable or start it")
        if verb == "uninstall":
            v.add_argument("--no-stop", action="store_true", help="remove the unit file without calling the manager")
        if verb == "status":
            v.add_argument("--json", action="store_true", help="print the unit's path and whether it is installed")
        v.set_defaults(func={"install": cmd_install, "uninstall": cmd_uninstall, "status": cmd_status}[verb])


def _spec(args: argparse.Namespace) -> ServiceSpec:
    paths = resolve_paths()
    return ServiceSpec(executable=localspec_command(), host=args.host, port=args.port, profile=args.profile,
                       env_file=paths.config_dir / ENV_FILE_NAME, log_dir=paths.data_dir / "logs",
                       settings_file=paths.settings_file.absolute(), manager=args.manager)


def _run(cmds: list[list[str]], dry_run: bool, check: bool = True) -> None:
    for cmd in cmds:
        print("$ " + shlex.join(cmd))
        if dry_run:
            continue
        if shutil.which(cmd[0]) is None and not check:
            print(f"  (skipped: `{cmd[0]}` is not on PATH)")
            continue
        if shutil.which(cmd[0]) is None:
            raise LocalspecError(f"`{cmd[0]}` is not on PATH, so the service cannot be managed here.",
                                 "Use --no-start to only write the unit, or run on a host with "
                                 f"{'systemd' if cmd[0] == 'systemctl' else 'launchd'}.")
        result = subprocess.run(cmd, check=False)
        if check and result.returncode != 0:
            raise LocalspecError(f"`{shlex.join(cmd)}` failed with exit status {result.returncode}.",
                                 "See its message above; `localspec service status` shows the unit's state.")


def env_file_values(env_file: Path, manager: str = "systemd") -> dict[str, str]:
    """The variables the environment file sets (KEY=VALUE lines, quotes allowed). systemd's
    EnvironmentFile skips an `export KEY=...` line, so on systemd one is refused rather than listed
    as a setting the unit would never get; launchd's shell sources the file, where `export` works."""
    if not env_file.is_file():
        return {}
    values: dict[str, str] = {}
    for n, line in enumerate(env_file.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        head, sep, value = line.partition("=")
        words = head.split()
        if len(words) == 2 and words[0] == "export":
            if manager == "systemd":  # the value may be a secret: never shown
                raise ConfigError(f"{env_file}:{n}: `export {words[1]}=...` is skipped by systemd's EnvironmentFile.",
                                  f"Write it as {words[1]}=... (without `export`).")
            head = words[1]
        if sep:
            values[head.strip()] = value.strip().strip("'\"").strip()
    return values


def env_file_sets_key(env_file: Path, manager: str = "systemd") -> bool:
    """Whether the environment file gives LOCALSPEC_API_KEY a value."""
    return bool(env_file_values(env_file, manager).get(API_KEY_ENV))


def service_settings(spec: ServiceSpec) -> Settings:
    """The settings the service will run with: its settings file under the environment file's variables
    (not this shell's: the service never sees them)."""
    from localspec.settings import load_settings

    return load_settings(spec.settings_file, environ=env_file_values(spec.env_file, spec.manager))


def describe_server(spec: ServiceSpec, settings: Settings) -> list[str]:
    """Every [server] setting the service runs with, one comment line each; the key is never shown."""
    flags = {"host": spec.host, "port": spec.port}
    lines = [f"# the service reads {spec.settings_file} and {spec.env_file}; its [server] settings:"]
    for name, value in settings.server.model_dump().items():
        if flags.get(name) is not None:
            value, origin = flags[name], "  (flag in the unit)"
        else:
            origin = ""
        shown = "unset" if value is None else json.dumps(str(value) if isinstance(value, Path) else value)
        lines.append(f"#   {name} = {shown}{origin}")
    profile = spec.profile or settings.profile
    lines.append(f"#   profile = {json.dumps(profile) if profile else 'unset (the registry default)'}")
    key = "set there" if env_file_sets_key(spec.env_file, spec.manager) else "not set"
    lines.append(f"#   {API_KEY_ENV}: {key} (read from {spec.env_file}; never shown)")
    return lines


def check_env_file_private(env_file: Path) -> None:
    """Refuse an environment file that other users can read or write: it holds the API key."""
    if not env_file.exists():
        return
    mode = stat.S_IMODE(env_file.stat().st_mode)
    if mode & 0o077:
        raise ConfigError(f"{env_file} is open to other users (mode {mode:04o}), "
                          "and it is where the service's API key lives.",
                          f"Run `chmod 600 {shlex.quote(str(env_file))}`; change the key if others may have read it.")


def _create_env_file(env_file: Path) -> None:
    if env_file.exists():
        return
    env_file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(env_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(_ENV_TEMPLATE)


def _require_key(spec: ServiceSpec, host: str, dry_run: bool) -> None:
    """A unit reachable from the network without a key would only crash-loop: `serve` refuses to
    listen there without one. Refuse it here, with the fix, instead."""
    from localspec.server.settings import is_loopback

    if is_loopback(host) or env_file_sets_key(spec.env_file, spec.manager):
        return
    if service_settings(spec).server.api_key_file:
        return
    if not dry_run:
        _create_env_file(spec.env_file)  # so that the fix is one line in an existing private file
    where = f"{spec.env_file} ({'create it with' if dry_run else 'created,'} mode 0600)"
    raise UsageError(f"Refusing a service on {host} without an API key: `localspec serve` would refuse to "
                     "start there, and restart every 5 s.",
                     f"Put {API_KEY_ENV}=<a long random key> in {where} and run this again, or use --host 127.0.0.1.")


def _require_servable(spec: ServiceSpec) -> None:
    """The unit's --port and --profile checked as `serve` checks them (its ServerSettings, the registry's
    profiles): a value `serve` refuses would only restart every 5 s. Refuse it here, with the fix."""
    from localspec.cli.options import checked_flags
    from localspec.server.settings import ServerSettings

    if spec.port is not None:
        with checked_flags("service install"):
            ServerSettings(port=spec.port)
    if spec.profile is not None:
        from localspec.models import ModelManager

        ModelManager().profile(spec.profile)  # `serve`'s own error: the unknown name and the known ones


def cmd_install(args: argparse.Namespace) -> int:
    spec = _spec(args)
    # Everything that can refuse comes before anything is written.
    text = render_launchd(spec) if args.manager == "launchd" else render_systemd(spec)
    check_env_file_private(spec.env_file)
    settings = service_settings(spec)  # a bad settings file is refused now, not in a restart loop
    host = spec.host or settings.server.host
    port = spec.port if spec.port is not None else settings.server.port
    _require_servable(spec)
    _require_key(spec, host, args.dry_run)
    path = unit_path(args.manager)
    if args.dry_run:
        print(f"# would write {path}:\n{text}")
        print(f"# would create {spec.env_file} (mode 0600) if missing")
        print("\n".join(describe_server(spec, settings)))
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        spec.log_dir.mkdir(parents=True, exist_ok=True)
        _create_env_file(spec.env_file)
        print(f"wrote {path}\nsecrets ({API_KEY_ENV}): {spec.env_file}")
        print("\n".join(describe_server(spec, settings)))
    if not args.no_start:
        _run(_commands(args.manager, "install", path), args.dry_run)
        print(f"serving at http://{host}:{port}/v1 once the models load")
    return 0


def cmd_uninstall(args: argparse.Namespace) -> int:
    path = unit_path(args.manager)
    if not path.exists() and not args.dry_run:
        raise LocalspecError(f"No localspec service unit at {path}.", "Nothing to uninstall.")
    if not args.no_stop:
        _run(_commands(args.manager, "uninstall", path), args.dry_run, check=False)  # may already be stopped
    if args.dry_run:
        print(f"# would remove {path}")
    else:
        path.unlink()
        print(f"removed {path} (the environment file in the config directory is kept)")
    if not args.no_stop:
        _run(_commands(args.manager, "after-uninstall", path), args.dry_run, check=False)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    path = unit_path(args.manager)
    if args.json:
        print(json.dumps({"manager": args.manager, "unit": str(path), "installed": path.exists()}))
        return 0 if path.exists() else 1
    print(f"unit: {path} ({'installed' if path.exists() else 'not installed'})")
    if not path.exists():
        return 1
    cmds = _commands(args.manager, "status", path)
    if args.dry_run or shutil.which(cmds[0][0]) is None:
        print(f"(`{cmds[0][0]}` not run)" if not args.dry_run else "$ " + shlex.join(cmds[0]))
        return 0
    return subprocess.run(cmds[0], check=False).returncode
