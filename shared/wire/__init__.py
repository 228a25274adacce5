"""What crosses a process boundary, in one place: the words the API, the workers, the client and the
dashboard must agree on (`vocabulary`: job statuses, webhook event types, a file's column-mapping
fields) and the layout of a job's folder with the store keys built from it (`job_folder`).

Standard library only, no database, no torch, no pydantic: the client wheel carries these modules
(hatch_build.py copies the shared modules the client imports into gluejobs/_shared), and every other
shared subpackage may import them (the bottom layer of tests/project/test_imports.py).
tests/project/test_contracts.py fails when one of these values is written out again elsewhere.
"""
