"""Training configurations (ml_collections), loaded by path: --config=configs/<task>.py."""
