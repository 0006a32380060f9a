"""Where localspec keeps its files.

Config, data and cache come from platformdirs. ``LOCALSPEC_HOME`` moves all three under
one folder (tests isolate themselves this way); ``LOCALSPEC_MODELS_DIR`` moves only the
model store, so isolated tests still share the downloaded models; ``LOCALSPEC_SETTINGS`` names
another settings file (`serve --settings FILE` sets it, so that every loader in the process reads it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import platformdirs

APP = "localspec"
SETTINGS_ENV = "LOCALSPEC_SETTINGS"


@dataclass(frozen=True)
class Paths:
    config_dir: Path
    data_dir: Path
    cache_dir: Path
    models_dir: Path

    @property
    def user_registry(self) -> Path:
        """The user's overlay of ``models.toml``: extra entries and overrides."""
        return self.config_dir / "models.toml"

    @property
    def settings_file(self) -> Path:
        other = os.environ.get(SETTINGS_ENV)
        return Path(other).expanduser() if other else self.config_dir / "settings.toml"


def resolve_paths() -> Paths:
    home = os.environ.get("LOCALSPEC_HOME")
    if home:
        root = Path(home).expanduser()
        config, data, cache = root / "config", root / "data", root / "cache"
    else:
        config = Path(platformdirs.user_config_dir(APP))
        data = Path(platformdirs.user_data_dir(APP))
        cache = Path(platformdirs.user_cache_dir(APP))
    models = os.environ.get("LOCALSPEC_MODELS_DIR")
    models_dir = Path(models).expanduser() if models else data / "models"
    return Paths(config_dir=config, data_dir=data, cache_dir=cache, models_dir=models_dir)
