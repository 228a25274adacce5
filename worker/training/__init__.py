"""Training: the loop a job's process runs (loop.py, in accelerate's nlp_example's order) and its
helpers: data and batches, the model and its precision, checkpoints and their uploads, metrics,
predictions and the outputs a run leaves behind. Database-free: what a run reports goes through the
Reporter it is handed (reporter.py); it imports nothing of worker.fleet, shared.jobs_repo or the
database (tests/project/test_imports.py holds it to that), so it runs, and is tested, without either."""
