"""pytorchtricks: the PyTorch speed-and-memory trick catalogue as tested, measured one-line calls.

    >>> import pytorchtricks as ptt
    >>> with ptt.seed_everything(0):
    ...     pass

Importing this package is cheap and side-effect free: names resolve lazily on first use, CUDA is not
initialised, and optional dependencies (torchvision, cv2, lmdb, onnx) are imported only by the functions that
need them.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# name -> module that defines it. One line per exported name; grouped as the package is.
_EXPORTS: dict[str, str] = {
    # core vocabulary
    "TrickInfo": "pytorchtricks.core",
    "BenchCase": "pytorchtricks.core",
    "PttError": "pytorchtricks.core",
    "MissingExtraError": "pytorchtricks.core",
    "NoEffectWarning": "pytorchtricks.core",
    "PttWarning": "pytorchtricks.core",
    # catalogue and measuring engine
    "catalogue": "pytorchtricks.catalogue",
    "measure": "pytorchtricks.clock",
    "compare": "pytorchtricks.clock",
    "CompareConfig": "pytorchtricks.clock",
    "peak_memory": "pytorchtricks.clock",
    "SavedTensorMeter": "pytorchtricks.clock",
    "environment": "pytorchtricks.clock",
    # tricks/runtime
    "enable_cudnn_benchmark": "pytorchtricks.tricks.runtime.enable_cudnn_benchmark",
    "enable_tf32": "pytorchtricks.tricks.runtime.enable_tf32",
    "enable_determinism": "pytorchtricks.tricks.runtime.enable_determinism",
    "seed_everything": "pytorchtricks.tricks.runtime.seed_everything",
    "seed_worker": "pytorchtricks.tricks.runtime.seed_everything",
    "seeded_generator": "pytorchtricks.tricks.runtime.seed_everything",
    # tricks/data
    "make_loader": "pytorchtricks.tricks.data.make_loader",
    "LoaderConfig": "pytorchtricks.tricks.data.make_loader",
    "make_detection_loader": "pytorchtricks.tricks.data.make_detection_loader",
    "DetectionLoaderConfig": "pytorchtricks.tricks.data.make_detection_loader",
    "DetectionRecipe": "pytorchtricks.data.recipes",
    "DetectionDataset": "pytorchtricks.data.detection",
    "DetectionTables": "pytorchtricks.data.detection",
    "open_detection": "pytorchtricks.data.detection",
    "AnnotationError": "pytorchtricks.data.detection",
    "Geometry": "pytorchtricks.data.geometry",
    "cache_in_ram": "pytorchtricks.tricks.data.cache_in_ram",
    "CacheConfig": "pytorchtricks.tricks.data.cache_in_ram",
    "list_arenas": "pytorchtricks.tricks.data.cache_in_ram",
    "remove_arenas": "pytorchtricks.tricks.data.cache_in_ram",
    "ArenaInfo": "pytorchtricks.tricks.data.cache_in_ram",
    "prefetch_to_device": "pytorchtricks.tricks.data.prefetch_to_device",
    "device_augment": "pytorchtricks.tricks.data.device_augment",
    "crop_boxes": "pytorchtricks.tricks.data.device_augment",
    "batch_random_resized_crop": "pytorchtricks.tricks.data.device_augment",
    "batch_flip": "pytorchtricks.tricks.data.device_augment",
    "batch_translate": "pytorchtricks.tricks.data.device_augment",
    "batch_cutout": "pytorchtricks.tricks.data.device_augment",
    "batch_normalize": "pytorchtricks.tricks.data.device_augment",
    "dataset_on_device": "pytorchtricks.tricks.data.dataset_on_device",
    "DeviceDatasetConfig": "pytorchtricks.tricks.data.dataset_on_device",
    "autotune_loader": "pytorchtricks.tricks.data.autotune_loader",
    "AutotuneConfig": "pytorchtricks.tricks.data.autotune_loader",
    "JpegFolder": "pytorchtricks.data.folder",
    "split_folders": "pytorchtricks.data.folder",
    "open_data": "pytorchtricks.road",
    "data_source": "pytorchtricks.road",
    "DataSource": "pytorchtricks.road",
    "pack": "pytorchtricks.tricks.data.pack",
    "PackConfig": "pytorchtricks.tricks.data.pack",
    "decode_image": "pytorchtricks.tricks.data.decode_image",
    "image_size": "pytorchtricks.tricks.data.decode_image",
    # tricks/loop
    "mixed_precision": "pytorchtricks.tricks.loop.mixed_precision",
    "accumulate_gradients": "pytorchtricks.tricks.loop.accumulate_gradients",
    "check_accumulation": "pytorchtricks.tricks.loop.accumulate_gradients",
    "checkpoint_activations_": "pytorchtricks.tricks.loop.checkpoint_activations",
    "checkpoint_plan": "pytorchtricks.tricks.loop.checkpoint_activations",
    "to_inplace_abn_": "pytorchtricks.tricks.loop.to_inplace_abn",
    "InPlaceABN": "pytorchtricks.tricks.loop.to_inplace_abn",
    "fast_optimizer": "pytorchtricks.tricks.loop.fast_optimizer",
    "scale_lr": "pytorchtricks.tricks.loop.scale_lr",
    "flatten_parameters_": "pytorchtricks.tricks.loop.flatten_parameters",
    "flat_parameters": "pytorchtricks.tricks.loop.flatten_parameters",
    "warmup_schedule": "pytorchtricks.tricks.loop.scale_lr",
    # tricks/loop: multi-process training (a module: ptt.distributed.setup())
    "distributed": "pytorchtricks.distributed",
    # tricks/model
    "remove_conv_bias_before_bn_": "pytorchtricks.tricks.model.remove_conv_bias_before_bn",
    "to_channels_last_": "pytorchtricks.tricks.model.to_channels_last",
    "compile_": "pytorchtricks.tricks.model.compile",
    "freeze_": "pytorchtricks.tricks.model.freeze",
    "unfreeze_": "pytorchtricks.tricks.model.freeze",
    "fuse_conv_bn_": "pytorchtricks.tricks.model.fuse_conv_bn",
    "unshare_modules_": "pytorchtricks.tricks.model.unshare_modules",
    "inplace_activations_": "pytorchtricks.tricks.model.inplace_activations",
    "reparameterize_": "pytorchtricks.tricks.model.reparameterize",
    "RepVGGBlock": "pytorchtricks.tricks.model._rep_blocks",
    "ACBlock": "pytorchtricks.tricks.model._rep_blocks",
    "quantize": "pytorchtricks.tricks.model.quantize",
    "load_artefact": "pytorchtricks.infer.artefacts",
    "QuantConfig": "pytorchtricks.tricks.model.quantize",
    "Quantized": "pytorchtricks.tricks.model._quantized",
    "export_onnx": "pytorchtricks.tricks.model.export_onnx",
    "OnnxRunner": "pytorchtricks.tricks.model.export_onnx",
    "quantize_onnx_static": "pytorchtricks.tricks.model.export_onnx",
    "prune_channels_": "pytorchtricks.tricks.model.prune_channels",
    "network_slimming_step_": "pytorchtricks.tricks.model.prune_channels",
    "prune_unstructured_": "pytorchtricks.tricks.model.prune_channels",
    "distillation_loss": "pytorchtricks.tricks.model.distill",
    "distill_": "pytorchtricks.tricks.model.distill",
    "DistillConfig": "pytorchtricks.tricks.model.distill",
    "quantize_lowbit_": "pytorchtricks.tricks.model.quantize_lowbit",
    "fold_bn_binary_": "pytorchtricks.tricks.model.quantize_lowbit",
    "LowBitConv2d": "pytorchtricks.tricks.model.quantize_lowbit",
    "LowBitLinear": "pytorchtricks.tricks.model.quantize_lowbit",
    # shards
    "ShardDataset": "pytorchtricks.shards.dataset",
    "ShardStream": "pytorchtricks.shards.stream",
    "StreamConfig": "pytorchtricks.shards.stream",
    "ShardError": "pytorchtricks.data.errors",
    "DecodeError": "pytorchtricks.data.errors",
    "inspect_shards": "pytorchtricks.shards.inspect",
    # analysis
    "check_transform": "pytorchtricks.safety",
    "SafetyError": "pytorchtricks.safety",
    "doctor_data": "pytorchtricks.analysis.data_doctor",
    "DataDoctorConfig": "pytorchtricks.analysis.data_doctor",
    "check_reproducible": "pytorchtricks.analysis.reproducibility",
    "lint": "pytorchtricks.analysis.lint",
    "apply_lint_fixes_": "pytorchtricks.analysis.lint",
    "count_flops": "pytorchtricks.analysis.flops",
    "memory_breakdown": "pytorchtricks.analysis.memory",
    "estimate_memory": "pytorchtricks.analysis.memory",
    "find_batch_size": "pytorchtricks.analysis.memory",
    "BatchSizeConfig": "pytorchtricks.analysis.memory",
    "profile": "pytorchtricks.analysis.profile",
    "ProfileConfig": "pytorchtricks.analysis.profile",
    "watch": "pytorchtricks.analysis.watch",
    # integrations (optional extras: the framework is imported when called)
    "ultralytics": "pytorchtricks.integrations.ultralytics",
    # tune
    "tune_model": "pytorchtricks.tune.engine",
    "TuneConfig": "pytorchtricks.tune.config",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pytorchtricks' has no attribute {name!r}")
    mod = importlib.import_module(module)
    value = mod if module.endswith("." + name) and not hasattr(mod, name) else getattr(mod, name)
    globals()[name] = value  # cache: later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
