"""`localspec doctor`: the llama.cpp build, GPU, models, paths and port, each problem with its fix.

Exit status 0 when nothing is wrong (a missing optional part, such as the embedding model, is a
warning), 1 when a problem was found."""

from __future__ import annotations

import argparse
import json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("doctor", help="check the install: llama.cpp build, GPU, models, paths, port",
                       description=__doc__)
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.add_argument("--verify", action="store_true", help="re-hash installed model files (slow for large models)")
    p.add_argument("--host", default="127.0.0.1", help="address whose port to check (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port `localspec serve` would use (default 8000)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from localspec.doctor import diagnose, render_text

    report = diagnose(verify=args.verify, host=args.host, port=args.port)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2, default=str))
    else:
        print(render_text(report))
    return 1 if report.problems else 0
