"""`python -m strata.cli`."""

from strata.cli import main

main()
