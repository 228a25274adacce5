"""A job's data files: the one reading rule of the API and the worker, the shape limits checked before
decoding, and this machine's copies of uploaded files.
"""
