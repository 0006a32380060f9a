"""GPU partial offload: the layer split for free VRAM, and its wiring into model loading."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass

import pytest

from localspec.engine import loading
from localspec.engine.config import EngineConfig
from localspec.engine.offload import ALL_LAYERS, ModelLayers, OffloadPlan, VramBudget, plan_offload
from localspec.engine.runtime import RuntimeConfig
from localspec.models.fit import model_layers, vram_planner
from localspec.models.gguf_info import read_header
from tests.gguf_factory import F32_4x4, LLAMA_KV, crafted_gguf, g_kv_u32, g_tensor, make_gguf

GiB = 2**30
MiB = 2**20


def layers(n: int, size: int = 300 * MiB, *, kv_cell: int = 0, output: int = 200 * MiB,
           compute: int = 500 * MiB) -> ModelLayers:
    return ModelLayers(layer_bytes=(size,) * n, output_bytes=output, kv_bytes_per_cell=kv_cell, compute_bytes=compute)


def test_all_layers_fit():
    m = layers(28)  # 28 * 300 MiB + 200 MiB + 500 MiB = 8.9 GiB
    plan = plan_offload(m, free_vram=16 * GiB, n_cells=4096)
    assert plan.n_gpu_layers == ALL_LAYERS and plan.offloaded == 28
    assert plan.gpu_bytes == plan.total_bytes == 28 * 300 * MiB + 700 * MiB
    assert plan.message == "offloading all 28 layers (8.9 GiB): free VRAM 16.0 GiB"


def test_partial_offload_counts_the_layers_that_fit():
    m = layers(28)
    plan = plan_offload(m, free_vram=6 * GiB, n_cells=4096)
    # 95% of 6 GiB less the 500 MiB reserve: 5336 MiB, so 17 layers of 300 MiB (5100 MiB).
    assert (plan.n_gpu_layers, plan.offloaded, plan.n_layers) == (17, 17, 28)
    assert plan.gpu_bytes == 17 * 300 * MiB + 500 * MiB
    assert plan.message == "offloading 17 of 28 layers (5.5 of 8.9 GiB): free VRAM 6.0 GiB"


def test_every_layer_but_not_the_output_head():
    m = layers(4, 1 * GiB, output=2 * GiB, compute=0)
    plan = plan_offload(m, free_vram=5 * GiB, n_cells=0)  # 4.75 GiB: the layers, not the 2 GiB head
    assert plan.n_gpu_layers == 4 and plan.offloaded == 4


def test_none_fit_when_the_reserve_eats_the_memory():
    m = layers(28)
    plan = plan_offload(m, free_vram=600 * MiB, n_cells=4096)  # 570 MiB less 500: no room for 300
    assert (plan.n_gpu_layers, plan.offloaded, plan.gpu_bytes) == (0, 0, 0)
    assert plan.message.startswith("offloading 0 of 28 layers (0.0 of ")


def test_no_vram_at_all():
    plan = plan_offload(layers(8), free_vram=0, n_cells=512)
    assert plan.n_gpu_layers == 0 and plan.message.endswith("free VRAM 0.0 GiB")


def test_kv_cache_dominating_shrinks_the_split():
    small_kv = plan_offload(layers(28, kv_cell=0), free_vram=12 * GiB, n_cells=32768)
    # 32768 cells x 16 KiB = 512 MiB of KV per layer: each layer costs 812 MiB on the GPU.
    big_kv = plan_offload(layers(28, kv_cell=16 * 1024), free_vram=12 * GiB, n_cells=32768)
    assert small_kv.n_gpu_layers == ALL_LAYERS
    assert big_kv.n_gpu_layers == (int(12 * GiB * 0.95) - 500 * MiB) // (812 * MiB) == 13
    assert big_kv.total_bytes == 28 * 812 * MiB + 700 * MiB


def test_zero_layers():
    m = layers(0)
    assert plan_offload(m, free_vram=4 * GiB, n_cells=512).n_gpu_layers == ALL_LAYERS
    none = plan_offload(m, free_vram=100 * MiB, n_cells=512)
    assert (none.n_gpu_layers, none.n_layers) == (0, 0)


def test_layers_go_from_the_last_one_down():
    # The last layer is larger: llama.cpp offloads it first, so only it fits here.
    m = ModelLayers(layer_bytes=(100 * MiB, 100 * MiB, 900 * MiB), output_bytes=0, kv_bytes_per_cell=0,
                    compute_bytes=0)
    assert plan_offload(m, free_vram=1000 * MiB, n_cells=0).n_gpu_layers == 1


def test_budget_gives_the_draft_what_the_target_left():
    sizes = {"target": layers(10, 400 * MiB), "draft": layers(10, 100 * MiB)}
    budget = VramBudget(3 * GiB, lambda path: sizes[path])
    target = budget("target", n_cells=0)
    draft = budget("draft", n_cells=0)
    assert target.n_gpu_layers == (int(3 * GiB * 0.95) - 500 * MiB) // (400 * MiB)
    assert draft.free_vram == 3 * GiB - target.gpu_bytes
    assert budget.left == max(0, draft.free_vram - draft.gpu_bytes)


# ---------------------------------------------------------------- from the GGUF header


def test_model_layers_from_a_gguf(tmp_path):
    path = make_gguf(tmp_path / "m.gguf", n_layers=3, n_embd=16, n_head=4, n_head_kv=2)
    m = model_layers(path)
    assert m is not None
    assert m.layer_bytes == (16 * 16 * 4,) * 3  # one f32 attn_q per block
    assert m.output_bytes == 64 * 16 * 4  # no output.weight: the tied token embedding
    assert m.kv_bytes_per_cell == 2 * (4 + 4) * 2  # n_head_kv x (key + value head dims) x f16
    assert m.compute_bytes > 0


def _shards(d, block_count: int = 2, count: int = 2) -> list:
    """A split model: shard 1 holds the keys and layer 0, shard i holds layer i-1 (64 bytes each)."""
    split = [g_kv_u32("split.count", count), g_kv_u32("split.tensors.count", count)]
    keys = [*LLAMA_KV, g_kv_u32("llama.block_count", block_count), g_kv_u32("llama.embedding_length", 4),
            g_kv_u32("llama.attention.head_count", 1)]
    return [crafted_gguf(d / f"m-{i:05d}-of-{count:05d}.gguf",
                         [*(keys if i == 1 else []), g_kv_u32("split.no", i - 1), *split],
                         [g_tensor(f"blk.{i - 1}.attn_q.weight", (4, 4))], data=b"\0" * 64)
            for i in range(1, count + 1)]


def test_a_split_models_layers_are_summed_over_every_shard(tmp_path):
    first, second = _shards(tmp_path)
    m = model_layers(first)
    assert m is not None and m.layer_bytes == (64, 64)
    second.unlink()
    assert model_layers(first) is None  # a shard missing: no plan rather than half a model
    assert model_layers(read_header(first)) is None  # a header alone cannot see the other shards
    assert VramBudget(8 * GiB, model_layers)(str(first), n_cells=16) is None


def test_an_untrusted_block_count_plans_nothing(tmp_path):
    path = crafted_gguf(tmp_path / "huge.gguf", [*LLAMA_KV, g_kv_u32("llama.block_count", 100_000)], [F32_4x4],
                        data=b"\0" * 64)
    assert model_layers(path) is None


def test_no_planner_without_a_gpu():
    assert vram_planner(offload_supported=False, probe=lambda: (8 * GiB, "nvml")) is None
    assert vram_planner(offload_supported=True, probe=lambda: (None, "none")) is None
    planner = vram_planner(offload_supported=True, probe=lambda: (8 * GiB, "nvml"))
    assert isinstance(planner, VramBudget) and planner.left == 8 * GiB


def test_a_fresh_reading_of_free_vram_is_taken_when_asked(monkeypatch):
    from localspec.models import fit

    calls: list[list[str]] = []

    def smi(cmd, **kwargs):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, stdout=f"{1000 + len(calls)}\n", stderr="")

    monkeypatch.setitem(sys.modules, "pynvml", None)  # no NVML: nvidia-smi answers
    monkeypatch.setattr(fit.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(fit.subprocess, "run", smi)
    monkeypatch.setattr(fit, "_GPU_CACHE", None)
    assert fit.free_vram() == (1001 * MiB, "nvidia-smi")
    assert fit.free_vram() == (1001 * MiB, "nvidia-smi")  # within the TTL: the same reading
    # Around a load being measured, a reading from before it is of no use.
    assert fit.free_vram(max_age_s=0) == (1002 * MiB, "nvidia-smi") and len(calls) == 2


# ---------------------------------------------------------------- wiring into loading


@dataclass
class FakePlanner:
    plan: OffloadPlan | None
    asked: list[tuple[str, int]]

    def __call__(self, path: str, *, n_cells: int) -> OffloadPlan | None:
        self.asked.append((path, n_cells))
        return self.plan


def _plan(n: int) -> OffloadPlan:
    return OffloadPlan(n, n, 28, 1, 2, 3)


def test_minus_one_becomes_the_planned_count():
    planner = FakePlanner(_plan(18), [])
    rc, plan = loading.offloaded("m.gguf", RuntimeConfig(n_ctx=1000, n_seq_max=2, pinned_cells=24), planner)
    assert rc.n_gpu_layers == 18 and plan is planner.plan
    assert planner.asked == [("m.gguf", 2024)]  # every KV cell the context holds


@pytest.mark.parametrize("planner", [None, FakePlanner(None, [])])
def test_nothing_to_decide_keeps_minus_one(planner):
    rc, plan = loading.offloaded("m.gguf", RuntimeConfig(), planner)
    assert rc.n_gpu_layers == -1 and plan is None


def test_an_explicit_count_is_kept():
    planner = FakePlanner(_plan(18), [])
    rc, plan = loading.offloaded("m.gguf", RuntimeConfig(n_gpu_layers=7), planner)
    assert rc.n_gpu_layers == 7 and plan is None and not planner.asked


class _Loaded:
    def __init__(self, path, config, *, on_progress=None):
        self.path, self.config = path, config
        self.offload = None

    def close(self) -> None:
        pass


def test_load_runtimes_loads_both_models_with_their_split(monkeypatch, caplog):
    monkeypatch.setattr(loading, "ModelRuntime", _Loaded)
    plans = {"t.gguf": _plan(20), "d.gguf": _plan(5)}

    def planner(path: str, *, n_cells: int) -> OffloadPlan:
        return plans[path]

    with caplog.at_level("INFO", logger="localspec.engine.loading"):
        target, draft = loading.load_runtimes("t.gguf", "d.gguf", EngineConfig(), offload=planner)
    assert draft is not None
    assert (target.config.n_gpu_layers, draft.config.n_gpu_layers) == (20, 5)
    assert (target.offload, draft.offload) == (plans["t.gguf"], plans["d.gguf"])
    assert draft.config.lora_path is None and draft.config.pinned_cells == 0
    assert "t.gguf: offloading 20 of 28 layers" in caplog.text


# ---------------------------------------------------------------- doctor


def test_doctor_shows_the_split_the_load_would_make(monkeypatch, target_path, draft_path):
    import localspec.models.fit as fit
    from localspec.doctor import models_state

    monkeypatch.setattr(fit, "_GPU_CACHE", None)
    monkeypatch.setattr(fit, "free_vram", lambda: (700 * MiB, "nvml"))  # less than the pair needs
    state, _, _ = models_state(verify=False)
    offload = state["default_profile"]["offload"]
    target_layers = model_layers(target_path)
    assert offload["target"] == plan_offload(target_layers, free_vram=700 * MiB,
                                             n_cells=state["default_profile"]["n_ctx"]).message
    assert " of " in offload["target"] and offload["draft"].startswith("offloading ")


def test_doctor_without_vram_shows_no_split(monkeypatch, target_path):
    import localspec.models.fit as fit
    from localspec.doctor import models_state

    monkeypatch.setattr(fit, "_GPU_CACHE", None)
    monkeypatch.setattr(fit, "free_vram", lambda: (None, "none"))
    state, _, _ = models_state(verify=False)
    assert "offload" not in state["default_profile"]


def test_ps_says_where_a_model_runs_as_ollama_ps_does():
    from localspec.engine.offload import ALL_LAYERS, OffloadPlan
    from localspec.server.routes.ps import processor_split

    gib = 1 << 30
    partial = OffloadPlan(n_gpu_layers=18, offloaded=18, n_layers=28, gpu_bytes=6 * gib, total_bytes=9 * gib,
                          free_vram=7 * gib)
    whole = OffloadPlan(n_gpu_layers=ALL_LAYERS, offloaded=28, n_layers=28, gpu_bytes=9 * gib, total_bytes=9 * gib,
                        free_vram=20 * gib)
    assert processor_split(gpu=False, n_gpu_layers=-1, plan=None) == "100% CPU"
    assert processor_split(gpu=True, n_gpu_layers=0, plan=partial) == "100% CPU"
    assert processor_split(gpu=True, n_gpu_layers=18, plan=partial) == "33%/67% CPU/GPU"
    assert processor_split(gpu=True, n_gpu_layers=-1, plan=whole) == "100% GPU"
    assert processor_split(gpu=True, n_gpu_layers=-1, plan=None) == "100% GPU"
    assert processor_split(gpu=True, n_gpu_layers=12, plan=None) == "GPU (12 layers) + CPU"
