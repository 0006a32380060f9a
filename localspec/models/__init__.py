"""Model management: registry, store, downloads, GGUF metadata, fit and draft compatibility.

The engine does not import this package; it receives paths and DraftCompat values.
"""

from localspec.models.compat import DraftCompat, LoraCompat, check_draft_compat, check_lora
from localspec.models.fit import FitEstimate, estimate_fit
from localspec.models.gguf_info import validate_gguf
from localspec.models.gguf_summary import GGUFInfo, read_gguf_info
from localspec.models.manager import (
    DiskUsage,
    InstallRecord,
    ModelManager,
    ModelRow,
    ProfilePull,
    VerifyReport,
    VerifyStatus,
)
from localspec.models.progress import ProgressCallback, ProgressEvent
from localspec.models.registry import ModelEntry, Profile, Registry, load_registry

__all__ = [
    "DiskUsage", "DraftCompat", "FitEstimate", "GGUFInfo", "InstallRecord", "LoraCompat", "ModelEntry",
    "ModelManager", "ModelRow", "Profile", "ProfilePull", "ProgressCallback", "ProgressEvent", "Registry",
    "VerifyReport", "VerifyStatus",
    "check_draft_compat", "check_lora", "estimate_fit", "load_registry", "read_gguf_info", "validate_gguf",
]
