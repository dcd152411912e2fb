"""The data wing's lower floor: what a sample is - its geometry (crop, output size, flip, pad, and the boxes that
follow it), its decode (libjpeg-turbo DCT-scaled and window decode, ``decode``/``decode_roi``) and resize policy, the
ImageNet normalisation constants, the sources a pack reads (ImageFolder trees, CSV/JSONL lists), the demo photo set,
the folder and detection datasets (COCO, YOLO, Pascal VOC), the loaders' batch reader and the errors of reading a
sample. It imports neither ``shards/`` (the packs, a floor above: made from these sources, read back through this
decoder) nor ``road`` (``open_data``, above both, where a path becomes one of these datasets or a pack's)."""
