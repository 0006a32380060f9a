"""`localspec serve`: the OpenAI-compatible endpoint on http://127.0.0.1:8000/v1."""

from __future__ import annotations

import argparse
import sys

from localspec.cli.options import MODES, add_cache_judge_arguments, add_lora_argument


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="run the OpenAI-compatible HTTP endpoint", description=__doc__)
    p.add_argument("--host", default="127.0.0.1", help="bind address (default loopback; others need --api-key)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--profile", help="model profile from models.toml")
    p.add_argument("--model", help="target model id, overriding the profile's")
    p.add_argument("--draft-model", help="draft model id, overriding the profile's")
    add_lora_argument(p)
    p.add_argument("--parallel", type=int, default=4, help="requests decoded together (sequence slots)")
    p.add_argument("--max-queue", type=int, default=16, help="requests waiting beyond the slots before 429")
    p.add_argument("--n-ctx", type=int, help="context tokens per slot")
    p.add_argument("--threads", type=int, help="llama.cpp threads")
    p.add_argument("--mode", choices=MODES, help="speculation mode (default: settings.toml or auto)")
    p.add_argument("--api-key", help="require this Bearer key (visible in `ps`: prefer --api-key-file or "
                                     "$LOCALSPEC_API_KEY)")
    p.add_argument("--api-key-file", metavar="PATH",
                   help="require one of the Bearer keys in this file, one per line (mode 0600); each key's "
                        "clients get their own cache")
    p.add_argument("--allowed-hosts", action="append", default=[], metavar="NAME",
                   help="also answer requests addressed to this host name, e.g. host.docker.internal "
                        "(repeatable; without a key only localhost names are answered)")
    p.add_argument("--allowed-origins", action="append", default=[], metavar="URL",
                   help="let web pages from this origin use the server, with CORS (repeatable; pages on "
                        "localhost are allowed)")
    p.add_argument("--ssl-certfile", metavar="PEM", help="serve HTTPS with this certificate (with --ssl-keyfile)")
    p.add_argument("--ssl-keyfile", metavar="PEM", help="the certificate's private key")
    p.add_argument("--max-tokens-cap", type=int, default=4096, help="largest max_tokens a request may ask for")
    p.add_argument("--max-body-mb", type=float, default=4.0, help="request body size limit")
    p.add_argument("--cors-origin", action="append", default=[], help=argparse.SUPPRESS)  # older --allowed-origins
    p.add_argument("--no-embeddings", action="store_true", help="do not serve /v1/embeddings")
    p.add_argument("--no-cache", action="store_true", help="never answer from the semantic cache")
    p.add_argument("--cache-semantic", action="store_true",
                   help="also answer near-duplicate prompts (MiniLM similarity, false-hit guard and the large model "
                        "as reuse judge); off by default, see the README's figures")
    add_cache_judge_arguments(p)
    p.add_argument("--cache-sampled", action="store_true",
                   help="also cache sampled answers (temperature > 0 without a seed); off by default")
    p.add_argument("--keep-alive", default="5m", metavar="DURATION",
                   help="unload the models after this long without a request (5m, 30s, 1h, seconds; 0 = after "
                        "each request, -1 = never); the next request loads them again; a request's keep_alive "
                        "overrides it")
    p.add_argument("--no-pull", action="store_true", help="fail instead of fetching missing models")
    p.set_defaults(func=run)


def settings_from_args(args: argparse.Namespace):
    from pydantic import ValidationError

    from localspec.errors import UsageError
    from localspec.models.adapters import parse_lora_spec
    from localspec.server.settings import ServerSettings

    lora = parse_lora_spec(args.lora) if args.lora is not None else None
    try:
        return ServerSettings(
            host=args.host, port=args.port, api_key=args.api_key, api_key_file=args.api_key_file,
            profile=args.profile, target=args.model, draft=args.draft_model, parallel=args.parallel,
            max_queue=args.max_queue, n_ctx=args.n_ctx, n_threads=args.threads, mode=args.mode,
            max_tokens_cap=args.max_tokens_cap, max_body_bytes=int(args.max_body_mb * (1 << 20)),
            allowed_hosts=args.allowed_hosts, allowed_origins=[*args.allowed_origins, *args.cors_origin],
            ssl_certfile=args.ssl_certfile, ssl_keyfile=args.ssl_keyfile,
            embeddings=not args.no_embeddings, cache=not args.no_cache, cache_sampled=args.cache_sampled,
            cache_semantic=args.cache_semantic, cache_judge=args.cache_judge, keep_alive=args.keep_alive,
            lora_path=str(lora.path) if lora else None, lora_scale=lora.scale if lora else 1.0,
        ).with_env_key()
    except ValidationError as exc:
        err = exc.errors()[0]
        field = str(err["loc"][0]) if err["loc"] else ""
        flag, dest = _FLAGS.get(field, ("--" + field.replace("_", "-"), field))
        raise UsageError(f"Invalid {flag} {getattr(args, dest, err.get('input'))!r}: {err['msg']}.",
                          "See `localspec serve --help` for each flag's range.") from None


# Settings fields whose flag has another name: field -> (flag, argparse dest).
_FLAGS = {"max_body_bytes": ("--max-body-mb", "max_body_mb"), "n_threads": ("--threads", "threads"),
          "target": ("--model", "model"), "draft": ("--draft-model", "draft_model"),
          "cache": ("--no-cache", "no_cache"), "embeddings": ("--no-embeddings", "no_embeddings")}


def run(args: argparse.Namespace) -> int:
    from localspec.server import serve

    if args.api_key:
        print("warning: a key given with --api-key is visible to every user of this machine (`ps`); "
              "use --api-key-file PATH or $LOCALSPEC_API_KEY instead", file=sys.stderr)
    settings = settings_from_args(args)
    settings.check_bind()  # before any download or model load
    if not args.no_pull:
        from localspec.cli.models_cmd import ensure_models

        ensure_models(args.profile, [args.model, args.draft_model] if args.model else None)
    if settings.lora_path:  # a wrong adapter fails here, in one line, not later on /health
        from localspec.models.compat import check_lora
        from localspec.service import resolve_models

        files, _ = resolve_models(settings.profile, settings.target, None, need_draft=False)
        check_lora(settings.lora_path, files.target)
    scheme = "https" if settings.ssl_certfile else "http"
    print(f"localspec: serving {scheme}://{settings.host}:{settings.port}/v1 (models load in the background; "
          f"GET /health says when ready)")
    serve(settings)
    return 0
