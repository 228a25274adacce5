"""gluejobs for its users: the command line (and, soon, the Python client)."""
