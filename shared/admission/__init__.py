"""The checks a job passes before it is stored or planned: the whole spec (job_checks, the entry point), its
data, and whether its model exists.
"""
