"""`localspec models …`: list, search, pull, rm, info, verify, import, du."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localspec.cli.output import printable
from localspec.errors import IntegrityError, ModelNotFoundError

if TYPE_CHECKING:
    from localspec.models.hub import SearchHit


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="list, download and check models", description=__doc__)
    verbs = p.add_subparsers(dest="verb", metavar="VERB")
    p.set_defaults(func=lambda args: (p.print_help(), 0)[1])

    v = verbs.add_parser("list", help="known and installed models")
    v.add_argument("--paths", action="store_true", help="print where registry, overlay and store live")
    v.add_argument("--no-fit", action="store_true", help="skip the memory-fit estimate")
    v.add_argument("--json", action="store_true")
    v.set_defaults(func=cmd_list)

    v = verbs.add_parser("search", help="GGUF models on the Hugging Face Hub: quants, sizes, fit (downloads nothing)")
    v.add_argument("query", metavar="QUERY")
    v.add_argument("--limit", type=int, default=10, help="most Hub repos to show (default: 10)")
    v.add_argument("--json", action="store_true")
    v.set_defaults(func=cmd_search)

    v = verbs.add_parser("pull", help="download models (no ids: the active profile, settings.toml's or the default); "
                                      "any GGUF on the Hub as hf.co/USER/REPO[:QUANT]")
    v.add_argument("ids", nargs="*", metavar="ID",
                   help="registry ids, or hf.co/USER/REPO[:QUANT], USER/REPO:QUANT, or a file URL on the Hub")
    v.add_argument("--profile", help="pull every model of this profile")
    v.add_argument("--include-embedding", action="store_true",
                   help="fail when the profile's embedding model cannot be fetched (default: skip it)")
    v.add_argument("--force", action="store_true", help="download again even if installed")
    v.add_argument("--draft-model", metavar="REF",
                   help="with one hf.co/... target: a draft (hf.co/... or a registry id) to pull with it; its "
                        "tokenizer is compared with the target's from their headers before anything downloads")
    v.add_argument("--json", action="store_true",
                   help="NDJSON on stdout: progress events (at most one a second per phase), then one result per model")
    v.set_defaults(func=cmd_pull)

    v = verbs.add_parser("rm", help="remove an installed model")
    v.add_argument("id", metavar="ID")
    v.add_argument("--purge-hf-cache", action="store_true",
                   help="also delete its files from the Hugging Face cache")
    v.add_argument("--json", action="store_true", help="print what was removed as JSON")
    v.set_defaults(func=cmd_rm)

    v = verbs.add_parser("info", help="GGUF metadata of a model id or file")
    v.add_argument("target", metavar="ID_OR_PATH")
    v.add_argument("--n-ctx", type=int, help="context size for the fit estimate (default: the profile's)")
    v.add_argument("--json", action="store_true")
    v.set_defaults(func=cmd_info)

    v = verbs.add_parser("verify", help="re-hash installed files (no ids: all installed); "
                                        "'unpinned' when the registry pins no sha256 to compare with")
    v.add_argument("ids", nargs="*", metavar="ID")
    v.add_argument("--json", action="store_true", help="print each model's result as JSON")
    v.set_defaults(func=cmd_verify)

    v = verbs.add_parser("import", help="copy a local GGUF file into the store")
    v.add_argument("path", metavar="PATH")
    v.add_argument("--id", dest="model_id", help="registry id to install as (default: from the file name)")
    v.add_argument("--role", default="target", choices=("target", "draft", "embedding"),
                   help="what the model is for")
    v.add_argument("--json", action="store_true", help="print the installed model as JSON")
    v.set_defaults(func=cmd_import)

    v = verbs.add_parser("du", help="disk space used by models")
    v.add_argument("--json", action="store_true")
    v.set_defaults(func=cmd_du)


def _manager():
    from localspec.models import ModelManager

    return ModelManager()


def _human(n: int | None) -> str:
    from localspec.models.units import human_bytes

    return human_bytes(n)


def _print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2, default=str))


# ---------------------------------------------------------------- list


def cmd_list(args: argparse.Namespace) -> int:
    from huggingface_hub import constants as hf_constants

    mgr = _manager()
    if args.paths:
        p = mgr.paths
        rows = {
            "builtin registry": str(mgr.registry.files[0]),
            "user registry": str(p.user_registry),
            "models dir": str(p.models_dir),
            "hf cache": str(hf_constants.HF_HUB_CACHE),
            "config dir": str(p.config_dir),
            "data dir": str(p.data_dir),
            "cache dir": str(p.cache_dir),
        }
        if args.json:
            _print_json(rows)
        else:
            for k, v in rows.items():
                print(f"{k:17} {v}")
        return 0
    rows = mgr.list(with_fit=not args.no_fit)
    if args.json:
        _print_json([{
            "id": r.id, "role": r.role, "family": r.family, "quant": r.quant, "aliases": list(r.aliases),
            "installed": r.installed, "size": r.size, "path": str(r.path) if r.path else None,
            "source": r.source, "fit": r.fit.to_dict() if r.fit else None, "in_registry": r.in_registry,
            "unpinned": r.unpinned, "lora": r.lora,
        } for r in rows])
        return 0
    from rich.table import Table

    from localspec.cli.output import print_table

    table = Table(box=None, pad_edge=False)
    with_lora = any(r.lora for r in rows)  # the column only when some model has an adapter bound
    for col in ("id", "role", "quant", "size", "installed", "source", "fit", *(("lora",) if with_lora else ())):
        table.add_column(col)
    for r in rows:
        table.add_row(r.id, r.role, r.quant or "", _human(r.size), "yes" if r.installed else "no",
                      r.source or "", r.fit.verdict if r.fit else "", *((r.lora or "",) if with_lora else ()))
    print_table(table)  # ids whole at any width
    return 0


# ---------------------------------------------------------------- pull


def cmd_pull(args: argparse.Namespace) -> int:
    from localspec.cli.pull_progress import JsonView, pull_view
    from localspec.models.hub import parse_hub_ref
    from localspec.models.manager import HubPull, InstallRecord

    mgr = _manager()
    if args.ids and args.profile:
        from localspec.errors import UsageError

        raise UsageError("Give model ids or --profile, not both.", "Run one pull per profile.")
    refs = {i: parse_hub_ref(i) for i in args.ids}  # a malformed reference is a usage error before any pull
    draft = getattr(args, "draft_model", None)
    if draft is not None and (len(args.ids) != 1 or refs[args.ids[0]] is None):
        from localspec.errors import UsageError

        raise UsageError("--draft-model goes with exactly one hf.co/USER/REPO[:QUANT] target.",
                         "Pull one Hub model and its draft per command.")
    view = pull_view(json_lines=args.json)
    results: list[InstallRecord | HubPull] = []
    try:
        if args.ids:
            for i in args.ids:
                results.append(mgr.pull_hub(i, progress=view, force=args.force, draft=draft) if refs[i]
                               else mgr.pull(i, progress=view, force=args.force))
            skipped: dict[str, str] = {}
        else:
            from localspec.settings import checked_active_profile

            # No ids: what serve, chat and generate would load (settings.toml's profile), not always the default's.
            profile = checked_active_profile(args.profile)
            result = mgr.pull_profile(profile, progress=view, include_embedding=args.include_embedding)
            results, skipped = list(result.installed), result.skipped
    except KeyboardInterrupt as exc:
        exc.add_note("what was downloaded is kept: the same command resumes it")
        raise
    finally:
        view.close()
    if isinstance(view, JsonView):
        for r in results:
            rec = r.record if isinstance(r, HubPull) else r
            record: dict[str, object] = {"event": "installed", "model": rec.model_id, "source": rec.source,
                                         "path": str(rec.path), "size": rec.size, "downloaded": rec.downloaded}
            if isinstance(r, HubPull):
                record.update(repo=r.repo, quant=r.quant, quant_note=r.note or None, draft=r.pairing.to_dict(),
                              fit=r.fit or None,
                              pulled_draft=r.draft_record.model_id if r.draft_record else None)
            view.emit(record)
        for mid, why in skipped.items():
            view.emit({"event": "skipped", "model": mid, "optional": True, "reason": why})
        return 0
    for r in results:
        rec = r.record if isinstance(r, HubPull) else r
        state = f"installed from {rec.source}" if rec.downloaded else f"already installed (from {rec.source})"
        print(f"{rec.model_id}: {state}: {rec.path}")
        if isinstance(r, HubPull):
            if r.note:
                print(f"  quant: {r.note}")
            print(f"  use it as: --model {rec.model_id}  (or the name you pulled)")
            if r.fit:
                print(f"  fit: {r.fit}")
            if r.draft_record:
                print(f"  pulled draft {r.draft_record.model_id}: {r.draft_record.path}")
            print(f"  draft: {r.pairing.summary}")
    for mid, why in skipped.items():
        print(f"{mid}: skipped (optional embedding model): {why}")
    return 0


# ---------------------------------------------------------------- search


def cmd_search(args: argparse.Namespace) -> int:
    from localspec.errors import DownloadError, UsageError
    from localspec.models import hub

    if not 1 <= args.limit <= 100:
        raise UsageError(f"--limit {args.limit} is out of range.", "Use 1 to 100.")
    query = args.query.strip()
    if not query:
        raise UsageError("The search query is empty.", "Give a word of the model's name, e.g. `qwen coder`.")
    mgr = _manager()
    words = query.lower().split()
    curated = [e for e in mgr.registry.models.values()
               if all(w in " ".join([e.id, e.family, *e.aliases, *(getattr(s, "repo", "") for s in e.sources)]).lower()
                      for w in words)]
    failure: DownloadError | None = None
    try:
        hits = hub.search(query, limit=args.limit)
    except DownloadError as exc:  # the registry still answers; the one line says why the Hub did not
        hits, failure = [], exc
    from localspec.models.hub_search import default_n_ctx

    n_ctx = default_n_ctx(mgr)
    rows = [_search_row(h, n_ctx) for h in hits]
    registry = [{"id": e.id, "role": e.role, "quant": e.quant, "size": e.expected_size(),
                 "installed": mgr.installed_path(e.id) is not None} for e in curated]
    if args.json:
        _print_json({"query": query, "registry": registry, "hub": rows,
                     "hub_error": str(failure) if failure else None})
    else:
        _print_search(registry, rows)
    if failure is not None:
        raise failure
    return 0


def _search_row(h: SearchHit, n_ctx: int) -> dict[str, Any]:
    from localspec.models.hub_search import quant_rows

    quants = []
    for q in quant_rows(h, n_ctx):
        est = q.fit.estimate
        quants.append({"quant": q.quant, "size": q.size, "files": q.files, "bits_per_weight": q.bits_per_weight,
                       "fit": q.fit.verdict, "fit_from": "size" if est is None else "header",
                       "kv_bytes": est.kv_bytes if est else None, "n_ctx": est.n_ctx if est else None,
                       "total_bytes": est.total_bytes if est else None, "pull": q.pull_ref})
    head = h.header
    header = None if head is None else {"read": head.meta is not None, "note": head.detail or None,
                                        "bytes_read": head.bytes_read, "requests": head.requests}
    return {"repo": h.repo, "downloads": h.downloads, "gated": h.gated, "error": h.error, "header": header,
            "quants": quants}


def _print_search(registry: list[dict[str, Any]], rows: list[dict[str, Any]]) -> None:
    if registry:
        print("registry (localspec models pull ID):")
        for r in registry:
            mark = "installed" if r["installed"] else _human(r["size"])
            print(f"  {r['id']}  {r['role']}  {mark}")
    for h in rows:
        gated = "  gated: needs a login" if h["gated"] else ""
        print(f"hf.co/{h['repo']}  ({h['downloads'] or 0:,} downloads){gated}")
        if h["error"]:
            print(f"  {h['error']}")
        elif not h["quants"]:
            print("  no GGUF model files")
        head = h["header"]
        if h["quants"] and head is not None and not head["read"]:
            print(f"  fit from the file size only (no KV cache counted): {head['note']}")
        for q in h["quants"]:
            files = f" in {q['files']} files" if q["files"] > 1 else ""
            kv = "" if q["kv_bytes"] is None else f" (with {_human(q['kv_bytes'])} KV cache at n_ctx {q['n_ctx']:,})"
            print(f"  {q['quant']:<9} {_human(q['size']):>9}{files}  {q['fit']}{kv}")
    if not registry and not rows:
        print("nothing found")


# ---------------------------------------------------------------- rm / info / verify / import / du


def cmd_rm(args: argparse.Namespace) -> int:
    freed = _manager().remove(args.id, purge_hf_cache=args.purge_hf_cache)
    if args.json:
        _print_json({"removed": args.id, "freed_bytes": freed})
    else:
        print(f"removed {args.id} ({_human(freed)} freed)")
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    from localspec.models import estimate_fit, read_gguf_info
    from localspec.models.gguf_info import named_file_error

    mgr = _manager()
    path = Path(args.target).expanduser()
    model_id = None
    try:
        exists = path.exists()
    except OSError:  # a name too long to be a path (ENAMETOOLONG) can still be an id
        exists = False
    if not exists:
        try:  # an id, an alias, or the Hub reference a model was pulled as (it may end in .gguf)
            model_id = mgr.resolve(args.target).id
        except ModelNotFoundError:
            if not args.target.endswith(".gguf"):
                raise
        else:
            path = mgr.require_path(model_id)
    try:
        info = read_gguf_info(path)
    except IntegrityError as exc:
        if model_id:  # a file of the store keeps its fix: pull it again
            raise
        raise named_file_error(exc) from None
    n_ctx = args.n_ctx
    if n_ctx is None:
        try:
            n_ctx = mgr.profile().n_ctx
        except Exception:
            n_ctx = 4096
    fit = estimate_fit(info, n_ctx=n_ctx)
    pairing = mgr.pair_draft(model_id) if model_id else None  # a bare file has no store id to pair
    if args.json:
        d = info.to_dict()
        d["model_id"] = model_id
        d["fit"] = fit.to_dict()
        d["draft"] = pairing.to_dict() if pairing else None
        _print_json(d)
        return 0
    rows = [
        ("model", model_id or "-"),
        ("file", str(info.path)),
        ("size", _human(info.file_size)),
        ("architecture", info.architecture),
        ("name", info.name or "-"),
        ("quant", info.quant or "-"),
        ("parameters", f"{info.parameters:,}"),
        ("context length", str(info.context_length or "-")),
        ("layers", str(info.block_count or "-")),
        ("heads (q/kv)", f"{info.head_count or '-'}/{info.head_count_kv or '-'}"),
        ("vocab size", str(info.vocab_size or "-")),
        ("tokenizer", info.tokenizer_model or "-"),
        ("bos/eos ids", f"{info.bos_token_id}/{info.eos_token_id}"),
        ("chat template", "yes" if info.has_chat_template else "no"),
        (f"fit @ n_ctx={n_ctx}", f"{fit.verdict} (needs ~{_human(fit.total_bytes)}, "
                                 f"free RAM {_human(fit.free_ram)}"
                                 + (f", free VRAM {_human(fit.free_vram)})" if fit.free_vram is not None else ")")),
    ]
    if pairing is not None:
        rows.append(("draft (auto)", pairing.summary))
        rows += [(f"  {c.model_id}", f"{c.compat.value}: {c.detail}") for c in pairing.candidates]
    for k, v in rows:
        print(f"{k:18} {printable(v)}")  # a GGUF's name and tokenizer are its author's text: escapes set a title
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    mgr = _manager()
    ids = args.ids or [m.model_id for m in mgr.store.manifests()]
    if not ids and not args.json:
        print("no models installed")
        return 0
    from localspec.models.manager import VerifyStatus

    bad, results = [], []
    for mid in ids:
        report = mgr.verify_report(mid)
        results.append({"id": report.model_id, "status": report.status.value, "detail": report.detail})
        if not args.json:
            print(f"{mid}: {report.status.value}" + (f" ({report.detail})" if report.detail else ""))
        if report.status is VerifyStatus.FAILED:
            bad.append(report.model_id)
    if args.json:
        _print_json(results)
    if bad:
        raise IntegrityError(f"{len(bad)} model(s) failed verification: {', '.join(bad)}.",
                             f"Re-download with `localspec models pull --force {' '.join(bad)}`.")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    rec = _manager().import_file(args.path, model_id=args.model_id, role=args.role)
    if args.json:
        _print_json({"id": rec.model_id, "imported": rec.downloaded, "path": str(rec.path), "size": rec.size,
                     "source": rec.source})
        return 0
    state = "imported" if rec.downloaded else "already installed from"
    print(f"{rec.model_id}: {state} {args.path}: {rec.path}")
    return 0


def cmd_du(args: argparse.Namespace) -> int:
    du = _manager().disk_usage()
    if args.json:
        _print_json({"models_dir": str(du.models_dir), "per_model": du.per_model, "store_bytes": du.store_bytes,
                     "hf_cache_bytes": du.hf_cache_bytes, "free_bytes": du.free_bytes})
        return 0
    for mid, size in sorted(du.per_model.items()):
        print(f"{_human(size):>10}  {mid}")
    print(f"{_human(du.store_bytes):>10}  total in {du.models_dir}")
    if du.hf_cache_bytes:
        print(f"{_human(du.hf_cache_bytes):>10}  of it kept in the Hugging Face cache")
    print(f"{_human(du.free_bytes):>10}  free on that disk")
    return 0


def ensure_models(profile: str | None = None, ids: list[str | None] | None = None) -> None:
    """Pull what the main job needs on first use, with progress; a no-op once installed.

    The profile's target and draft (or the explicit ids) must be installed. The profile's embedding
    model (the semantic cache, /v1/embeddings) is fetched too when it can be, and never blocks.
    """
    from localspec.cli.pull_progress import pull_view
    from localspec.errors import DownloadError, ModelNotFoundError
    from localspec.models.hub import parse_hub_ref

    mgr = _manager()
    prof = mgr.profile(profile)
    wanted: list[str] = []
    hub: list[str] = []  # Hub references not pulled yet: pulled by reference, as `ollama run hf.co/...` does
    for name in (i for i in (ids or [prof.target, prof.draft]) if i):
        try:
            wanted.append(mgr.resolve(name).id)
        except ModelNotFoundError:
            if parse_hub_ref(name) is None:  # a malformed reference is a usage error here
                raise  # unknown ids fail here
            hub.append(name)
    missing = [i for i in wanted if mgr.installed_path(i) is None]
    optional = [prof.embedding] if prof.embedding and not ids and mgr.installed_path(prof.embedding) is None else []
    if not missing and not optional and not hub:
        return
    print(f"First use: fetching {', '.join(hub + missing + optional)} (see `localspec models list`)", file=sys.stderr)
    view = pull_view()
    try:
        for reference in hub:
            pulled = mgr.pull_hub(reference, progress=view)
            view.note(f"{reference}: installed as {pulled.record.model_id} from {pulled.record.source}")
        for model_id in missing:
            record = mgr.pull(model_id, progress=view)
            view.note(f"{record.model_id}: installed from {record.source}")
        for model_id in optional:
            try:
                record = mgr.pull(model_id, progress=view)
                view.note(f"{record.model_id}: installed from {record.source}")
            except DownloadError as exc:  # IntegrityError is a real problem and propagates
                view.note(f"{model_id}: not installed (optional: the semantic cache and /v1/embeddings need it). "
                          f"{exc.fix or ''}".strip())
    finally:
        view.close()
