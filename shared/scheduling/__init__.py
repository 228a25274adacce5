"""Who runs next: fair share between owners, per-owner quotas, and why a queued job waits (the same rules
the claim applies).
"""
