#!/usr/bin/python3
"""test_image_ref.py IMAGE_DUMP - gpipe's image decoding against Pillow's.

Pillow (Debian's python3-pil) writes JPEGs and PNGs of several sizes and
kinds; image_dump decodes each with gpipe's decoder; the pixels must equal
Pillow's decode of the same file converted to RGB:

- JPEG (baseline and progressive; 4:4:4, 4:2:2, 4:2:0; quality 50 to 100;
  odd sizes; grayscale): exactly equal. Both use libjpeg-turbo with its
  default (islow) IDCT and fancy upsampling.
- JPEG at 1/2, 1/4 and 1/8 scale against Pillow's draft() at the same
  scale: exactly equal (libjpeg's DCT scaling in both).
- CMYK JPEG as Pillow writes it (Adobe, inverted): exactly equal to
  Pillow's convert('RGB').
- PNG (RGB, RGBA, LA, L, P, 16-bit gray, 1-bit): exactly equal to
  convert('RGB') (alpha dropped, 16-bit samples' high byte).
- scripts/make-image-folder.py refuses values that would write nothing and
  a file where its folder goes, in one line (exit 2).

Exit 77 (skipped) if Pillow is missing or gpipe was built without image
decoding; 1 on any difference.
"""
import os
import subprocess
import sys
import tempfile

