"""`python -m service [--host H] [--port P]`: the same as `gluejobs serve`."""

import logging
import sys

from service.server import main

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
sys.exit(main(sys.argv[1:], prog="python -m service"))
