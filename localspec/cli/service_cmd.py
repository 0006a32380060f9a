"""`localspec service install|uninstall|status`: run `localspec serve` as a user service.

Linux gets a systemd user unit, macOS a launchd agent. Secrets such as LOCALSPEC_API_KEY never go
into the unit: it reads them from an environment file (mode 0600) in the config directory.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape

from localspec.errors import LocalspecError
from localspec.paths import resolve_paths

UNIT_NAME = "localspec.service"
LAUNCHD_LABEL = "dev.localspec.serve"
ENV_FILE_NAME = "service.env"
_ENV_TEMPLATE = """\
# Environment for the localspec service (read by the systemd unit / launchd agent).
# Keep secrets here, not in the unit file. This file is private (mode 0600).
# LOCALSPEC_API_KEY=change-me
# LOCALSPEC_THREADS=8
"""


@dataclass(frozen=True)
class ServiceSpec:
    """What the service runs: `<localspec> serve --host H --port P [--profile NAME]`."""

    executable: list[str]  # absolute path of the localspec command (or python -m localspec)
    host: str = "127.0.0.1"
    port: int = 8000
    profile: str | None = None
    env_file: Path = Path()
    log_dir: Path = Path()

    @property
    def argv(self) -> list[str]:
        args = [*self.executable, "serve", "--host", self.host, "--port", str(self.port)]
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


def render_systemd(spec: ServiceSpec) -> str:
    exec_start = " ".join(_systemd_quote(a) for a in spec.argv)
    return (
        "[Unit]\n"
        "Description=localspec OpenAI-compatible endpoint (localspec serve)\n"
        "After=network.target\n\n"
        "[Service]\n"
        "Type=simple\n"
        f"ExecStart={exec_start}\n"
        # "-": a missing file is not an error; the key, if any, lives only there.
        f"EnvironmentFile=-{spec.env_file}\n"
        "Restart=on-failure\n"
        "RestartSec=5\n"
        "TimeoutStopSec=30\n\n"
        "[Install]\n"
        "WantedBy=default.target\n"
    )


def _systemd_quote(arg: str) -> str:
    if arg and all(c.isalnum() or c in "/._-:=+@," for c in arg):
        return arg
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_launchd(spec: ServiceSpec) -> str:
    # launchd cannot read an env file, so a POSIX shell sources it and then execs localspec.
    loader = 'set -a; [ -f "$0" ] && . "$0"; set +a; exec "$@"'
    argv = ["/bin/sh", "-c", loader, str(spec.env_file), *spec.argv]
    items = "\n".join(f"    <string>{escape(a)}</string>" for a in argv)
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
        f"  <key>StandardOutPath</key>\n  <string>{escape(str(spec.log_dir / 'serve.log'))}</string>\n"
        f"  <key>StandardErrorPath</key>\n  <string>{escape(str(spec.log_dir / 'serve.log'))}</string>\n"
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
            v.add_argument("--host", default="127.0.0.1")
            v.add_argument("--port", type=int, default=8000)
            v.add_argument("--profile", help="model profile for the server")
            v.add_argument("--no-start", action="store_true", help="write the unit but do not enable or start it")
        if verb == "uninstall":
            v.add_argument("--no-stop", action="store_true", help="remove the unit file without calling the manager")
        v.set_defaults(func={"install": cmd_install, "uninstall": cmd_uninstall, "status": cmd_status}[verb])


def _spec(args: argparse.Namespace) -> ServiceSpec:
    paths = resolve_paths()
    return ServiceSpec(executable=localspec_command(), host=args.host, port=args.port, profile=args.profile,
                       env_file=paths.config_dir / ENV_FILE_NAME, log_dir=paths.data_dir / "logs")


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


def cmd_install(args: argparse.Namespace) -> int:
    from localspec.server.settings import is_loopback

    spec = _spec(args)
    if not is_loopback(spec.host):
        print(f"note: binding {spec.host} needs LOCALSPEC_API_KEY; put it in {spec.env_file}")
    text = render_launchd(spec) if args.manager == "launchd" else render_systemd(spec)
    path = unit_path(args.manager)
    if args.dry_run:
        print(f"# would write {path}:\n{text}")
        print(f"# would create {spec.env_file} (mode 0600) if missing")
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        spec.log_dir.mkdir(parents=True, exist_ok=True)
        if not spec.env_file.exists():
            spec.env_file.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(spec.env_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(_ENV_TEMPLATE)
        print(f"wrote {path}\nsecrets (LOCALSPEC_API_KEY): {spec.env_file}")
    if not args.no_start:
        _run(_commands(args.manager, "install", path), args.dry_run)
        print(f"serving at http://{spec.host}:{spec.port}/v1 once the models load")
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
    print(f"unit: {path} ({'installed' if path.exists() else 'not installed'})")
    if not path.exists():
        return 1
    cmds = _commands(args.manager, "status", path)
    if args.dry_run or shutil.which(cmds[0][0]) is None:
        print(f"(`{cmds[0][0]}` not run)" if not args.dry_run else "$ " + shlex.join(cmds[0]))
        return 0
    return subprocess.run(cmds[0], check=False).returncode
