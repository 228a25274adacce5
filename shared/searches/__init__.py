"""Hyperparameter searches: Optuna's samplers and pruners over trials that are ordinary jobs.

Why the trials live in gluejobs's own tables (searches, search_trials) and not in Optuna's
RDBStorage on the same GLUEJOBS_DATABASE_URL: RDBStorage brings a dozen tables of its own with
their own Alembic history (`optuna storage upgrade`), which would have to be run and kept in step
beside gluejobs's migrations on SQLite and on Postgres, and would make a second record of every
trial beside its job, owned by nobody. Here a trial is a job plus one row naming its parameters and
what the pruner was told; each driver step rebuilds an in-memory study from those rows and uses
Optuna's ask-and-tell API (shared/searches/optimizer.py). A study of at most a hundred trials
rebuilds in milliseconds, and the search's state is wherever its rows are.

Modules: config (the request's space, objective, sampler and pruner), specs (checks and trial
specs), optimizer (Optuna), store (every read and write), driver (one step of a search). Optuna is
imported by optimizer and driver only, so that reading searches does not load it.
"""
