"""Use cases behind the CLI commands: probe, store, render (kept out of strata.cli)."""
