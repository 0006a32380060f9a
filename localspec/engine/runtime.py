"""One llama.cpp model and context, driven through llama-cpp-python's low-level API.

Why not `llama_cpp.Llama`: it has no second-model drafter, and speculative use forces
`logits_all`, which keeps n_ctx x n_vocab floats (1.2 GB at 2k context for Qwen). Here a decode
asks for logits only on the rows that need them, and the output buffer is sized to those rows.

Every batch is checked before `llama_decode`: a bad token id, position or sequence id trips a
GGML_ASSERT inside llama.cpp, which aborts the whole process instead of raising.
"""

from __future__ import annotations

import ctypes
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np

from localspec.engine import llama_log
from localspec.engine.events import LoadStage, ProgressFn, StageReporter
from localspec.engine.offload import OffloadPlan
from localspec.errors import LocalspecError

logger = logging.getLogger(__name__)

_backend_ready = False


@dataclass(frozen=True)
class RuntimeConfig:
    """How to load one model. The engine's pydantic config fills this in."""

    n_ctx: int = 4096  # tokens per sequence slot
    n_seq_max: int = 1  # parallel sequences sharing this context
    # Cells for one more sequence (id n_seq_max) that only holds a pinned prompt prefix, copied into
    # a slot when a request starts with it (Engine: pin_prefix). 0: no such sequence.
    pinned_cells: int = 0
    n_batch: int = 512  # most tokens in one llama_decode call
    n_ubatch: int = 512
    n_outputs_max: int = 64  # most rows that may ask for logits in one call
    n_threads: int | None = None
    n_gpu_layers: int = -1  # all layers when the build can offload; ignored on CPU builds
    flash_attn: str = "auto"  # auto | on | off
    lora_path: str | None = None
    lora_scale: float = 1.0
    # llama.cpp's CPU "repack" rearranges quantized weights for faster single-row matmuls
    # (measured 38 vs 47 ms per token on the 1.5B here). With the file memory-mapped, the
    # repacked tensors' original pages stay resident too (+600 MB RSS), so by default the
    # weights are read into memory instead of mapped: repack speed at the memory of one copy.
    repack_weights: bool = True
    mmap: bool = False


@dataclass(frozen=True)
class Row:
    """One token in a batch: which sequence, where, and whether its logits are wanted."""

    token: int
    pos: int
    seq: int
    logits: bool = False


_FLASH = {
    "auto": llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO,
    "on": llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
    "off": llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED,
}


def gpu_offload_supported() -> bool:
    """Whether this llama.cpp build can put layers on a GPU (a CPU build ignores n_gpu_layers)."""
    return bool(llama_cpp.llama_supports_gpu_offload())


class _LoadCallback:
    """llama.cpp's model-load progress callback around a StageReporter.

    The ctypes function is kept on this object for as long as the load runs (ctypes does not keep
    it alive). Returning True continues the load; an interrupt (Ctrl+C) raised while Python runs
    the callback is kept, the load is stopped, and `raise_interrupt` re-raises it afterwards.
    """

    def __init__(self, reporter: StageReporter) -> None:
        self.reporter = reporter
        self.interrupt: BaseException | None = None
        self.c_callback = llama_cpp.llama_progress_callback(self._called)

    def _called(self, fraction: float, _user_data: ctypes.c_void_p) -> bool:  # pragma: no cover - from C
        try:
            self.reporter.report(fraction)  # never raises an Exception
            return True
        except BaseException as exc:  # KeyboardInterrupt, SystemExit: stop the load cleanly
            self.interrupt = exc
            return False

    def raise_interrupt(self) -> None:
        if self.interrupt is not None:
            raise self.interrupt


