"""Will a model fit? Weights + KV cache + compute buffers against free RAM and VRAM.

An estimate, not a promise: llama.cpp's real compute buffer depends on batch sizes and backend.
The allowance below errs on the generous side so "fits" is rarely wrong.
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from localspec.errors import IntegrityError
from localspec.models.gguf_info import GGUFMeta, read_header
from localspec.models.gguf_summary import GGUFInfo, info_from_meta, read_gguf_info

if TYPE_CHECKING:  # the engine package pulls in jinja2 and pydantic: `models list` need not
    from localspec.engine.offload import ModelLayers, VramBudget

logger = logging.getLogger(__name__)

N_UBATCH = 512  # llama.cpp's default micro-batch: logits buffer is n_ubatch x n_vocab floats
MIN_COMPUTE = 256 * 1024 * 1024
_GPU_CACHE: tuple[float, int | None, str] | None = None
_GPU_TTL = 5.0  # seconds; `list` asks once per installed model


@dataclass(frozen=True)
class FitEstimate:
    weights_bytes: int
    kv_bytes: int
    compute_bytes: int
    n_ctx: int
    free_ram: int
    free_vram: int | None  # None: no GPU found or no way to ask
    vram_probe: str  # "nvml", "nvidia-smi" or "none"
    verdict: str  # "fits in VRAM" | "fits in RAM" | "too large"

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.compute_bytes

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["total_bytes"] = self.total_bytes
        return d


def free_ram() -> int:
    import psutil

    return int(psutil.virtual_memory().available)


def free_vram(*, max_age_s: float = _GPU_TTL) -> tuple[int | None, str]:
    """Free memory of the first GPU: NVML when installed, else nvidia-smi, else unknown. A reading
    up to `max_age_s` old is reused (0: read it now, as around a load that is being measured)."""
    global _GPU_CACHE
    now = time.monotonic()
    if _GPU_CACHE and now - _GPU_CACHE[0] < max_age_s:
        return _GPU_CACHE[1], _GPU_CACHE[2]
    value: int | None = None
    probe = "none"
    try:
        import pynvml  # from nvidia-ml-py

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            value, probe = int(pynvml.nvmlDeviceGetMemoryInfo(handle).free), "nvml"
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        exe = shutil.which("nvidia-smi")
        if exe:
            try:
                out = subprocess.run([exe, "--query-gpu=memory.free", "--format=csv,noheader,nounits"],
                                     capture_output=True, text=True, timeout=5, check=True).stdout
                value, probe = int(out.split()[0]) * 1024 * 1024, "nvidia-smi"
            except (OSError, subprocess.SubprocessError, ValueError, IndexError):
                pass
    _GPU_CACHE = (now, value, probe)
    return value, probe


def estimate_fit(model: Path | str | GGUFInfo, n_ctx: int = 4096, ram: int | None = None,
                 vram: int | None = None, kv_bytes_per_value: int = 2) -> FitEstimate:
    """``ram``/``vram`` override the probes (tests, or planning for another machine)."""
    info = model if isinstance(model, GGUFInfo) else read_gguf_info(model)
    weights = info.file_size
    per_tok = info.kv_bytes_per_token(kv_bytes_per_value) or 0
    kv = n_ctx * per_tok
    compute = compute_allowance(weights, info.vocab_size or 0)
    if ram is None:
        ram = free_ram()
    probe = "given"
    if vram is None:
        vram, probe = free_vram()
    verdict = fit_verdict(weights + kv + compute, ram, vram)
    return FitEstimate(weights, kv, compute, n_ctx, ram, vram, probe, verdict)


def compute_allowance(weights: int, vocab_size: int = 0) -> int:
    """Compute buffers beside the weights: generous, so that "fits" is rarely wrong."""
    return max(MIN_COMPUTE, weights // 10) + N_UBATCH * vocab_size * 4


def fit_verdict(total: int, ram: int, vram: int | None) -> str:
    """"fits in VRAM", "fits in RAM" or "too large", keeping 5% of VRAM and 10% of RAM spare."""
    if vram is not None and total <= vram * 0.95:
        return "fits in VRAM"
    if total <= ram * 0.9:
        return "fits in RAM"
    return "too large"


def fit_verdict_for_size(file_bytes: int, ram: int | None = None, vram: int | None = None) -> str:
    """The verdict for a model known only by its file size (before its header is read): weights and
    the compute allowance; the KV cache is not counted, so a long context can still not fit."""
    if ram is None:
        ram = free_ram()
    if vram is None:
        vram, _ = free_vram()
    return fit_verdict(file_bytes + compute_allowance(file_bytes), ram, vram)


# ---------------------------------------------------------------- GPU offload


_BLOCK = re.compile(r"blk\.(\d+)\.")
# llama.cpp's name for shard N of a split model (llama_split_path): the others sit beside the first.
_SHARD = re.compile(r"(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf", re.IGNORECASE)
MAX_LAYERS = 4096  # far above any model's blocks: an untrusted block_count past it plans nothing


def model_layers(model: Path | str | GGUFMeta, kv_bytes_per_value: int = 2) -> ModelLayers | None:
    """A model's per-layer weights, output head, per-cell KV and compute reserve, from its header;
    None (no plan: llama.cpp's own -1) when the header cannot tell them, said in the log.

    Tensors named blk.N.* are layer N's. The output head is output.weight, or the token embedding
    when the model ties them (llama.cpp then puts a copy beside the output); the input embedding
    itself always stays on the CPU. A split model's tensors are summed over every shard."""
    from localspec.engine.offload import ModelLayers

    meta = model if isinstance(model, GGUFMeta) else read_header(model)
    info = info_from_meta(meta)
    n_layers = info.block_count or 0
    if n_layers > MAX_LAYERS:
        logger.warning("%s: block_count %d is past %d: no GPU offload plan", meta.path.name, n_layers, MAX_LAYERS)
        return None
    tensors = list(meta.tensors)
    count = meta.get("split.count", 1)
    if isinstance(count, int) and count > 1:
        rest = None if isinstance(model, GGUFMeta) else _other_shards(Path(model), count)
        if rest is None:
            logger.warning("%s: a split model whose %d shards cannot all be read beside it: no GPU offload plan",
                           meta.path.name, count)
            return None
        tensors += [t for shard in rest for t in shard.tensors]
    per_layer = [0] * n_layers
    sizes: dict[str, int] = {}
    for t in tensors:
        m = _BLOCK.match(t.name)
        if m and int(m.group(1)) < n_layers:
            per_layer[int(m.group(1))] += t.n_bytes
        else:
            sizes[t.name] = t.n_bytes
    head = sizes.get("output.weight", sizes.get("token_embd.weight", 0)) + sizes.get("output_norm.weight", 0)
    per_cell_all = info.kv_bytes_per_token(kv_bytes_per_value) or 0
    return ModelLayers(
        layer_bytes=tuple(per_layer), output_bytes=head,
        kv_bytes_per_cell=per_cell_all // n_layers if n_layers else 0,
        compute_bytes=compute_allowance(sum(per_layer) + head, info.vocab_size or 0),
    )


def _other_shards(first: Path, count: int) -> list[GGUFMeta] | None:
    """The headers of shards 2..count of the split model whose first shard is `first`; None when
    its name is not a first shard's of `count`, or a shard is missing or not a GGUF."""
    m = _SHARD.fullmatch(first.name)
    if m is None or int(m["no"]) != 1 or int(m["count"]) != count:
        return None
    try:
        return [read_header(first.with_name(f"{m['stem']}-{i:05d}-of-{count:05d}.gguf")) for i in range(2, count + 1)]
    except (IntegrityError, OSError):
        return None


def vram_planner(*, offload_supported: bool,
                 probe: Callable[[], tuple[int | None, str]] = free_vram) -> VramBudget | None:
    """The engine's OffloadPlanner for this machine: None where nothing is to decide (a CPU build, or
    no GPU whose free memory can be read), so n_gpu_layers stays as configured."""
    from localspec.engine.offload import VramBudget

    if not offload_supported:
        return None
    free, _ = probe()
    return None if free is None else VramBudget(free, model_layers)

