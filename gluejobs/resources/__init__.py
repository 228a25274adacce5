"""The client's resources, one module per resource (`client.jobs` is jobs.py's, `client.keys` and
`client.audit` keys.py's, `client.owners` and `client.workers` owners.py's …), each with its sync
class and its async twin side by side and every request built once by a function beside them.
They send through the client's I/O, which they know only as resources/_transport.py's Protocols;
gluejobs.client attaches them and re-exports every class."""
