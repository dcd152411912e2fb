"""Tricks that touch samples: packing, decoding, caching, prefetching, loader settings, device transforms."""
