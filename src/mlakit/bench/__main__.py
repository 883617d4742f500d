"""`python -m mlakit.bench decode ...`: `mlakit bench ...`, its refusals one line on stderr and exit 2 as every
command's."""

import sys

from mlakit.cli import main

main(["bench", *sys.argv[1:]], prog_name="mlakit")
