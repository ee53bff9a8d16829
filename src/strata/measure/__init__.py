"""One timing module, one stats module, the roofline model (docs/architecture.md §2)."""
