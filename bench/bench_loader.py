#!/usr/bin/python3
"""bench_loader.py - gpipe's image loader against PyTorch's DataLoader with
torchvision transforms, on the same JPEGs, with the same number of workers.

  bench/bench_loader.py [--dir /tmp/gpipe-imagenet-like] [--images 1024]
                        [--workers 1 2] [--batches 40] [--batch 64]
                        [--repeat 3] [--bin build]

Writes (once) --images JPEGs of ImageNet-like size and quality
(scripts/make-image-folder.py: 500x375 +-25%, quality 90, 4:2:0), then
measures, for each worker count W:
  gpipe:   build/bench_loader DIR --workers W (decode + RandomResizedCrop
           224 + flip + normalise into float batches of 64)
  PyTorch: torchvision.datasets.ImageFolder with RandomResizedCrop(224),
           RandomHorizontalFlip, ToTensor, Normalize, and a DataLoader of
           batch 64 with num_workers=W (W worker processes; the main process
           only collects the batches)
Images/s after one warm-up batch, the median of --repeat runs of each
(alternating, so drift on a shared machine hits both); prints a Markdown
table with the ratio and the processor. Debian's interpreter on purpose: torch and torchvision
are python3-torch and python3-torchvision.
"""
import argparse
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def cpu_flags():
    """(model name, set of ISA flags) of the first processor in /proc/cpuinfo."""
    flags, model = set(), "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name") and model == "?":
                model = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    return model, flags


def cpu_name():
    """The processor line every CPU table carries (bench_procs.py and
    bench_cpu_peer.py import it from here)."""
    model, flags = cpu_flags()
    isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_tile") if f in flags]
    return "%s (%s)" % (model, ", ".join(isa))


def torch_rate(root, workers, batches, batch):
    import torch
    import torchvision.transforms as T
    from torchvision.datasets import ImageFolder
    torch.set_num_threads(1)
    tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                    T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    ds = ImageFolder(os.path.join(root, "train"), tf)
    dl = torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers,
                                     drop_last=True, persistent_workers=workers > 0,
                                     prefetch_factor=4 if workers > 0 else 2)
    it = iter(dl)
    next(it)
    t0 = time.perf_counter()
    n = 0
    for _ in range(batches):
        try:
            x, _ = next(it)
        except StopIteration:
            it = iter(dl)
            x, _ = next(it)
        n += x.shape[0]
    return n / (time.perf_counter() - t0)


def gpipe_rate(binary, root, workers, batches, batch):
    out = subprocess.run([binary, root, "--workers", str(workers), "--batches", str(batches),
                          "--batch", str(batch)], capture_output=True, text=True)
    m = re.search(r"([0-9.]+) images/s", out.stdout)
    if out.returncode != 0 or not m:
        sys.exit("bench_loader.py: %s failed (exit %d):\n%s" % (binary, out.returncode,
                                                                  (out.stderr or out.stdout).strip()))
    return float(m.group(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default="/tmp/gpipe-imagenet-like")
    ap.add_argument("--images", type=int, default=1024)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--bin", default=os.path.join(ROOT, "build"))
    ap.add_argument("--repeat", type=int, default=3,
                    help="runs of each, alternating; the medians are reported")
    args = ap.parse_args()
    if args.images < 8:
        ap.error("--images %d: at least 8 (one a class)" % args.images)
    if min(args.workers) < 1 or args.batches < 1 or args.batch < 1 or args.repeat < 1:
        ap.error("--workers, --batches, --batch and --repeat must be at least 1")
    binary = os.path.join(args.bin, "bench_loader")
    if not os.access(binary, os.X_OK):
        ap.error("no %s: build first (cmake --build build), or give --bin" % binary)
    if not os.path.isdir(os.path.join(args.dir, "train")):
        subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "make-image-folder.py"),
                        args.dir, "--classes", "8", "--train", str(args.images // 8),
                        "--val", "2", "--size", "500x375", "--quality", "90", "--png", "0"],
                       check=True)
    files = [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(args.dir, "train"))
             for f in fs if f.endswith(".jpg")]
    if len(files) < args.batch:
        sys.exit("bench_loader.py: %d JPEGs in %s/train, fewer than a batch of %d: remove the "
                 "folder (it is written again with --images) or give a smaller --batch"
                 % (len(files), args.dir, args.batch))
    mean_kb = sum(os.path.getsize(f) for f in files) / len(files) / 1024
    import torch
    import torchvision
    print("%d JPEGs in %s, %.0f KiB on average; %s; torch %s, torchvision %s"
          % (len(files), args.dir, mean_kb, cpu_name(), torch.__version__,
             torchvision.__version__))
    print()
    print("| workers | gpipe images/s | PyTorch DataLoader images/s | gpipe / PyTorch | "
          "gpipe per worker | PyTorch per worker |")
    print("|---|---|---|---|---|---|")
    for w in args.workers:
        gs, ts = [], []
        for _ in range(args.repeat):
            gs.append(gpipe_rate(binary, args.dir, w, args.batches, args.batch))
            ts.append(torch_rate(args.dir, w, args.batches, args.batch))
        g, t = sorted(gs)[len(gs) // 2], sorted(ts)[len(ts) // 2]
        print("| %d | %.0f | %.0f | %.2f | %.0f | %.0f |" % (w, g, t, g / t, g / w, t / w))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
