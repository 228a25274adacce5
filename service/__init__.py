"""The HTTP API (FastAPI): main.py builds the app, routes/ answers, edge/ guards it, schemas/ holds
the bodies, files/ the uploads and downloads, accounts/ the keys and owners, background/ each process's
tasks. Nothing here imports torch or worker/.
"""
