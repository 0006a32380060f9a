"""`localspec profiles`: each model profile, the models it needs, whether they are installed, their
sizes, and whether the profile fits this machine."""

from __future__ import annotations

import argparse
import textwrap
from dataclasses import asdict, dataclass

from localspec.cli.output import print_json, printable, text_width

# Bits per weight of common GGUF quantisations (llama.cpp's figures, rounded): a size estimate for
# a model that is neither installed nor listed with its file sizes.
_BITS_PER_WEIGHT = {"Q4_0": 4.55, "Q4_K_S": 4.58, "Q4_K_M": 4.85, "Q5_K_M": 5.69, "Q6_K": 6.56, "Q8_0": 8.5,
                    "F16": 16.0, "BF16": 16.0, "F32": 32.0}
# The models a served profile loads together; the embedding model is optional and small.
_LOADED_ROLES = ("target", "draft", "small")


@dataclass(frozen=True)
class ProfileModel:
    role: str  # target | draft | small | embedding
    id: str
    installed: bool
    size: int | None  # bytes on disk, or to download
    size_basis: str  # "installed", "download" (the registry's file sizes), "estimate" (parameters), "unknown"


@dataclass(frozen=True)
class ProfileFit:
    verdict: str  # "fits in VRAM" | "fits in RAM" | "too large" | "unknown"
    total_bytes: int | None  # weights, KV cache and compute buffers of the loaded models
    estimated: bool  # a model is not installed: its KV cache is left out and its size may be estimated
    free_ram: int
    free_vram: int | None


@dataclass(frozen=True)
class ProfileStatus:
    name: str
    default: bool
    active: bool  # what serve, chat and generate use: settings.toml's profile, else the default
    description: str
    n_ctx: int
    models: tuple[ProfileModel, ...]
    ready: bool  # target and draft installed: `serve` and `chat` start without a download
    download_bytes: int | None  # what `localspec models pull --profile NAME` still fetches (None: unknown)
    fit: ProfileFit

    def to_dict(self) -> dict:
        return asdict(self)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("profiles", help="list model profiles: the models each needs, installed or not, fit",
                       description=__doc__)
    p.add_argument("name", nargs="?", metavar="PROFILE", help="show only this profile")
    p.add_argument("--json", action="store_true", help="print the profiles as a JSON list")
    p.set_defaults(func=run)


def _estimated_size(entry) -> tuple[int | None, str]:
    expected = entry.expected_size()
    if expected is not None:
        return expected, "download"
    bits = _BITS_PER_WEIGHT.get((entry.quant or "").upper())
    if entry.parameters and bits:
        return int(entry.parameters * bits / 8), "estimate"
    return None, "unknown"


def _model(mm, role: str, model_id: str) -> ProfileModel:
    manifest = mm.manifest(model_id) if mm.installed_path(model_id) else None
    if manifest is not None:
        return ProfileModel(role, model_id, True, manifest.size, "installed")
    size, basis = _estimated_size(mm.resolve(model_id))
    return ProfileModel(role, model_id, False, size, basis)


def _fit(mm, models: tuple[ProfileModel, ...], n_ctx: int) -> ProfileFit:
    from localspec.models.fit import compute_allowance, estimate_fit, fit_verdict, free_ram, free_vram

    ram, (vram, _) = free_ram(), free_vram()
    loaded = {m.id: m for m in models if m.role in _LOADED_ROLES}  # the 0.5B may be draft and small
    total, estimated = 0, False
    for m in loaded.values():
        if m.installed:
            total += estimate_fit(mm.installed_path(m.id), n_ctx=n_ctx, ram=ram, vram=vram).total_bytes
        elif m.size is None:
            return ProfileFit("unknown", None, True, ram, vram)
        else:
            total += m.size + compute_allowance(m.size)
            estimated = True
    return ProfileFit(fit_verdict(total, ram, vram), total, estimated, ram, vram)


def profile_status(mm, name: str, *, active: str | None = None) -> ProfileStatus:
    """`active`: the faces' profile (settings.toml's); None means the registry's default is."""
    prof = mm.profile(name)
    models = tuple(_model(mm, role, mid) for role in ("target", "draft", "small", "embedding")
                   if (mid := mm.resolve(getattr(prof, role)).id if getattr(prof, role) else None))
    missing = {m.id: m.size for m in models if not m.installed}
    download = None if None in missing.values() else sum(missing.values())  # type: ignore[arg-type]
    ready = all(m.installed for m in models if m.role in ("target", "draft"))
    default = mm.registry.default_profile
    return ProfileStatus(name, name == default, name == (active or default), prof.description, prof.n_ctx, models,
                         ready, download, _fit(mm, models, prof.n_ctx))


def _size(m: ProfileModel) -> str:
    from localspec.models.units import human_bytes

    if m.size is None:
        return "size unknown"
    return f"~{human_bytes(m.size)} (est.)" if m.size_basis == "estimate" else human_bytes(m.size)


def render(statuses: list[ProfileStatus]) -> str:
    from localspec.models.units import human_bytes

    width = max((len(m.id) for s in statuses for m in s.models), default=0)
    columns = text_width()
    lines: list[str] = []
    for s in statuses:
        marks = ", ".join(m for m, on in (("default", s.default), ("active", s.active and not s.default)) if on)
        header = f"{s.name}{f' ({marks})' if marks else ''}: {s.description}".rstrip(": ")
        lines += textwrap.wrap(header, columns, subsequent_indent="    ", break_on_hyphens=False) or [header]
        fit = s.fit
        need = "" if fit.total_bytes is None else (
            f" (needs ~{human_bytes(fit.total_bytes)}{', est.' if fit.estimated else ''})")
        state = "ready" if s.ready else (
            "to download: " + (human_bytes(s.download_bytes) if s.download_bytes is not None else "size unknown"))
        lines.append(f"  n_ctx {s.n_ctx}; {state}; {fit.verdict}{need}")
        for m in s.models:
            lines.append(f"  {m.role:9}  {m.id:{width}}  {'installed' if m.installed else 'not installed':13}  "
                         f"{_size(m)}")
        lines.append("")
    if statuses:
        lines.append("pull one: localspec models pull --profile NAME; use it: --profile NAME")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from localspec.models import ModelManager

    mm = ModelManager()
    if args.name:
        mm.profile(args.name)  # an unknown name fails here, listing the known ones
    default = mm.registry.default_profile
    names = [args.name] if args.name else sorted(mm.registry.profiles, key=lambda n: (n != default, n))
    from localspec.settings import active_profile

    active = active_profile(None)
    statuses = [profile_status(mm, n, active=active) for n in names]
    if args.json:
        print_json([s.to_dict() for s in statuses])
    else:
        print(printable(render(statuses)))  # names and descriptions from models.toml: any text
    return 0
