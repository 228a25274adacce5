"""Files through the API: uploads received and checked (in a sandboxed child), the stored bytes no row
holds, downloads, a job's folder as the API serves it.
"""
