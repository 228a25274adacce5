"""`python -m gluejobs.cli …`: the `gluejobs` command."""

import sys

from gluejobs.cli import main

sys.exit(main())
