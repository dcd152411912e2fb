"""The targets of a pack's records: a detection sample's boxes in the stored image's pixels, and the manifest's
``detection`` summary. One step for both pack paths (``writer``'s single process, ``chunked``'s ranks)."""

from __future__ import annotations

from typing import Any

from pytorchtricks.data.decode import image_size
from pytorchtricks.data.detection_pack import pack_summary, scale_boxes_json, scale_target_json
from pytorchtricks.data.sources import target_hw


def boxes_follow(
    extras: dict[str, Any], payload: Any, kind: str, info: Any, path: str, resize: tuple[Any, Any]
) -> dict[str, Any]:
    """The extras with their boxes in the stored image's pixels (scaled when the pack resized it).

    A detection ``target`` carries its annotated ``size``; the stored size must be that or what ``--resize`` /
    ``--max-side`` make of it (else ``ValueError``: the file and its annotation disagree). A list's ``boxes`` column
    (pixels, ``[x, y, x2|w, y2|h]``) is scaled by the stored size over the file's own header size."""
    stored = (int(info[0]), int(info[1])) if kind == "raw" else image_size(payload)
    if "target" in extras:
        t = extras["target"]
        h0, w0 = t["size"]
        if stored == (h0, w0):
            return extras
        if stored != (target_hw(h0, w0, *resize) or (h0, w0)):
            raise ValueError(
                f"the stored image is {stored[1]}x{stored[0]} (WxH) but its annotation says {w0}x{h0}: "
                "the file and the annotation disagree (EXIF rotation?)"
            )
        return {**extras, "target": scale_target_json(t, stored)}
    if resize == (None, None):
        return extras
    with open(path, "rb") as fh:
        head = fh.read(1 << 20)
    orig = image_size(head)
    if orig == stored:
        return extras
    return {**extras, "boxes": scale_boxes_json(extras["boxes"], orig, stored), "size": list(stored)}


def manifest_summary(source: Any, rejects: list[dict[str, Any]], options: dict[str, Any]) -> dict[str, Any]:
    """The manifest's ``detection`` entry of a pack of ``source`` (a detection root's listing): the kept images'
    targets at their stored sizes (what ``resize`` / ``max_side`` made of them), summed by ``pack_summary``."""
    rejected = {r["path"] for r in rejects}
    kept = [e["target"] for r, e in zip(source.rel, source.extras, strict=True) if r not in rejected]
    r = (options.get("resize"), options.get("max_side"))
    sizes = [target_hw(t["size"][0], t["size"][1], *r) or tuple(t["size"]) for t in kept]
    return pack_summary(kept, source.detection, sizes)
