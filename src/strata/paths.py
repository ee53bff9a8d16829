"""Where strata keeps its results DB and its cache (docs/architecture.md §9)."""

from __future__ import annotations

import os
from pathlib import Path

APP_NAME = "strata"


def home_dir() -> Path:
    """STRATA_HOME if set, else the platform's user data dir."""
    env = os.environ.get("STRATA_HOME")
    if env:
        return Path(env).expanduser()
    from platformdirs import user_data_dir

    return Path(user_data_dir(APP_NAME, appauthor=False))


def default_db_path() -> Path:
    return home_dir() / "strata.db"


def cache_dir() -> Path:
    """Generated artefacts (compiled kernels, synthetic models): content-keyed, safe to delete."""
    env = os.environ.get("STRATA_HOME")
    if env:
        return Path(env).expanduser() / "cache"
    from platformdirs import user_cache_dir

    return Path(user_cache_dir(APP_NAME, appauthor=False))


def publish(path: Path, data: bytes) -> Path:
    """Write `data` to `path` atomically (temp file + rename in the same folder): a reader,
    or another thread writing the same content-named file, sees nothing or all of it."""
    import threading

    tmp = path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
    return path
