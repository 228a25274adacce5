"""The server's commands and harness, shipped by gluejobs-server: `gluejobs serve`, `worker`,
`migrate` and `demo` (commands.py, found by the client's `gluejobs` command through the
"gluejobs.commands" entry points), the demo (demo.py, demo_data/) and the local stack that the demo,
the benchmarks and the end-to-end tests start (stack.py).

It sits above service/ and worker/ as the client sits above the API: it may import them, shared/ and
gluejobs/, and nothing of the project imports it but the tests, the benchmarks and the docs.
"""
