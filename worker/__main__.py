"""`python -m worker [--exit-when-idle] …`: the same as `gluejobs worker`."""

import logging
import sys

from worker.fleet.main import main

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)
sys.exit(main(sys.argv[1:], prog="python -m worker"))
