"""The ops of the kernel lab; importing this package registers every KernelSpec.

Every public module here is an op (one KernelSpec each): adding an op is adding a file.
Modules starting with `_` are shared helpers.
"""

import importlib
import pkgutil

for _mod in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if not _mod.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_mod.name}")
