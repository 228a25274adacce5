"""`python -m worker [--exit-when-idle]`: the same as `gluejobs worker`."""

import sys

from shared.cli import main

sys.exit(main(["worker", *sys.argv[1:]]))
