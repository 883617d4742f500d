"""`python -m mlakit ...`: the same command line as the `mlakit` console script."""

from mlakit.cli import main

main(prog_name="mlakit")
