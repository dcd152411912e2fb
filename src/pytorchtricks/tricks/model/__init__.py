"""Tricks that rewrite a module: channels_last, fusion, re-parameterization, quantization, pruning, low-bit."""
