"""`localspec serve`: the OpenAI-compatible endpoint on http://127.0.0.1:8000/v1."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localspec.cli.options import MODES, add_cache_judge_arguments, add_lora_argument
from localspec.errors import ConfigError
from localspec.paths import SETTINGS_ENV

if TYPE_CHECKING:
    from localspec.server.settings import ServerSettings
    from localspec.settings import Settings


def register(sub: argparse._SubParsersAction) -> None:
    # No flag has a default here: an unset flag leaves the value to settings.toml ([server], [engine],
    # [cache], [router], `profile`) and the environment, which default as each help text says.
    p = sub.add_parser("serve", help="run the OpenAI-compatible HTTP endpoint", description=__doc__)
    p.add_argument("--settings", metavar="FILE", help="read this settings file instead of <config>/settings.toml "
                                                      "(the service unit names its own)")
    p.add_argument("--host", help="bind address (default loopback; others need --api-key)")
    p.add_argument("--port", type=int, help="port (default 8000)")
    p.add_argument("--profile", help="model profile from models.toml (default: the active one)")
    p.add_argument("--model", help="target model id, overriding the profile's")
    p.add_argument("--draft-model", help="draft model id, overriding the profile's")
    add_lora_argument(p)
    p.add_argument("--parallel", type=int, help="requests decoded together (sequence slots; default 4)")
    p.add_argument("--max-queue", type=int, help="requests waiting beyond the slots before 429 (default 16)")
    p.add_argument("--n-ctx", type=int, help="context tokens per slot")
    p.add_argument("--threads", type=int, help="llama.cpp threads")
    p.add_argument("--mode", choices=MODES, help="speculation mode (default: settings.toml or auto)")
    p.add_argument("--api-key", help="require this Bearer key (visible in `ps`: prefer --api-key-file or "
                                     "$LOCALSPEC_API_KEY)")
    p.add_argument("--api-key-file", metavar="PATH",
                   help="require one of the Bearer keys in this file, one per line (mode 0600); each key's "
                        "clients get their own cache")
    p.add_argument("--allowed-hosts", action="append", metavar="NAME",
                   help="also answer requests addressed to this host name, e.g. host.docker.internal "
                        "(repeatable; without a key only localhost names are answered)")
    p.add_argument("--allowed-origins", action="append", metavar="URL",
                   help="let web pages from this origin use the server, with CORS (repeatable; pages on "
                        "localhost are allowed)")
    p.add_argument("--ssl-certfile", metavar="PEM", help="serve HTTPS with this certificate (with --ssl-keyfile)")
    p.add_argument("--ssl-keyfile", metavar="PEM", help="the certificate's private key")
    p.add_argument("--max-tokens-cap", type=int, help="largest max_tokens a request may ask for (default 4096)")
    p.add_argument("--max-body-mb", type=float, help="request body size limit (default 4)")
    p.add_argument("--cors-origin", action="append", help=argparse.SUPPRESS)  # older --allowed-origins
    p.add_argument("--no-embeddings", action="store_true", default=None, help="do not serve /v1/embeddings")
    p.add_argument("--no-cache", action="store_true", default=None, help="never answer from the semantic cache")
    p.add_argument("--cache-semantic", action="store_true", default=None,
                   help="also answer near-duplicate prompts (MiniLM similarity, false-hit guard and the large model "
                        "as reuse judge); off by default, see the README's figures")
    add_cache_judge_arguments(p, default=None)
    p.add_argument("--cache-sampled", action="store_true", default=None,
                   help="also cache sampled answers (temperature > 0 without a seed); off by default")
    p.add_argument("--keep-alive", metavar="DURATION",
                   help="unload the models after this long without a request (default 5m; 30s, 1h, seconds; "
                        "0 = after each request, -1 = never); the next request loads them again; a request's "
                        "keep_alive overrides it")
    p.add_argument("--no-pull", action="store_true", default=None, help="fail instead of fetching missing models")
    p.set_defaults(func=run)


def server_settings(args: argparse.Namespace, settings: Settings) -> ServerSettings:
    """The endpoint's settings: each explicit flag, else its setting (which is the default when unset)."""
    from pydantic import ValidationError

    from localspec.errors import UsageError
    from localspec.models.adapters import parse_lora_spec
    from localspec.server.settings import ServerSettings

    lora = parse_lora_spec(args.lora) if args.lora is not None else None
    srv, cache = settings.server, settings.cache

    def pick(flag: Any, setting: Any) -> Any:
        return setting if flag is None else flag

    origins = [*(args.allowed_origins or []), *(args.cors_origin or [])]
    body_mb = pick(args.max_body_mb, srv.max_body_mb)
    try:
        return ServerSettings(
            host=pick(args.host, srv.host), port=pick(args.port, srv.port), api_key=args.api_key,
            api_key_file=pick(args.api_key_file, srv.api_key_file), profile=pick(args.profile, settings.profile),
            target=pick(args.model, srv.model), draft=pick(args.draft_model, srv.draft_model),
            parallel=pick(args.parallel, settings.serve_parallel), max_queue=pick(args.max_queue, srv.max_queue),
            # Only the flags: engine_config reads [engine] itself, under a model's own n_ctx (a flag beats both).
            n_ctx=args.n_ctx, n_threads=args.threads, mode=args.mode,
            max_tokens_cap=pick(args.max_tokens_cap, srv.max_tokens_cap),
            max_body_bytes=int(body_mb * (1 << 20)),
            allowed_hosts=args.allowed_hosts or srv.allowed_hosts, allowed_origins=origins or srv.allowed_origins,
            ssl_certfile=pick(args.ssl_certfile, srv.ssl_certfile), ssl_keyfile=pick(args.ssl_keyfile, srv.ssl_keyfile),
            max_embedding_inputs=srv.max_embedding_inputs, max_embedding_tokens=srv.max_embedding_tokens,
            retry_after_s=srv.retry_after_s, request_timeout_s=srv.request_timeout_s,
            max_connections=srv.max_connections, embeddings=srv.embeddings if args.no_embeddings is None else False,
            cache=cache.enabled if args.no_cache is None else False,
            cache_sampled=pick(args.cache_sampled, cache.sampled), cache_semantic=pick(args.cache_semantic,
                                                                                      cache.semantic),
            cache_judge=pick(args.cache_judge, cache.judge), router=settings.router.enabled,
            keep_alive=pick(args.keep_alive, srv.keep_alive),
            lora_path=str(lora.path) if lora else None, lora_scale=lora.scale if lora else 1.0,
        ).with_env_key()
    except ValidationError as exc:
        err = exc.errors()[0]
        field = str(err["loc"][0]) if err["loc"] else ""
        flag, dest = _FLAGS.get(field, ("--" + field.replace("_", "-"), field))
        given = getattr(args, dest, None)
        if given is None:  # the value came from settings.toml or the environment, not a flag
            key = _SETTING_KEYS.get(field, "server." + field)
            got = srv.max_body_mb if field == "max_body_bytes" else err.get("input")
            raise ConfigError(f"{setting_origin(key)}: setting '{key}': {err['msg']} (got {got!r}).",
                              "Correct or remove it; docs/configuration.md lists each table.") from None
        raise UsageError(f"Invalid {flag} {given!r}: {err['msg']}.",
                         "See `localspec serve --help` for each flag's range.") from None


