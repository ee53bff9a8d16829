"""`python -m strata.train [flags]` = `strata train [flags]`: the entry torchrun starts once
per rank (`torchrun --nproc-per-node 2 -m strata.train --preset tiny`)."""

from __future__ import annotations

import os
import sys

from strata.cli import main


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    return exc.code if isinstance(exc.code, int) else 1


def run() -> None:
    sys.argv = ["strata", "train", *sys.argv[1:]]
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        # A rank leaves without the interpreter's teardown: gloo's worker threads can still
        # release tensors while modules are being finalised, which aborted a rank after a
        # finished run (SIGABRT in the garbage collector). Results are stored and closed by now.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    run()
