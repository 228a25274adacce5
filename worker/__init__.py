"""A worker machine's part of gluejobs: worker.fleet (claiming, supervising and launching jobs, the
database) and worker.training (the training loop a job's process runs, database-free)."""