def _check_profile(flag: str | None, profile: str | None) -> None:
    """An unknown profile refused before the server starts, naming where it was set: with --no-pull it
    started, and every request then got the load's 503 (field test)."""
    from localspec.settings import require_known_profile

    if flag is None:
        require_known_profile(profile)  # settings.toml's, or $LOCALSPEC_PROFILE
        return
    from localspec.models import ModelManager

    ModelManager().profile(flag)  # the registry's error: the unknown name and the known ones


def setting_origin(key: str) -> str:
    """Where a setting's value came from, for an error line: its variable when set, else the file."""
    from localspec.settings import ENV_PREFIX, settings_path

    env = ENV_PREFIX + key.upper().replace(".", "__")
    return f"${env}" if os.environ.get(env) else str(settings_path())


def load_serve_settings(args: argparse.Namespace) -> Settings:
    """The one settings model: `--settings FILE`, else <config>/settings.toml, and the environment."""
    from localspec.settings import load_settings

    if args.settings:
        path = Path(args.settings).absolute()
        if not path.exists():  # named on purpose: running on the defaults instead would hide the typo
            raise ConfigError(f"The settings file {path} (--settings) does not exist.",
                              "Give an existing file, or leave out --settings for <config>/settings.toml.")
        os.environ[SETTINGS_ENV] = str(path)  # every loader in this process reads it
    return load_settings()


def settings_from_args(args: argparse.Namespace) -> ServerSettings:
    return server_settings(args, load_serve_settings(args))


# Settings fields whose flag has another name: field -> (flag, argparse dest).
_FLAGS = {"max_body_bytes": ("--max-body-mb", "max_body_mb"), "n_threads": ("--threads", "threads"),
          "target": ("--model", "model"), "draft": ("--draft-model", "draft_model"),
          "cache": ("--no-cache", "no_cache"), "embeddings": ("--no-embeddings", "no_embeddings")}
# ServerSettings fields whose settings key is another: field -> its key in settings.toml.
_SETTING_KEYS = {"max_body_bytes": "server.max_body_mb", "target": "server.model", "draft": "server.draft_model",
                 "parallel": "engine.parallel", "cache": "cache.enabled", "cache_sampled": "cache.sampled",
                 "cache_semantic": "cache.semantic", "cache_judge": "cache.judge", "router": "router.enabled",
                 "profile": "profile"}


def serving_at(settings: ServerSettings) -> str:
    """Where the start-up line says it serves: an IPv6 address in brackets, as in a URL; `--port 0` is not
    a port a client can use, so the line names uvicorn's, which follows once the socket is bound."""
    scheme = "https" if settings.ssl_certfile else "http"
    host = f"[{settings.host}]" if ":" in settings.host and not settings.host.startswith("[") else settings.host
    if settings.port == 0:
        return f"{scheme}://{host} on a free port (the 'Uvicorn running on' line below names it)"
    return f"{scheme}://{host}:{settings.port}/v1"


def run(args: argparse.Namespace) -> int:
    from localspec.server import serve

    if args.api_key:
        print("warning: a key given with --api-key is visible to every user of this machine (`ps`); "
              "use --api-key-file PATH or $LOCALSPEC_API_KEY instead", file=sys.stderr)
    table = load_serve_settings(args)
    settings = server_settings(args, table)
    settings.check_bind()  # before any download or model load
    _check_profile(args.profile, settings.profile)
    if args.no_pull is None and table.server.pull:
        from localspec.cli.models_cmd import ensure_models

        ensure_models(settings.profile, [settings.target, settings.draft] if settings.target else None)
    if settings.lora_path:  # a wrong adapter fails here, in one line, not later on /health
        from localspec.models.compat import check_lora
        from localspec.service import resolve_models

        files, _ = resolve_models(settings.profile, settings.target, None, need_draft=False)
        check_lora(settings.lora_path, files.target)
    print(f"localspec: serving {serving_at(settings)} (models load in the background; GET /health says when ready)")
    serve(settings)
    return 0
