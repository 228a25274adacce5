"""Who is calling (API keys, bootstrap keys), keys made over the API, owners as admins see and change them,
and the audit log.
"""
