"""Loading the models an engine runs: the runtimes' settings from the engine's config, and the
check that a draft can speak for the target."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

from localspec.engine.config import EngineConfig, output_rows
from localspec.engine.events import ProgressFn
from localspec.engine.offload import ALL_LAYERS, OffloadPlan, OffloadPlanner
from localspec.engine.runtime import ModelRuntime, RuntimeConfig
from localspec.errors import IncompatibleDraftError

logger = logging.getLogger(__name__)

# llama.cpp accepts a draft whose vocabulary differs from the target's by up to this many tokens.
MAX_VOCAB_DIFFERENCE = 128


def runtime_config(config: EngineConfig) -> RuntimeConfig:
    return RuntimeConfig(
        n_ctx=config.n_ctx, n_seq_max=config.parallel, pinned_cells=config.pinned_prefix_cells,
        n_batch=config.n_batch, n_ubatch=config.n_batch, n_outputs_max=output_rows(config),
        n_threads=config.n_threads, n_gpu_layers=config.n_gpu_layers, flash_attn=config.flash_attn,
        lora_path=config.lora_path, lora_scale=config.lora_scale, repack_weights=config.repack_weights,
        mmap=config.mmap,
    )


def offloaded(path: str, rc: RuntimeConfig, offload: OffloadPlanner | None) -> tuple[RuntimeConfig, OffloadPlan | None]:
    """`rc` with "all layers" (-1) replaced by the count that fits free VRAM, when a planner knows it;
    an explicit count is the user's choice and stays."""
    if offload is None or rc.n_gpu_layers != ALL_LAYERS:
        return rc, None
    plan = offload(path, n_cells=rc.n_ctx * rc.n_seq_max + rc.pinned_cells)
    if plan is None:
        return rc, None
    logger.info("%s: %s", Path(path).name, plan.message)
    return replace(rc, n_gpu_layers=plan.n_gpu_layers), plan


def load_runtimes(target_path: str, draft_path: str | None, config: EngineConfig, *,
                  on_progress: ProgressFn | None = None,
                  offload: OffloadPlanner | None = None) -> tuple[ModelRuntime, ModelRuntime | None]:
    """The target and (if given) the draft, loaded; nothing stays loaded when either fails.

    `offload` splits layers between GPU and CPU when n_gpu_layers is -1 (None: llama.cpp's own -1)."""
    rc, plan = offloaded(target_path, runtime_config(config), offload)
    target = ModelRuntime(target_path, rc, on_progress=on_progress)
    target.offload = plan
    if not draft_path:
        return target, None
    try:
        # The draft asks for one logits row per sequence and step (16 when calibrating).
        draft_rc = replace(runtime_config(config), lora_path=None, pinned_cells=0,
                           n_outputs_max=max(config.parallel, 16))
        draft_rc, draft_plan = offloaded(draft_path, draft_rc, offload)
        draft = ModelRuntime(draft_path, draft_rc, on_progress=on_progress)
        draft.offload = draft_plan
        return target, draft
    except BaseException:
        target.close()
        raise


def check_vocabularies(target: ModelRuntime, draft: ModelRuntime) -> None:
    diff = abs(draft.n_vocab - target.n_vocab)
    if diff > MAX_VOCAB_DIFFERENCE:
        raise IncompatibleDraftError(
            f"The draft's vocabulary has {draft.n_vocab} tokens and the target's {target.n_vocab} "
            f"(a difference of {diff}; at most {MAX_VOCAB_DIFFERENCE} is tolerated).",
            "Use a draft model of the target's family with the same tokenizer.",
        )
