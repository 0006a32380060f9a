"""`localspec doctor`: what this install can do, and what to fix.

Every fact is probed, never assumed: GPU devices come from NVML or nvidia-smi and are "unknown"
when neither is available. Problems carry a one-line cause and fix, like every LocalspecError.
"""

from __future__ import annotations

import errno
import re
import shutil
import socket
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from localspec import __version__
from localspec.errors import ConfigError, UsageError
from localspec.paths import resolve_paths

SCHEMA = "localspec.doctor/1"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
_GPU_BACKENDS = ("CUDA", "Metal", "Vulkan", "HIP", "SYCL", "OpenCL", "CANN", "MUSA")
_INSTALL_FIX = "Rebuild llama-cpp-python for your GPU: `python packaging/install.py` (see packaging/README.md)."


@dataclass(frozen=True)
class Problem:
    cause: str
    fix: str


@dataclass
class Report:
    data: dict[str, Any]
    problems: list[Problem] = field(default_factory=list)  # something that does not work: exit status 1
    # Optional parts that are off (the embedding model): said, with their fix, but the install is healthy.
    warnings: list[Problem] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, **self.data, "problems": [asdict(p) for p in self.problems],
                "warnings": [asdict(w) for w in self.warnings], "ok": not self.problems}


# ---------------------------------------------------------------- llama.cpp build


def llama_build() -> dict[str, Any]:
    """Version, system info, the backends compiled in (from the shared libraries) and GPU offload."""
    import llama_cpp

    # A GGML_BACKEND_DL build (the standalone app) registers its backends only here; before it,
    # system info is empty and the backends look "unknown". A no-op for a statically linked build.
    llama_cpp.llama_backend_init()
    info = llama_cpp.llama_print_system_info().decode(errors="replace").strip()
    lib_dir = Path(llama_cpp.__file__).parent / "lib"
    libs = sorted(p.name for p in lib_dir.iterdir()) if lib_dir.is_dir() else []
    return {
        "version": llama_cpp.__version__,
        "system_info": info,
        "lib_dir": str(lib_dir),
        "libraries": libs,
        "backends": compiled_backends(libs, info),
        "gpu_offload": bool(llama_cpp.llama_supports_gpu_offload()),
    }


def compiled_backends(libraries: list[str], system_info: str) -> list[str]:
    """Backend names from `libggml-<name>` libraries and the `NAME : ...` sections of system info.

    CPU-variant modules of a GGML_BACKEND_DL build (libggml-cpu-haswell.so, ...) count as "CPU".
    """
    found: set[str] = set()
    for name in libraries:
        m = re.match(r"(?:lib)?ggml-([a-z0-9]+)", name, re.IGNORECASE)
        if m and m.group(1).lower() not in ("base",):
            found.add(m.group(1).lower())
    for section in system_info.split("|"):
        m = re.match(r"\s*([A-Za-z0-9_]+)\s*:", section)
        if m:
            found.add(m.group(1).lower())
    canon = {b.lower(): b for b in ("CPU", "BLAS", "RPC", *_GPU_BACKENDS)}
    return sorted(canon.get(b, b.upper()) for b in found)


# ---------------------------------------------------------------- GPU devices


def gpu_devices() -> dict[str, Any]:
    """NVIDIA devices with memory and compute capability; probe "none" means we could not ask."""
    try:
        import pynvml  # from nvidia-ml-py

        pynvml.nvmlInit()
        try:
            devices = []
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                mem = pynvml.nvmlDeviceGetMemoryInfo(h)
                name = pynvml.nvmlDeviceGetName(h)
                try:
                    cc = "%d.%d" % pynvml.nvmlDeviceGetCudaComputeCapability(h)
                except Exception:
                    cc = None
                devices.append({"index": i, "name": name.decode() if isinstance(name, bytes) else str(name),
                                "memory_total": int(mem.total), "memory_free": int(mem.free),
                                "compute_capability": cc})
            return {"probe": "nvml", "devices": devices}
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        pass
    exe = shutil.which("nvidia-smi")
    if exe:
        try:
            out = subprocess.run(
                [exe, "--query-gpu=index,name,memory.total,memory.free,compute_cap", "--format=csv,noheader,nounits"],
                capture_output=True, text=True, timeout=10, check=True).stdout
            return {"probe": "nvidia-smi", "devices": parse_nvidia_smi(out)}
        except (OSError, subprocess.SubprocessError, ValueError):
            pass
    if sys.platform == "darwin":
        return {"probe": "none", "devices": "unknown",
                "note": "Apple GPUs share system memory; see RAM below."}
    return {"probe": "none", "devices": "unknown",
            "note": "neither NVML (pip install nvidia-ml-py) nor nvidia-smi is available"}


