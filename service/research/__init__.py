"""Read-only research views of the API: the leaderboard, its majority-class baselines, and whether a rerun
reproduced its original.
"""
