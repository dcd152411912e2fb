"""96 train + 16 val YOLO-format photos from the Debian wallpapers (each photo once at full size and once as a
seeded crop re-encoded at quality 92), seeded boxes."""
import io, os, numpy as np
from PIL import Image
from pytorchtricks.data.photoset import wallpaper_sources
root = "/tmp/yolo-data/set96"
rng = np.random.default_rng(47)
srcs = [p for _, p in wallpaper_sources() if p.lower().endswith((".jpg", ".jpeg"))]
def photos():
    for k in range(3):
        for p in srcs:
            im = Image.open(p)
            if k == 0:
                yield open(p, "rb").read(), im.size
                continue
            im = im.convert("RGB"); w, h = im.size; f = rng.uniform(0.55, 0.85)
            cw, ch = int(w * f), int(h * f); x, y = int(rng.integers(0, w - cw)), int(rng.integers(0, h - ch))
            buf = io.BytesIO(); im.crop((x, y, x + cw, y + ch)).save(buf, "JPEG", quality=92)
            yield buf.getvalue(), (cw, ch)
it = photos()
for split, n in (("train", 96), ("val", 16)):
    os.makedirs(f"{root}/images/{split}", exist_ok=True); os.makedirs(f"{root}/labels/{split}", exist_ok=True)
    for i in range(n):
        data, (w, h) = next(it)
        open(f"{root}/images/{split}/{split}{i:03d}.jpg", "wb").write(data)
        lines = []
        for _ in range(int(rng.integers(1, 6))):
            bw, bh = rng.uniform(0.05, 0.5), rng.uniform(0.05, 0.5)
            cx, cy = rng.uniform(bw / 2, 1 - bw / 2), rng.uniform(bh / 2, 1 - bh / 2)
            lines.append(f"{int(rng.integers(0, 3))} {cx:.6f} {cy:.6f} {bw:.6f} {bh:.6f}")
        open(f"{root}/labels/{split}/{split}{i:03d}.txt", "w").write("\n".join(lines) + "\n")
open(f"{root}/data.yaml", "w").write(f"path: {root}\ntrain: images/train\nval: images/val\nnames:\n  0: cat\n  1: dog\n  2: tree\n")
print(len(srcs))
