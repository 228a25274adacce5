"""What every part of gluejobs stands on: settings, the database (engines, tables, retries through an
outage, migrations, the release check, one ownership check), the one error hierarchy, the file store,
owners, how messages name a job's files, and the tests' crash points.
"""
