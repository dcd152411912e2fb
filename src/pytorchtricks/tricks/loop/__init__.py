"""Tricks that touch the training step: precision, accumulation, checkpointing, optimizers, lr scaling."""
