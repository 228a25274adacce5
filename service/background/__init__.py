"""Each API process's tasks beside its requests: the search driver, the job streams' shared readers, the
webhook dispatcher.
"""
