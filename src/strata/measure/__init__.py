"""One timing module, one stats module, the roofline model (DESIGN §2 principle 3)."""