def parse_nvidia_smi(csv_text: str) -> list[dict[str, Any]]:
    """Rows of `index, name, memory.total, memory.free, compute_cap` (MiB, nounits)."""
    devices = []
    for line in csv_text.strip().splitlines():
        cols = [c.strip() for c in line.split(",")]
        if len(cols) < 4:
            continue
        cc = cols[4] if len(cols) > 4 and re.fullmatch(r"\d+\.\d+", cols[4]) else None
        devices.append({"index": int(cols[0]), "name": cols[1], "memory_total": int(cols[2]) << 20,
                        "memory_free": int(cols[3]) << 20, "compute_capability": cc})
    return devices


# ---------------------------------------------------------------- models


def settings_state() -> tuple[dict[str, Any], list[Problem], str | None]:
    """settings.toml and the environment, loaded as every other command loads them, and the active
    profile checked against the registry (a doctor that passed what `generate` refuses would send the
    user the wrong way). Its part of the report, its problems, and the active profile (None: the
    registry's default)."""
    from localspec.settings import load_settings, require_known_profile, settings_path

    state: dict[str, Any] = {"file": str(settings_path()), "ok": True, "error": None, "profile": None}
    try:
        settings = load_settings()
        state["profile"] = settings.profile
        require_known_profile(settings.profile)
    except ConfigError as exc:
        return {**state, "ok": False, "error": str(exc)}, [Problem(exc.cause, exc.fix or "")], None
    return state, [], settings.profile


def models_state(verify: bool, active: str | None = None) -> tuple[dict[str, Any], list[Problem], list[Problem]]:
    """Installed models with their verification state, and the active profile's fit (`active`, else
    the registry's default); its problems, then its warnings (a missing optional embedding model)."""
    from localspec.engine.offload import VramBudget
    from localspec.models import ModelManager, estimate_fit
    from localspec.models.fit import model_layers

    mm = ModelManager()
    problems: list[Problem] = []
    try:
        mm.registry  # noqa: B018 - read now: a broken overlay must not hide the rest of the report
    except ConfigError as exc:
        problems.append(Problem(exc.cause, exc.fix or "Fix or remove the overlay `models.toml`."))
        return {"installed": [], "default_profile": None, "embedding": None}, problems, []
    rows = []
    for row in mm.list(with_fit=False):
        manifest = mm.store.read_manifest(row.id)
        if manifest is None:
            continue
        if not row.installed:
            state = "incomplete"
            problems.append(Problem(f"Model {row.id!r} has missing or truncated files.",
                                    f"Run `localspec models pull {row.id} --force`."))
        elif verify:
            state = "verified" if mm.verify(row.id) else "corrupt"
            if state == "corrupt":
                problems.append(Problem(f"Model {row.id!r} does not match its recorded sha256.",
                                        f"Run `localspec models pull {row.id} --force`."))
        else:
            state = "size-checked"  # files present with their recorded sizes; --verify re-hashes
        rows.append({"id": row.id, "role": row.role, "state": state, "size": row.size,
                     "path": str(row.path) if row.path else None, "source": row.source})

    profile: dict[str, Any] = {}
    try:
        prof = mm.profile(active)
        name = active or mm.registry.default_profile
    except Exception as exc:  # a broken overlay must not hide the rest of the report
        problems.append(Problem(f"The model registry could not be read: {exc}.",
                                "Fix or remove the overlay `models.toml` in the config directory."))
        return {"installed": rows, "default_profile": None, "embedding": None}, problems, []
    profile = {"name": name, "target": prof.target, "draft": prof.draft, "embedding": prof.embedding,
               "n_ctx": prof.n_ctx}
    fits = {}
    paths: dict[str, Path] = {}
    for role, mid in (("target", prof.target), ("draft", prof.draft)):
        if not mid:
            continue
        path = mm.installed_path(mid)
        if path is None:
            problems.append(Problem(f"The active profile's {role} {mid!r} is not installed.",
                                    f"Run `localspec models pull --profile {name}`."))
            continue
        try:
            fits[role] = estimate_fit(path, n_ctx=prof.n_ctx)
            paths[role] = path
        except Exception as exc:
            problems.append(Problem(f"Could not read {mid!r} for the fit estimate: {exc}.",
                                    f"Run `localspec models verify {mid}`."))
    if fits:
        total = sum(f.total_bytes for f in fits.values())
        any_fit = next(iter(fits.values()))
        vram = any_fit.free_vram
        if vram is not None and total <= vram * 0.95:
            verdict = "fits in VRAM"
        elif total <= any_fit.free_ram * 0.9:
            verdict = "fits in RAM"
        else:
            verdict = "too large"
            problems.append(Problem(
                f"The active profile needs about {total / 1e9:.1f} GB but only "
                f"{any_fit.free_ram / 1e9:.1f} GB RAM is free.",
                "Close other programs, lower n_ctx in settings.toml, or choose a smaller profile."))
        profile["fit"] = {"total_bytes": total, "free_ram": any_fit.free_ram, "free_vram": vram,
                          "vram_probe": any_fit.vram_probe, "verdict": verdict,
                          "per_model": {r: f.to_dict() for r, f in fits.items()}}
        if vram is not None:  # the split a load with n_gpu_layers = -1 makes, target first
            budget = VramBudget(vram, model_layers)
            plans = {r: budget(str(p), n_cells=prof.n_ctx) for r, p in paths.items()}
            profile["offload"] = {r: plan.message if plan else "no plan from its header: llama.cpp's own split"
                                  for r, plan in plans.items()}
    embedding = None
    warnings: list[Problem] = []
    if prof.embedding:
        path = mm.installed_path(prof.embedding)
        embedding = {"id": prof.embedding, "installed": path is not None, "path": str(path) if path else None}
        if path is None:
            warnings.append(Problem(
                f"The embedding model {prof.embedding!r} is not installed: /v1/embeddings and the semantic "
                "cache are off.", f"Run `localspec models pull {prof.embedding}`."))
    return {"installed": rows, "default_profile": profile, "embedding": embedding}, problems, warnings


