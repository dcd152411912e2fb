"""The packs: the on-disk formats (ptt, tar, lmdb) - writers, readers, index, checksums, the remote cache. A floor
above ``data/``: a pack is written from ``data``'s sources and read back through its decoder, so ``data/`` never
imports this package."""
