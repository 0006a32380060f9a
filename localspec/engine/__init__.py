"""The core: llama.cpp runtime, drafters, verification and the multi-sequence scheduler.

It imports nothing from the other localspec packages; it takes model paths and emits events.
"""

from localspec.engine.config import EngineConfig, GenerationRequest
from localspec.engine.events import Done, Event, Stats, Token
from localspec.engine.sampling import SamplingParams

__all__ = ["Done", "EngineConfig", "Event", "GenerationRequest", "SamplingParams", "Stats", "Token"]