SKIP = 77


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    dump = sys.argv[1]
    try:
        import numpy as np
        from PIL import Image
    except ImportError as e:
        print("skipped: %s (install python3-pil and python3-numpy)" % e)
        return SKIP
    failures = 0
    checks = 0
    tmp = tempfile.mkdtemp(prefix="gpipe-image-ref-")
    rng = np.random.default_rng(7)

    def picture(w, h):
        # smooth ramps plus noise: both the DCT's low and high frequencies
        y, x = np.mgrid[0:h, 0:w]
        r = (x * 255 // max(w - 1, 1))
        g = (y * 255 // max(h - 1, 1))
        b = (x * 3 + y * 5) % 256
        img = np.stack([r, g, b], -1).astype(np.int32)
        img += rng.integers(-30, 30, size=img.shape)
        return np.clip(img, 0, 255).astype(np.uint8)

    def gpipe(path, channels=3, denom=1):
        out = os.path.join(tmp, "out.raw")
        r = subprocess.run([dump, path, str(channels), str(denom), out],
                           capture_output=True, text=True)
        if r.returncode == SKIP:
            sys.exit(SKIP)
        if r.returncode != 0:
            return None, r.stderr.strip()
        with open(out, "rb") as f:
            head = f.readline().split()
            w, h, c = (int(v) for v in head)
            px = np.frombuffer(f.read(), np.uint8).reshape(h, w, c)
        return px, ""

    def compare(name, path, want, channels=3, denom=1):
        nonlocal failures, checks
        checks += 1
        got, err = gpipe(path, channels, denom)
        if got is None:
            print("FAIL %s: gpipe could not decode: %s" % (name, err))
            failures += 1
            return
        if channels == 1:
            want = want.reshape(want.shape[0], want.shape[1], 1)
        if got.shape != want.shape:
            print("FAIL %s: shape %s, Pillow %s" % (name, got.shape, want.shape))
            failures += 1
            return
        d = np.abs(got.astype(int) - want.astype(int))
        if d.max() != 0:
            print("FAIL %s: differs from Pillow by up to %d (%d pixels)"
                  % (name, d.max(), int((d > 0).sum())))
            failures += 1

    # JPEG: sizes, qualities, subsampling, progressive, grayscale
    cases = [((97, 61), 90, 0, False), ((640, 480), 75, 2, False), ((333, 251), 95, 1, True),
             ((16, 16), 100, 0, False), ((1023, 769), 50, 2, True), ((500, 375), 85, 2, False)]
    for (w, h), q, sub, prog in cases:
        arr = picture(w, h)
        p = os.path.join(tmp, "a_%dx%d_q%d_s%d_p%d.jpg" % (w, h, q, sub, prog))
        Image.fromarray(arr, "RGB").save(p, quality=q, subsampling=sub, progressive=prog)
        compare(os.path.basename(p), p, np.asarray(Image.open(p).convert("RGB")))
        for d in (2, 4, 8):
            im = Image.open(p)
            im.draft("RGB", ((w + d - 1) // d, (h + d - 1) // d))
            want = np.asarray(im.convert("RGB"))
            if want.shape[:2] != ((h + d - 1) // d, (w + d - 1) // d):
                continue  # Pillow chose another scale: nothing to compare
            compare("%s at 1/%d" % (os.path.basename(p), d), p, want, 3, d)
        # as a mask: Pillow's RGB, the largest channel
        compare(os.path.basename(p) + " as a mask", p,
                np.asarray(Image.open(p).convert("RGB")).max(axis=2), 1)
    gray = picture(211, 157)[:, :, 0]
    p = os.path.join(tmp, "gray.jpg")
    Image.fromarray(gray, "L").save(p, quality=92)
    compare("gray.jpg", p, np.asarray(Image.open(p).convert("RGB")))
    compare("gray.jpg as a mask", p, np.asarray(Image.open(p)), 1)

    # CMYK, as Pillow writes it (Adobe marker, inverted ink)
    arr = picture(123, 77)
    k = rng.integers(0, 120, size=(77, 123, 1)).astype(np.uint8)
    cmyk = np.concatenate([255 - arr, k], axis=2)
    p = os.path.join(tmp, "cmyk.jpg")
    Image.fromarray(cmyk, "CMYK").save(p, quality=95)
    compare("cmyk.jpg", p, np.asarray(Image.open(p).convert("RGB")))

    # PNG: every colour type and depth Pillow writes
    arr = picture(150, 101)
    alpha = rng.integers(0, 256, size=(101, 150, 1)).astype(np.uint8)
    pngs = {
        "rgb.png": Image.fromarray(arr, "RGB"),
        "rgba.png": Image.fromarray(np.concatenate([arr, alpha], 2), "RGBA"),
        "l.png": Image.fromarray(arr[:, :, 1], "L"),
        "la.png": Image.fromarray(np.stack([arr[:, :, 1], alpha[:, :, 0]], 2), "LA"),
        "p.png": Image.fromarray(arr, "RGB").quantize(colors=37),
        "i16.png": Image.fromarray((arr[:, :, 0].astype(np.uint16) * 257 + 3), "I;16"),
        "1bit.png": Image.fromarray(arr[:, :, 0] > 128).convert("1"),
    }
    for name, im in pngs.items():
        p = os.path.join(tmp, name)
        im.save(p)
        ref = Image.open(p)
        if ref.mode in ("I;16", "I;16B", "I"):
            # Pillow's convert('RGB') of 16-bit gray clips instead of
            # scaling; gpipe keeps the high byte, as libpng's strip_16
            want16 = np.asarray(ref).astype(np.uint32) >> 8
            want = np.repeat(want16.astype(np.uint8)[:, :, None], 3, axis=2)
        else:
            want = np.asarray(ref.convert("RGB"))
        compare(name, p, want)
    # a palette PNG as a mask keeps the index
    p = os.path.join(tmp, "p.png")
    compare("p.png as a mask (palette index)", p, np.asarray(Image.open(p)), 1)

    # scripts/make-image-folder.py, the images' other writer: values that
    # would write nothing (it said "wrote"), and a file for the folder (a
    # traceback), are one line and exit 2
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          "scripts", "make-image-folder.py")
    afile = os.path.join(tmp, "afile")
    open(afile, "w").close()
    for args, want in ((["--classes", "0"], "--classes: '0': give a whole number from 2 up"),
                       (["--train", "0"], "--train: '0': give a whole number from 1 up"),
                       (["--png", "2"], "--png: '2': give a number from 0 to 1"),
                       (["--quality", "500"], "--quality: '500': give a whole number from 1 "
                                              "to 100")):
        out = os.path.join(tmp, "folder")
        r = subprocess.run([sys.executable, script, out] + args, capture_output=True, text=True)
        checks += 1
        if not (r.returncode == 2 and want in r.stderr and len(r.stderr.splitlines()) == 1
                and not os.path.exists(out)):
            failures += 1
            print("FAIL: make-image-folder.py %s: exit %d: %s" % (args, r.returncode, r.stderr))
    r = subprocess.run([sys.executable, script, afile], capture_output=True, text=True)
    checks += 1
    if not (r.returncode == 2 and "is a file, not a folder" in r.stderr and
            "Traceback" not in r.stderr):
        failures += 1
        print("FAIL: make-image-folder.py onto a file: exit %d: %s" % (r.returncode, r.stderr))

    print("test_image_ref: %d passed, %d failed" % (checks - failures, failures))
    if not failures:
        subprocess.run(["rm", "-rf", tmp])
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
