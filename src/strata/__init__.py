"""strata: what will run on this machine, how fast, and why."""

__version__ = "0.1.0"
