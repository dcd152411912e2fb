"""Process-wide switches: cuDNN benchmark, TF32, seeds, determinism."""
