"""One module per backend, each defining DESCRIPTOR (strata.backends.base.BackendDescriptor).

strata.backends.registry() finds them by scanning this package: a new backend adds a file
here and no other file names it. Keep these modules light: no torch, llama.cpp or httpx at
import time (the CLI reads them to build its help).
"""
