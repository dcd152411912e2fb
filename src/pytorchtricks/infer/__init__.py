"""Inference artefacts (``ptt optimize``): the pipeline unshare -> fuse -> reparameterize -> quantize or compile,
each stage timed against eager fp32 and checked, and what it writes (floor 3, beside tune)."""
