"""`localspec doctor`: the llama.cpp build, GPU, settings, models, paths and port, each problem with its fix.

Exit status 0 when nothing is wrong (a missing optional part, such as the embedding model, is a
warning), 1 when a problem was found."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from localspec.errors import ConfigError, LocalspecError, UsageError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("doctor", help="check the install: llama.cpp build, GPU, settings, models, paths, port",
                       description=__doc__)
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.add_argument("--verify", action="store_true", help="re-hash installed model files (slow for large models)")
    p.add_argument("--host", help="address whose port to check (default: settings.toml's [server] host, else "
                                  "127.0.0.1)")
    p.add_argument("--port", type=int, help="port `localspec serve` would use (default: settings.toml's [server] "
                                            "port, else 8000)")
    p.add_argument("--calibration", action="store_true",
                   help="show the cost curves mode auto works from: age, origin, what it learned")
    p.add_argument("--reset", action="store_true",
                   help="with --calibration: remove the curves (re-measured at the next load)")
    p.set_defaults(func=run)


def run_calibration(args: argparse.Namespace) -> int:
    from localspec.cli.calibration_view import curve_files, describe, render
    from localspec.service import calibration_dir

    directory = Path(calibration_dir())
    files = curve_files(directory)
    if args.reset:
        for f in files:
            f.path.unlink(missing_ok=True)
        removed = [str(f.path) for f in files]
        print(json.dumps({"removed": removed}) if args.json else
              f"removed {len(removed)} cost curve(s) from {directory}; the next process to load mode auto "
              "re-measures (a running server keeps its own curve until it restarts)")
        return 0
    infos = [describe(f) for f in files]
    if args.json:
        print(json.dumps({"directory": str(directory), "curves": infos}, indent=2))
    elif not infos:
        print(f"no cost curves in {directory}: mode auto measures one at its first load")
    else:
        print("\n\n".join(render(i) for i in infos))
    return 0


def run(args: argparse.Namespace) -> int:
    if args.reset and not args.calibration:  # deleting learned curves takes the flag its help names
        raise UsageError("--reset removes the calibration curves, and only with --calibration.",
                         "Run `localspec doctor --calibration --reset`.")
    if args.calibration:
        return run_calibration(args)
    from localspec.doctor import diagnose, render_text

    host, port, settings_file = _served_address(args.host, args.port)
    try:
        report = diagnose(verify=args.verify, host=host, port=port)
    except UsageError as exc:  # the address came from settings.toml, not from a flag: say so
        if settings_file is None:
            raise
        raise ConfigError(f"{settings_file}: [server] host {host!r}, port {port}: {exc.cause.split(': ', 1)[-1]}",
                          "Correct it, or give --host and --port to check another address.") from None
    if args.json:
        print(json.dumps(report.to_dict(), indent=2, default=str))
    else:
        print(render_text(report))
    return 1 if report.problems else 0


def _served_address(host: str | None, port: int | None) -> tuple[str, int, Path | None]:
    """The address `localspec serve` would bind: each flag, else the settings', else the default, and the
    settings file when it gave either. The port checked was 8000 whatever [server] port said. Settings
    that do not load are the report's problem."""
    from localspec.doctor import DEFAULT_HOST, DEFAULT_PORT
    from localspec.settings import load_settings, settings_path

    given = None
    if host is None or port is None:
        try:
            server = load_settings().server
            given = settings_path() if (host is None and server.host != DEFAULT_HOST) or (
                port is None and server.port != DEFAULT_PORT) else None
            host, port = host or server.host, server.port if port is None else port
        except LocalspecError:
            pass
    return host or DEFAULT_HOST, DEFAULT_PORT if port is None else port, given
