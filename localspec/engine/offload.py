"""How many of a model's layers go to the GPU: the split llama.cpp's `n_gpu_layers = -1` does not make.

With -1 llama.cpp puts every layer on the GPU, and a model larger than free VRAM then fails to
load. Like Ollama, the engine instead asks how much VRAM is free and offloads the last layers
that fit (llama.cpp offloads layers from the end: layer i goes to the GPU when i >= n - k), each
with its share of the KV cache, after a reserve for compute buffers. The output head goes too
only when every layer does (llama.cpp's n_gpu_layers = n + 1). Pure arithmetic: the sizes come
from the GGUF header (localspec.models.fit) and free VRAM from an injectable probe.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

ALL_LAYERS = -1  # llama.cpp's "every layer and the output head"
VRAM_SPARE = 0.05  # of free VRAM kept unplanned: drivers and other programs move it


@dataclass(frozen=True)
class ModelLayers:
    """What a model puts on the GPU, from its GGUF header."""

    layer_bytes: tuple[int, ...]  # weights of each repeating block, in order
    output_bytes: int  # the output head (and its norm): offloaded only with every layer
    kv_bytes_per_cell: int  # one layer's K and V for one context cell
    compute_bytes: int  # the reserve for compute buffers (logits, attention scratch)

    @property
    def weights_bytes(self) -> int:
        return sum(self.layer_bytes) + self.output_bytes


@dataclass(frozen=True)
class OffloadPlan:
    """The split: `n_gpu_layers` for llama.cpp, and what it puts where."""

    n_gpu_layers: int  # ALL_LAYERS, or how many of the last layers
    offloaded: int  # layers on the GPU
    n_layers: int
    gpu_bytes: int  # weights, KV cache and compute reserve on the GPU
    total_bytes: int  # the same if every layer went
    free_vram: int

    @property
    def message(self) -> str:
        """One line for the load log and `doctor`: "offloading 18 of 28 layers (6.1 of 9.4 GiB): free VRAM 6.5 GiB"."""
        if self.n_gpu_layers == ALL_LAYERS:
            what = f"all {self.n_layers} layers ({_gib(self.gpu_bytes)} GiB)"
        else:
            sizes = f"{_gib(self.gpu_bytes)} of {_gib(self.total_bytes)} GiB"
            what = f"{self.offloaded} of {self.n_layers} layers ({sizes})"
        return f"offloading {what}: free VRAM {_gib(self.free_vram)} GiB"


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f}"


def plan_offload(layers: ModelLayers, *, free_vram: int, n_cells: int) -> OffloadPlan:
    """The most layers that fit `free_vram` with their KV cache for `n_cells` context cells.

    Nothing is offloaded when not even the compute reserve and one layer fit: a GPU context that
    holds no layer only costs memory."""
    free_vram = max(0, free_vram)
    n_cells = max(0, n_cells)
    kv_layer = layers.kv_bytes_per_cell * n_cells
    budget = int(free_vram * (1 - VRAM_SPARE)) - layers.compute_bytes
    total = layers.weights_bytes + kv_layer * len(layers.layer_bytes) + layers.compute_bytes
    n = len(layers.layer_bytes)
    if total - layers.compute_bytes <= budget:
        return OffloadPlan(ALL_LAYERS, n, n, total, total, free_vram)
    used, k = 0, 0
    for size in reversed(layers.layer_bytes):  # llama.cpp offloads from the last layer down
        if used + size + kv_layer > budget:
            break
        used += size + kv_layer
        k += 1
    gpu = used + layers.compute_bytes if k else 0
    return OffloadPlan(k, k, n, gpu, total, free_vram)


class OffloadPlanner(Protocol):
    """Plans one model's split, or None when there is nothing to decide (no GPU, VRAM unknown)."""

    def __call__(self, path: str, *, n_cells: int) -> OffloadPlan | None: ...


class VramBudget:
    """An OffloadPlanner over one reading of free VRAM, shared by the models loaded together: the
    target plans first, and the draft gets what the target's plan left."""

    def __init__(self, free_vram: int, read_layers: Callable[[str], ModelLayers | None]) -> None:
        self.left = max(0, free_vram)
        self._read_layers = read_layers

    def __call__(self, path: str, *, n_cells: int) -> OffloadPlan | None:
        layers = self._read_layers(path)
        if layers is None:  # its header cannot tell the layers: llama.cpp's own -1, nothing reserved
            return None
        plan = plan_offload(layers, free_vram=self.left, n_cells=n_cells)
        self.left = max(0, self.left - plan.gpu_bytes)
        return plan
