"""Beyond one job: sweeps (their jobs and per-configuration statistics) and GLUE's submission files."""