def _tokenize(vocab: Any, text: str, add_special: bool, parse_special: bool) -> list[int]:
    data = text.encode("utf-8")
    cap = len(data) + 16
    buf = (llama_cpp.llama_token * cap)()
    n = llama_cpp.llama_tokenize(vocab, data, len(data), buf, cap, add_special, parse_special)
    if n < 0:
        cap = -n
        buf = (llama_cpp.llama_token * cap)()
        n = llama_cpp.llama_tokenize(vocab, data, len(data), buf, cap, add_special, parse_special)
    return list(buf[:n])


def _piece(vocab: Any, token: int) -> bytes:
    buf = ctypes.create_string_buffer(64)
    n = llama_cpp.llama_token_to_piece(vocab, token, buf, len(buf), 0, False)
    if n < 0:
        buf = ctypes.create_string_buffer(-n)
        n = llama_cpp.llama_token_to_piece(vocab, token, buf, len(buf), 0, False)
    return buf.raw[:n]


class Vocabulary:
    """A model's tokenizer and trained context alone (llama.cpp's vocab-only load reads no weights):
    enough to size a context before loading the model into one."""

    def __init__(self, path: str | os.PathLike) -> None:
        global _backend_ready
        llama_log.install()
        if not _backend_ready:
            llama_cpp.llama_backend_init()
            _backend_ready = True
        mparams = llama_cpp.llama_model_default_params()
        mparams.vocab_only = True
        self._model = llama_cpp.llama_model_load_from_file(str(path).encode(), mparams)
        if not self._model:
            raise LocalspecError(f"llama.cpp could not read the vocabulary of {path}.",
                                 "Run `localspec models verify` and re-pull the model if its hash is wrong.")
        self._vocab = llama_cpp.llama_model_get_vocab(self._model)
        # A vocab-only load skips the hyperparameters (llama_model_n_ctx_train reads 0): the GGUF's
        # own key says it.
        self.n_ctx_train = int(self._meta(f"{self._meta('general.architecture')}.context_length") or 0)

    def _meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(256)
        n = llama_cpp.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", errors="replace") if n >= 0 else None

    def tokenize(self, text: str, add_special: bool = False, parse_special: bool = False) -> list[int]:
        return _tokenize(self._vocab, text, add_special, parse_special)

    def piece(self, token: int) -> bytes:
        """The bytes a token stands for, as ModelRuntime.piece (a prediction's tokenizer, without weights)."""
        return _piece(self._vocab, token)

    def close(self) -> None:
        if self._model:
            llama_cpp.llama_model_free(self._model)
            self._model = None

    def __enter__(self) -> Vocabulary:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ModelRuntime:
    """A loaded GGUF model with one context holding `n_seq_max` sequences."""

    def __init__(self, path: str | os.PathLike, config: RuntimeConfig = RuntimeConfig(), *,
                 on_progress: ProgressFn | None = None) -> None:
        global _backend_ready
        llama_log.install()
        if not _backend_ready:
            llama_cpp.llama_backend_init()
            _backend_ready = True
        self.path = Path(path)
        self.config = config
        self.offload: OffloadPlan | None = None  # set by the loader when it split the layers
        if not self.path.is_file():
            raise LocalspecError(
                f"Model file not found: {self.path}.",
                "Install it with `localspec models pull <id>` (see `localspec models list`).",
            )
        mparams = llama_cpp.llama_model_default_params()
        mparams.n_gpu_layers = config.n_gpu_layers if llama_cpp.llama_supports_gpu_offload() else 0
        mparams.use_extra_bufts = config.repack_weights
        mparams.load_mode = llama_cpp.LLAMA_LOAD_MODE_MMAP if config.mmap else llama_cpp.LLAMA_LOAD_MODE_NONE
        progress = None
        if on_progress is not None:
            progress = _LoadCallback(StageReporter(on_progress, LoadStage.LOAD_MODEL, self.path.stem))
            mparams.progress_callback = progress.c_callback
        self._model = llama_cpp.llama_model_load_from_file(str(self.path).encode(), mparams)
        if progress is not None:
            progress.raise_interrupt()  # Ctrl+C during the load stopped it: hand the interrupt on
        if not self._model:
            raise LocalspecError(
                f"llama.cpp could not load {self.path} (corrupt file or unsupported architecture).",
                "Run `localspec models verify` and re-pull the model if its hash is wrong.",
            )
        self._ctx = None
        self._lora = None
        self._batch = None
        try:
            self._vocab = llama_cpp.llama_model_get_vocab(self._model)
            self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self._vocab))
            self.n_ctx_train = int(llama_cpp.llama_model_n_ctx_train(self._model))
            self.n_ctx_seq = config.n_ctx
            threads = config.n_threads or max(1, os.cpu_count() or 1)
            cparams = llama_cpp.llama_context_default_params()
            # One unified KV buffer shared by all slots: any slot may use up to n_ctx tokens as
            # long as the slots together stay within n_ctx * n_seq_max.
            cparams.n_ctx = config.n_ctx * config.n_seq_max + config.pinned_cells
            cparams.n_seq_max = config.n_seq_max + (1 if config.pinned_cells else 0)
            cparams.kv_unified = True
            cparams.n_batch = config.n_batch
            cparams.n_ubatch = min(config.n_ubatch, config.n_batch)
            cparams.n_outputs_max = config.n_outputs_max
            cparams.n_threads = threads
            cparams.n_threads_batch = threads
            cparams.flash_attn_type = _FLASH[config.flash_attn]
            cparams.no_perf = True
            self._ctx = llama_cpp.llama_init_from_model(self._model, cparams)
            if not self._ctx:
                raise LocalspecError(
                    f"llama.cpp could not create a context of {cparams.n_ctx} tokens for {self.path.name}.",
                    "Lower n_ctx or the number of parallel slots.",
                )
            self._mem = llama_cpp.llama_get_memory(self._ctx)
            self.n_threads = threads
            if config.lora_path:
                self._apply_lora(config.lora_path, config.lora_scale)
            self._batch = llama_cpp.llama_batch_init(config.n_batch, 0, 1)
        except BaseException:
            self.close()
            raise
        self.eos = int(llama_cpp.llama_vocab_eos(self._vocab))
        self.bos = int(llama_cpp.llama_vocab_bos(self._vocab))
        self.add_bos = bool(llama_cpp.llama_vocab_get_add_bos(self._vocab))
        self._piece_cache: dict[int, bytes] = {}

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        if self._batch is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx:
            llama_cpp.llama_free(self._ctx)
            self._ctx = None
        if getattr(self, "_model", None):
            llama_cpp.llama_model_free(self._model)
            self._model = None

    def __del__(self) -> None:  # pragma: no cover - best effort at interpreter exit
        try:
            self.close()
        except Exception:
            pass

    def _apply_lora(self, path: str, scale: float) -> None:
        self._lora = llama_cpp.llama_adapter_lora_init(self._model, str(path).encode())
        if not self._lora:
            raise LocalspecError(f"Could not load LoRA adapter {path}.", "Check the adapter matches the model.")
        adapters = (llama_cpp.llama_adapter_lora_p_ctypes * 1)(self._lora)
        scales = (ctypes.c_float * 1)(scale)
        llama_cpp.llama_set_adapters_lora(self._ctx, adapters, 1, scales)

    # ------------------------------------------------------------------ metadata

    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(4096)
        n = llama_cpp.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", errors="replace") if n >= 0 else None

    @property
    def chat_template(self) -> str | None:
        raw = llama_cpp.llama_model_chat_template(self._model, None)
        return raw.decode("utf-8") if raw else None

    def is_eog(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))

    def token_text(self, token: int) -> str:
        """The vocabulary's raw text of a token (used to find special tokens by name)."""
        raw = llama_cpp.llama_vocab_get_text(self._vocab, token)
        return raw.decode("utf-8", errors="replace") if raw else ""

    # ------------------------------------------------------------------ text

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return _tokenize(self._vocab, text, add_special, parse_special)

    def piece(self, token: int) -> bytes:
        """The bytes a token stands for (may be part of a multi-byte character)."""
        cached = self._piece_cache.get(token)
        if cached is None:
            cached = self._piece_cache[token] = _piece(self._vocab, token)
        return cached

    def detokenize(self, tokens: list[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", errors="replace")

    # ------------------------------------------------------------------ KV cache

    def seq_rm(self, seq: int, p0: int, p1: int = -1) -> None:
        """Drop positions [p0, p1) of a sequence: the rollback after a rejected draft."""
        if not llama_cpp.llama_memory_seq_rm(self._mem, seq, p0, p1):
            raise RuntimeError(f"llama.cpp could not remove positions {p0}..{p1} of sequence {seq}")

    def seq_cp(self, src: int, dst: int, p0: int = 0, p1: int = -1) -> None:
        """Make positions [p0, p1) of `src` part of `dst` too. The KV buffer is unified, so the cells
        are shared, not copied: this costs no compute and no memory."""
        llama_cpp.llama_memory_seq_cp(self._mem, src, dst, p0, p1)

    def seq_pos_max(self, seq: int) -> int:
        return int(llama_cpp.llama_memory_seq_pos_max(self._mem, seq))

    # ------------------------------------------------------------------ decode

    def decode(self, rows: list[Row]) -> np.ndarray:
        """Run one batch; return the logits of the rows that asked for them, in row order.

        A batch with more than n_batch rows, or more than n_outputs_max rows asking for logits, is
        split into consecutive parts (later rows see the KV cells earlier parts wrote); each part is
        checked before llama.cpp sees it.
        """
        outputs: list[np.ndarray] = []
        for part in self._parts(rows):
            n_out = self._fill_batch(part)
            rc = llama_cpp.llama_decode(self._ctx, self._batch)
            if rc != 0:
                raise RuntimeError(
                    f"llama_decode failed with code {rc} ({'no KV slot: context full' if rc == 1 else 'see log'})"
                )
            if n_out:
                ptr = llama_cpp.llama_get_logits(self._ctx)
                outputs.append(np.ctypeslib.as_array(ptr, shape=(n_out, self.n_vocab)).copy())
        if not outputs:
            return np.empty((0, self.n_vocab), dtype=np.float32)
        return outputs[0] if len(outputs) == 1 else np.concatenate(outputs)

    def _parts(self, rows: list[Row]) -> list[list[Row]]:
        parts: list[list[Row]] = []
        part: list[Row] = []
        n_out = 0
        for r in rows:
            if len(part) == self.config.n_batch or (r.logits and n_out == self.config.n_outputs_max):
                parts.append(part)
                part, n_out = [], 0
            part.append(r)
            n_out += 1 if r.logits else 0
        if part:
            parts.append(part)
        return parts

    def _fill_batch(self, rows: list[Row]) -> int:
        if not rows:
            raise ValueError("empty batch")
        n_out = 0
        b = self._batch
        if b is None:
            raise RuntimeError("decode after close: the runtime has no batch")
        limit_pos = self.n_ctx_seq
        for i, r in enumerate(rows):
            if not 0 <= r.token < self.n_vocab:
                raise ValueError(f"token id {r.token} outside the vocabulary (0..{self.n_vocab - 1})")
            if not 0 <= r.pos < limit_pos:
                raise ValueError(f"position {r.pos} outside the context (0..{limit_pos - 1})")
            if not 0 <= r.seq < self.config.n_seq_max:
                raise ValueError(f"sequence id {r.seq} outside 0..{self.config.n_seq_max - 1}")
            b.token[i] = r.token
            b.pos[i] = r.pos
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = r.seq
            b.logits[i] = 1 if r.logits else 0
            n_out += 1 if r.logits else 0
        if n_out > self.config.n_outputs_max:
            raise ValueError(f"{n_out} output rows requested; the context allows {self.config.n_outputs_max}")
        b.n_tokens = len(rows)
        return n_out
