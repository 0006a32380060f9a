"""Command-line options that more than one verb takes."""

from __future__ import annotations

import argparse

# The same names as localspec.cache.policy.CACHE_JUDGES, spelled out so that building the parser
# does not import the cache (and numpy, diskcache) for every command.
CACHE_JUDGES = ("model", "scorer", "rules")


def add_cache_judge_arguments(p: argparse.ArgumentParser) -> None:
    """`--cache-judge` and its older spelling `--no-cache-judge`, for `serve` and `chat`."""
    p.add_argument("--cache-judge", choices=CACHE_JUDGES, default="model",
                   help="with --cache-semantic, who confirms a near-duplicate: the answering model (default; "
                        "about 2-3 s on a CPU), the learned pair scorer (milliseconds, fewer hits), or rules alone")
    p.add_argument("--no-cache-judge", dest="cache_judge", action="store_const", const="rules",
                   help="the same as --cache-judge rules")
