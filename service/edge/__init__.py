"""What stands between a client and the routes: the request guard, Host and Origin checks, connection
limits, rate limits, the input check, the answer while the database is away.
"""
