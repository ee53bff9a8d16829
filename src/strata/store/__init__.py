"""Results store: one SQLite file, WAL mode, versioned schema (docs/architecture.md §9)."""

from strata.store.db import SCHEMA_VERSION, open_db

__all__ = ["SCHEMA_VERSION", "open_db"]
