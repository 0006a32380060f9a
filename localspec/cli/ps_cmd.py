"""`localspec ps` (what the running server has loaded, like `ollama ps`) and `localspec stop MODEL`."""

from __future__ import annotations

import argparse
import json
import time
from typing import TYPE_CHECKING, Any

from localspec.cli.output import print_json, print_table
from localspec.errors import LocalspecError

if TYPE_CHECKING:
    from localspec.attach.probe import Server


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ps", help="list the models the running server has loaded", description=__doc__)
    p.add_argument("--api-key", help="the server's key (default: $LOCALSPEC_API_KEY, else its key file)")
    p.add_argument("--json", action="store_true", help="print the server's /v1/ps report as JSON")
    p.set_defaults(func=run_ps)
    s = sub.add_parser("stop", help="unload a model the running server has loaded (the next request naming it "
                                    "loads it again)",
                       description=__doc__)
    s.add_argument("model", help="a model name the server serves: the profile's (its models unload together) or "
                                 "one loaded on demand")
    s.add_argument("--api-key", help="the server's key (default: $LOCALSPEC_API_KEY, else its key file)")
    s.set_defaults(func=run_stop)


def _server(args: argparse.Namespace) -> Server:
    from localspec.attach.probe import Server, Want, find_server

    found = find_server(Want(api_key=args.api_key))
    if isinstance(found, Server):
        return found
    raise LocalspecError(f"No usable localspec server: {found.reason}." if found.reason else
                         "No localspec server is running on this machine.",
                         "Start one with `localspec serve` (or `localspec service install`).")


def _call(server: Server, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    import urllib.error
    import urllib.request

    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {server.key}"} if server.key else {})}
    req = urllib.request.Request(f"{server.url}{path}", method=method, headers=headers,
                                 data=json.dumps(body).encode() if body is not None else None)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=60) as resp:
            reply = json.loads(resp.read(4 << 20))
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read(64 << 10))["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = f"HTTP {exc.code}"
        raise LocalspecError(f"The server at {server.url} answered: {message}", _fix_for(exc.code, path)) from None
    except (OSError, ValueError) as exc:
        raise LocalspecError(f"The server at {server.url} did not answer: {exc}.", "Check `localspec ps`.") from None
    if not isinstance(reply, dict):
        raise LocalspecError(f"The server at {server.url} sent something that is not a report.",
                             "Check that a `localspec serve` of this version listens there (`localspec doctor`).")
    return reply


def _fix_for(status: int, path: str) -> str:
    """The fix line for a refusal (every failure prints one): the server's message says the cause."""
    if status in (401, 403):
        return "Pass the server's key with --api-key, or set $LOCALSPEC_API_KEY."
    if path == "/v1/stop":
        return "Name a model the server serves (listed above); `localspec ps` shows what is loaded."
    return "See the server's log for the cause."


def run_ps(args: argparse.Namespace) -> int:
    from localspec.server.schemas import PsReport

    try:
        server = _server(args)
    except LocalspecError as exc:
        if not args.json:
            raise
        print_json({"url": None, "status": "none", "models": [], "error": exc.cause})  # scripts read one shape
        return 1
    report = PsReport.model_validate(_call(server, "GET", "/v1/ps"))
    if args.json:
        print_json({"url": server.url, **report.model_dump()})
        return 0
    from rich.table import Table

    table = Table(title=f"{server.url} · {report.status} · {_mb(report.rss_bytes)} resident", title_justify="left")
    for column in ("NAME", "ROLE", "SIZE", "PROCESSOR", "CONTEXT", "SLOTS", "UNTIL"):
        table.add_column(column, overflow="fold")
    for m in report.models:
        slots = f"{m.slots_busy}/{m.slots} busy" if m.slots is not None else ""
        table.add_row(m.name, m.role, _mb(m.size_bytes), m.processor, str(m.n_ctx or ""), slots,
                      _until(m.expires_at, m.keep_alive_s))  # each loaded model has its own keep-alive
    print_table(table)
    if report.loading:
        print(f"Loading on demand: {', '.join(report.loading)}.")
    if not report.models:
        print(f"Nothing loaded ({report.status}): the next request loads the models.")
    elif report.queue:
        print(f"{report.queue} requests waiting for a slot.")
    return 0


def run_stop(args: argparse.Namespace) -> int:
    server = _server(args)
    reply = _call(server, "POST", "/v1/stop", {"model": args.model})
    print(f"Unloaded {args.model}." if reply.get("unloaded") else f"{args.model} was not loaded.")
    return 0


def _mb(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


def _until(expires_at: float | None, keep_alive_s: float | None) -> str:
    if keep_alive_s is None:
        return "Forever"
    if expires_at is None:
        return "busy"
    left = max(0.0, expires_at - time.time())
    return f"{left / 60:.0f} minutes from now" if left >= 120 else f"{left:.0f} seconds from now"
