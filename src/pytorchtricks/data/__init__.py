"""The data wing: where a path becomes a dataset (``open_data``: a pack folder or URL, a detection root, an
ImageNet-style split root, an ImageFolder tree), what a sample is - its geometry (crop, output size, flip, pad, and
the boxes that follow it), its decode (libjpeg-turbo DCT-scaled and window decode, ``decode``/``decode_roi``) and
resize policy, the ImageNet normalisation constants, the sources a pack reads (ImageFolder trees, CSV/JSONL lists),
the demo photo set and the detection datasets (COCO, YOLO, Pascal VOC). Floor 1, beside ``shards/`` (the on-disk
formats only)."""
