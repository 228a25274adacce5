"""The HTTP API's routes, one module per resource; service/main.py mounts them."""
