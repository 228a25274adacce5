"""Model folders without torch: reading a folder's config, tokenizer and weight shapes, the registered
models' upload and local cache, the model types transformers builds.
"""