# ---------------------------------------------------------------- port


def port_free(host: str, port: int) -> bool:
    """Can we bind it the way the server will (SO_REUSEADDR, as uvicorn does)? A port out of range or a
    host that is no address of this machine is a usage error: no server could ever bind it."""
    if not 0 <= port <= 65535:
        raise UsageError(f"Invalid --port {port}: a port is 0 to 65535.", "See `localspec doctor --help`.")
    try:  # the address family as the server finds it: "::1" (or "[::1]", as serve takes it) is IPv6
        family, _, _, _, address = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as exc:
        raise UsageError(f"Invalid --host {host!r}: {exc.strerror}.",
                         "Give an address of this machine, e.g. 127.0.0.1 or 0.0.0.0.") from None
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(address)
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            if exc.errno == errno.EADDRNOTAVAIL:
                raise UsageError(f"Invalid --host {host!r}: it is not an address of this machine.",
                                 "Give an address of this machine, e.g. 127.0.0.1 or 0.0.0.0.") from None
            raise
    return True


# ---------------------------------------------------------------- the report


def diagnose(verify: bool = False, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> Report:
    free = port_free(host, port)  # first: a bad --host or --port fails before the slower probes
    problems: list[Problem] = []
    build = llama_build()
    gpu = gpu_devices()
    nvidia = isinstance(gpu["devices"], list) and len(gpu["devices"]) > 0
    apple_silicon = sys.platform == "darwin" and _machine() == "arm64"
    if not build["gpu_offload"]:
        if nvidia:
            problems.append(Problem("llama.cpp was built for the CPU only, so your NVIDIA GPU is unused.",
                                    _INSTALL_FIX))
        elif apple_silicon:
            problems.append(Problem("llama.cpp was built without Metal, so the Apple GPU is unused.", _INSTALL_FIX))
    offload_note = (
        "yes: layers are offloaded to the GPU" if build["gpu_offload"]
        else "no: this llama.cpp build runs on the CPU only"
    )
    paths = resolve_paths()
    path_info = {
        "config_dir": str(paths.config_dir), "data_dir": str(paths.data_dir), "cache_dir": str(paths.cache_dir),
        "models_dir": str(paths.models_dir), "settings_file": str(paths.settings_file),
        "settings_file_exists": paths.settings_file.is_file(), "user_registry": str(paths.user_registry),
        "user_registry_exists": paths.user_registry.is_file(),
    }
    settings, settings_problems, active = settings_state()
    problems += settings_problems
    models, model_problems, warnings = models_state(verify, active)
    problems += model_problems
    if not free:
        problems.append(Problem(f"Port {port} on {host} is in use, so `localspec serve` cannot bind it.",
                                f"Stop the program using it, or run `localspec serve --port {port + 1}`."))
    data = {
        "localspec": {"version": __version__, "python": sys.version.split()[0], "executable": sys.executable,
                      "platform": sys.platform, "machine": _machine()},
        "llama_cpp": {**build, "gpu_offload_note": offload_note},
        "gpu": gpu,
        "paths": path_info,
        "settings": settings,
        "models": models["installed"],
        "default_profile": models["default_profile"],
        "embedding": models["embedding"],
        "port": {"host": host, "port": port, "free": free},
    }
    return Report(data, problems, warnings)


def _machine() -> str:
    import platform

    return platform.machine()


def render_text(report: Report) -> str:
    d = report.to_dict()
    lc, gpu = d["llama_cpp"], d["gpu"]
    lines = [
        f"localspec {d['localspec']['version']} (Python {d['localspec']['python']}, {d['localspec']['platform']} "
        f"{d['localspec']['machine']})",
        f"llama-cpp-python {lc['version']}; backends: {', '.join(lc['backends']) or 'unknown'}",
        f"  system info: {lc['system_info']}",
        f"GPU offload: {lc['gpu_offload_note']}",
    ]
    if isinstance(gpu["devices"], list):
        if not gpu["devices"]:
            lines.append(f"GPU devices ({gpu['probe']}): none")
        for dev in gpu["devices"]:
            cc = f", compute {dev['compute_capability']}" if dev.get("compute_capability") else ""
            lines.append(f"GPU {dev['index']} ({gpu['probe']}): {dev['name']}, "
                         f"{dev['memory_free'] / 2**30:.1f} of {dev['memory_total'] / 2**30:.1f} GiB free{cc}")
    else:
        lines.append(f"GPU devices: unknown ({gpu.get('note', '')})")
    p = d["paths"]
    lines += [f"config: {p['config_dir']}", f"data:   {p['data_dir']}", f"models: {p['models_dir']}",
              f"cache:  {p['cache_dir']}"]
    settings = d["settings"]
    lines.append(f"settings: {settings['file']}: {'ok' if settings['ok'] else 'refused (see the problems)'}")
    lines.append("models:" if d["models"] else "models: none installed")
    for m in d["models"]:
        size = f"{m['size'] / 1e6:.0f} MB" if m["size"] else "?"
        hint = " (sizes match; `localspec doctor --verify` re-hashes)" if m["state"] == "size-checked" else ""
        lines.append(f"  {m['id']} ({m['role']}, {size}): {m['state']}{hint}")
    prof = d["default_profile"]
    if prof:
        fit = prof.get("fit")
        verdict = f"{fit['verdict']} (needs ~{fit['total_bytes'] / 1e9:.1f} GB)" if fit else "not installed"
        lines.append(f"active profile {prof['name']!r}: {prof['target']} + {prof['draft']} at n_ctx "
                     f"{prof['n_ctx']}: {verdict}")
        for role, note in (prof.get("offload") or {}).items():
            lines.append(f"  {role}: {note}")
    emb = d["embedding"]
    if emb:
        lines.append(f"embedding model {emb['id']}: {'installed' if emb['installed'] else 'missing'}")
    port = d["port"]
    lines.append(f"port {port['host']}:{port['port']}: {'free' if port['free'] else 'in use'}")
    if d["problems"]:
        lines.append(f"{len(d['problems'])} problem(s):")
        for prob in d["problems"]:
            lines += [f"  - {prob['cause']}", f"    fix: {prob['fix']}"]
    else:
        lines.append("no problems found")
    for warning in d["warnings"]:
        lines += [f"warning (optional): {warning['cause']}", f"    fix: {warning['fix']}"]
    return "\n".join(lines)
