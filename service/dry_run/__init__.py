"""The dry-run plan (what can be known about a job without a GPU) and how many dry runs and upload checks
the API works on at once.
"""
