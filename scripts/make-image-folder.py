#!/usr/bin/python3
"""make-image-folder.py - write a small, learnable image folder in the layouts
gpipe's data.dataset: image_folder reads, for trying configs, the tests and
the loader benchmark.

  make-image-folder.py OUT [--classes 10] [--train 100] [--val 20]
                           [--size 400x350] [--quality 90] [--png 0.1]
  make-image-folder.py OUT --segmentation [--train 100] [--val 20] ...

Classification: OUT/{train,val}/class_NN/img_NNNNN.jpg (a share --png of them
PNG). Each class is a hue and a shape (disc, square, ring, bar...) drawn at a
random place and size on a noisy background, so a convnet can learn it and a
random crop usually keeps it. Sizes vary by +-25% around --size, like
ImageNet's photos (about 400x350 on average).

Segmentation: OUT/{train,val}/images/NNNNN.jpg with OUT/{train,val}/masks/
NNNNN.png: an ellipse on a noisy background, the mask 255 inside it, 0
outside.

Deterministic for a given --seed. Needs Pillow and numpy (Debian's
python3-pil and python3-numpy: hence /usr/bin/python3).
"""
import argparse
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gp_script_common import ScriptError, parser_raising, run_cli  # noqa: E402

try:
    import numpy as np
    from PIL import Image, ImageDraw
except ImportError as e:
    sys.exit("make-image-folder.py: %s; run with Debian's /usr/bin/python3, which has "
             "python3-numpy and python3-pil (scripts/install-deps.sh)" % e)

SHAPES = ["disc", "square", "ring", "hbar", "vbar", "triangle", "cross", "diamond"]


def hsv_colour(h):
    import colorsys
    r, g, b = colorsys.hsv_to_rgb(h, 0.8, 0.9)
    return int(r * 255), int(g * 255), int(b * 255)


def background(rng, w, h):
    base = rng.integers(40, 120, size=3)
    noise = rng.normal(0, 18, size=(h, w, 3))
    return Image.fromarray(np.clip(base + noise, 0, 255).astype(np.uint8), "RGB")


def draw_shape(d, shape, box, colour):
    x0, y0, x1, y1 = box
    cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
    if shape == "disc":
        d.ellipse(box, fill=colour)
    elif shape == "square":
        d.rectangle(box, fill=colour)
    elif shape == "ring":
        d.ellipse(box, outline=colour, width=max(3, (x1 - x0) // 6))
    elif shape == "hbar":
        d.rectangle((x0, cy - (y1 - y0) / 6, x1, cy + (y1 - y0) / 6), fill=colour)
    elif shape == "vbar":
        d.rectangle((cx - (x1 - x0) / 6, y0, cx + (x1 - x0) / 6, y1), fill=colour)
    elif shape == "triangle":
        d.polygon([(cx, y0), (x1, y1), (x0, y1)], fill=colour)
    elif shape == "cross":
        t = (x1 - x0) / 6
        d.rectangle((x0, cy - t, x1, cy + t), fill=colour)
        d.rectangle((cx - t, y0, cx + t, y1), fill=colour)
    else:
        d.polygon([(cx, y0), (x1, cy), (cx, y1), (x0, cy)], fill=colour)


def size_of(rng, base):
    w, h = base
    return int(w * rng.uniform(0.75, 1.25)), int(h * rng.uniform(0.75, 1.25))


def save(img, path, quality):
    if path.endswith(".png"):
        img.save(path)
    else:
        img.save(path, quality=quality)


def classification(args, rng):
    for split, n in (("train", args.train), ("val", args.val)):
        for c in range(args.classes):
            d = os.path.join(args.out, split, "class_%02d" % c)
            os.makedirs(d, exist_ok=True)
            colour = hsv_colour(c / args.classes)
            shape = SHAPES[c % len(SHAPES)]
            for i in range(n):
                w, h = size_of(rng, args.size)
                img = background(rng, w, h)
                s = int(min(w, h) * rng.uniform(0.35, 0.7))
                x, y = int(rng.integers(0, w - s)), int(rng.integers(0, h - s))
                draw_shape(ImageDraw.Draw(img), shape, (x, y, x + s, y + s), colour)
                ext = ".png" if rng.random() < args.png else ".jpg"
                save(img, os.path.join(d, "img_%05d%s" % (i, ext)), args.quality)


def segmentation(args, rng):
    for split, n in (("train", args.train), ("val", args.val)):
        di = os.path.join(args.out, split, "images")
        dm = os.path.join(args.out, split, "masks")
        os.makedirs(di, exist_ok=True)
        os.makedirs(dm, exist_ok=True)
        for i in range(n):
            w, h = size_of(rng, args.size)
            img = background(rng, w, h)
            mask = Image.new("L", (w, h), 0)
            ew, eh = int(w * rng.uniform(0.3, 0.7)), int(h * rng.uniform(0.3, 0.7))
            x, y = int(rng.integers(0, w - ew)), int(rng.integers(0, h - eh))
            colour = hsv_colour(rng.random())
            ImageDraw.Draw(img).ellipse((x, y, x + ew, y + eh), fill=colour)
            ImageDraw.Draw(mask).ellipse((x, y, x + ew, y + eh), fill=255)
            save(img, os.path.join(di, "%05d.jpg" % i), args.quality)
            mask.save(os.path.join(dm, "%05d.png" % i))


def wxh(text):
    """--size: "WxH", or "N" for N x N; both at least 8 pixels."""
    parts = text.lower().split("x")
    try:
        w, h = (int(parts[0]), int(parts[0])) if len(parts) == 1 else map(int, parts)
    except ValueError:
        raise argparse.ArgumentTypeError("'%s': give WxH (such as 400x350) or one size N "
                                         "for NxN" % text)
    if len(parts) > 2 or w < 8 or h < 8:
        raise argparse.ArgumentTypeError("'%s': give WxH (such as 400x350) or one size N "
                                         "for NxN, each at least 8" % text)
    return w, h


def in_range(kind, lo, hi=None):
    """An argparse type: a `kind` number in [lo, hi] (hi None: no limit)."""
    def parse(text):
        try:
            v = kind(text)
        except ValueError:
            v = None
        if v is None or v != v or v < lo or (hi is not None and v > hi):
            raise argparse.ArgumentTypeError("'%s': give a %s from %s%s" % (
                text, "whole number" if kind is int else "number", lo,
                " to %s" % hi if hi is not None else " up"))
        return v
    return parse


class FolderError(ScriptError):
    pass


def main(argv=None):
    ap = parser_raising(FolderError)(prog="make-image-folder.py",
                                     description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--segmentation", action="store_true")
    ap.add_argument("--classes", type=in_range(int, 2), default=10)
    ap.add_argument("--train", type=in_range(int, 1), default=100,
                    help="images per class (or in all)")
    ap.add_argument("--val", type=in_range(int, 1), default=20)
    ap.add_argument("--size", type=wxh, default=(400, 350),
                    help="mean WxH, or N for NxN (default 400x350)")
    ap.add_argument("--quality", type=in_range(int, 1, 100), default=90)
    ap.add_argument("--png", type=in_range(float, 0, 1), default=0.1,
                    help="share of PNG files (0 to 1)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise FolderError(args.out, "is a file, not a folder; give a folder to write into")
    rng = np.random.default_rng(args.seed)
    random.seed(args.seed)
    (segmentation if args.segmentation else classification)(args, rng)
    print("wrote", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(run_cli("make-image-folder.py", main))
