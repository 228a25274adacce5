"""The fleet: how a worker machine takes part in the queue. It claims jobs (runner), supervises each
attempt's processes and ends the attempt once (supervisor, outcome), launches them (launch, gang_watch
for jobs spread over several machines), heartbeats and fences by lease (liveness, health), picks the
devices (devices), keeps a warm interpreter ready (warm, template) and writes the run's rows to the
database (db_reporter, child). It is the only part of worker/ that touches the database."""
