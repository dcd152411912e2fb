"""The data wing: what a sample is - its geometry (crop, output size, flip, pad, and the boxes that follow it) and the
detection datasets (COCO, YOLO, Pascal VOC). Floor 1, beside ``shards/`` (the on-disk formats and the decoder)."""
