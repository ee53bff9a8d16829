"""`python -m strata.train [flags]` = `strata train [flags]`: the entry torchrun starts once
per rank (`torchrun --nproc-per-node 2 -m strata.train --preset tiny`)."""

from __future__ import annotations

import sys

from strata.cli import main

if __name__ == "__main__":
    sys.argv = ["strata", "train", *sys.argv[1:]]
    main()
