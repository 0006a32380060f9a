"""`localspec serve`: the OpenAI-compatible endpoint on http://127.0.0.1:8000/v1."""

from __future__ import annotations

import argparse

from localspec.cli.options import add_cache_judge_arguments
from localspec.engine.config import MODES


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="run the OpenAI-compatible HTTP endpoint", description=__doc__)
    p.add_argument("--host", default="127.0.0.1", help="bind address (default loopback; others need --api-key)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--profile", help="model profile from models.toml")
    p.add_argument("--model", help="target model id, overriding the profile's")
    p.add_argument("--draft-model", help="draft model id, overriding the profile's")
    p.add_argument("--parallel", type=int, default=4, help="requests decoded together (sequence slots)")
    p.add_argument("--max-queue", type=int, default=16, help="requests waiting beyond the slots before 429")
    p.add_argument("--n-ctx", type=int, help="context tokens per slot")
    p.add_argument("--threads", type=int, help="llama.cpp threads")
    p.add_argument("--mode", choices=MODES, help="speculation mode (default: settings.toml or auto)")
    p.add_argument("--api-key", help="require this Bearer key (default: $LOCALSPEC_API_KEY)")
    p.add_argument("--max-tokens-cap", type=int, default=4096, help="largest max_tokens a request may ask for")
    p.add_argument("--max-body-mb", type=float, default=4.0, help="request body size limit")
    p.add_argument("--cors-origin", action="append", default=[], help="allow this browser origin (repeatable; default: CORS off)")
    p.add_argument("--no-embeddings", action="store_true", help="do not serve /v1/embeddings")
    p.add_argument("--no-cache", action="store_true", help="never answer from the semantic cache")
    p.add_argument("--cache-semantic", action="store_true",
                   help="also answer near-duplicate prompts (MiniLM similarity, false-hit guard and the large model "
                        "as reuse judge); off by default, see the README's figures")
    add_cache_judge_arguments(p)
    p.add_argument("--cache-sampled", action="store_true",
                   help="also cache sampled answers (temperature > 0 without a seed); off by default")
    p.add_argument("--no-pull", action="store_true", help="fail instead of fetching missing models")
    p.set_defaults(func=run)


def settings_from_args(args: argparse.Namespace):
    from localspec.server.settings import ServerSettings

    return ServerSettings(
        host=args.host, port=args.port, api_key=args.api_key, profile=args.profile, target=args.model,
        draft=args.draft_model, parallel=args.parallel, max_queue=args.max_queue, n_ctx=args.n_ctx,
        n_threads=args.threads, mode=args.mode, max_tokens_cap=args.max_tokens_cap,
        max_body_bytes=int(args.max_body_mb * (1 << 20)), cors_origins=args.cors_origin,
        embeddings=not args.no_embeddings, cache=not args.no_cache, cache_sampled=args.cache_sampled,
        cache_semantic=args.cache_semantic, cache_judge=args.cache_judge,
    ).with_env_key()


def run(args: argparse.Namespace) -> int:
    from localspec.server import serve

    settings = settings_from_args(args)
    settings.check_bind()  # before any download or model load
    if not args.no_pull:
        from localspec.cli.models_cmd import ensure_models

        ensure_models(args.profile, [args.model, args.draft_model] if args.model else None)
    print(f"localspec: serving http://{settings.host}:{settings.port}/v1 (models load in the background; "
          f"GET /health says when ready)")
    serve(settings)
    return 0
