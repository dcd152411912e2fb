"""Inference artefacts (``ptt optimize``): the pipeline unshare -> fuse -> reparameterize -> quantize or compile,
each stage timed against eager fp32 and checked, and what it writes (a floor below tune's: tests/test_floors.py)."""
