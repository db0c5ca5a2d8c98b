#!/usr/bin/env python3
"""bench_gpu_peer.py - PyTorch's training step on one GPU, on the models,
batches and precisions of issue 15's table, as the peer of gpipe's
numbers from bench/gpu_bars.sh in the same visit to the same GPU.

  python3 bench/bench_gpu_peer.py [--device cuda:0] [--steps 12]
                                  [--layouts nchw,channels_last] [--compile]
                                  [--gpipe FILE] [CONFIG:BATCH ...]

For each config and batch (default: bench/mlp.yaml 256 and 2048,
bench/convnet.yaml 128 and 1024, bench/resnet18-32.yaml 256) and each
precision:
  fp32  TF32 off in cuBLAS and cuDNN (torch.backends.*.allow_tf32 = False)
  tf32  TF32 on in both
  bf16  torch.autocast("cuda", dtype=torch.bfloat16) around forward and loss
the same layers as torch.nn.Sequential built from the YAML (conv2d,
batchnorm, relu, maxpool2d, flatten, linear, global_avgpool, and
`residual` as torchvision's BasicBlock), or the same model family
(`resnet` as torchvision's, `unet` as torchgpipe's U-Net, `amoebanet` as
torchgpipe's AmoebaNet-D, each with gpipe's parameter count: family_model), torch.backends.cudnn.benchmark =
True, SGD momentum 0.9, the batch copied from pinned host memory each step
(non_blocking), zero_grad(set_to_none=True), forward, cross-entropy,
backward, step, and the loss read each step (gpipe reads its once per
step too).  Median of --steps after 3 warm-ups, in ms.

--layouts: the memory formats PyTorch is timed in, each a column:
`nchw` (PyTorch's default) and `channels_last` (model and batch in
torch.channels_last: cuDNN's tensor-core convolutions without their
transposes, what a user who cares about speed sets).  The ratio takes
the faster of them (issue 67's bars), and the peak memory is that run's.
A 2-D input (the mlp) has one layout.  --compile: torch.compile's model
(default mode) in the faster layout, a column beside them (not a bar);
its compilation runs in the warm-ups.

--gpipe FILE: lines "CONFIG BATCH PRECISION MS [PEAK_BYTES]" (gpu_bars.sh
writes them) add gpipe's column and the ratio PyTorch / gpipe (above 1:
gpipe faster), and gpipe's peak device memory beside PyTorch's
(torch.cuda.max_memory_allocated over the timed run).  PyYAML is used where installed; the GPU machines' PyTorch may
come without it, so a small reader of these flat configs stands in.
--profile N: N more steps under torch.profiler after the timed ones, and
its table of kernels by their own device time (where PyTorch's step goes).
--device cpu checks the script on a machine without a GPU.
"""
import argparse
import os
import re
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEFAULT = ["bench/mlp.yaml:256", "bench/mlp.yaml:2048", "bench/convnet.yaml:128",
           "bench/convnet.yaml:1024", "bench/resnet18-32.yaml:256"]


def scalar(text):
    text = text.strip()
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text, text)


def flow_map(text):
    """'{in: 1, out: 64, kernel: 3}' -> dict (flat flow maps only)."""
    text = text.strip()
    if not text.startswith("{"):
        return scalar(text)
    out = {}
    for part in text[1:-1].split(","):
        if ":" in part:
            k, v = part.split(":", 1)
            out[k.strip()] = scalar(v)
    return out


def read_config(path):
    """The model and train sections of a bench config."""
    with open(path) as f:
        text = f.read()
    try:
        import yaml
        return yaml.safe_load(text)
    except ImportError:
        pass
    cfg = {"model": {"layers": []}, "train": {}}
    section = None
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].rstrip()
        if not line.strip():
            continue
        if not line.startswith(" "):
            section = line.rstrip(":").strip()
            continue
        s = line.strip()
        if section == "model" and s.startswith("input:"):
            cfg["model"]["input"] = [int(v) for v in re.findall(r"\d+", s)]
        elif section == "model" and s.startswith("- "):
            item = s[2:]
            if ":" in item:
                kind, args = item.split(":", 1)
                cfg["model"]["layers"].append({kind.strip(): flow_map(args)})
            else:
                cfg["model"]["layers"].append(item.strip())
        elif section == "train" and ":" in s:
            k, v = s.split(":", 1)
            cfg["train"][k.strip()] = flow_map(v)
    return cfg


# AmoebaNet-D's genotype as gpipe's cell runs it (src/layers/amoeba.c): (the
# state an operation reads, the operation), two a node, and the states
# concatenated.  "max_pool_3x3" is an average pool, as in torchgpipe.
AMOEBA_NORMAL = [(1, "conv_1x1"), (1, "avg_3x3"), (1, "none"), (0, "conv_1x7_7x1"),
                 (0, "conv_1x1"), (0, "conv_1x7_7x1"), (2, "avg_3x3"), (2, "none"),
                 (1, "avg_3x3"), (5, "conv_1x1")]
AMOEBA_NORMAL_CONCAT = [0, 3, 4, 6]
AMOEBA_REDUCTION = [(0, "max_2x2"), (0, "avg_3x3"), (2, "none"), (1, "conv_3x3"),
                    (2, "conv_1x7_7x1"), (2, "avg_3x3"), (3, "none"), (1, "max_2x2"),
                    (2, "avg_3x3"), (3, "conv_1x1")]
AMOEBA_REDUCTION_CONCAT = [4, 5, 6]


def amoebanet(layers, filters, classes):
    """torchgpipe's AmoebaNet-D as gpipe's family expands it
    (src/config/config_family.c, src/layers/amoeba.c): a relu-conv-bn stem,
    two reduction cells, then layers / 3 normal cells, a reduction, twice
    more, and a pooled linear classifier; each cell reads the previous
    output and the one before it."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    def rcb(cin, cout, k=(1, 1), s=(1, 1), p=(0, 0)):
        return [nn.ReLU(), nn.Conv2d(cin, cout, k, s, p, bias=False), nn.BatchNorm2d(cout)]

    class FactorizedReduce(nn.Module):
        def __init__(self, cin, cout):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout // 2, 1, 2, bias=False)
            self.conv2 = nn.Conv2d(cin, cout // 2, 1, 2, bias=False)
            self.bn = nn.BatchNorm2d(cout)

        def forward(self, x):
            x = F.relu(x)
            shifted = F.pad(x[:, :, 1:, 1:], (0, 1, 0, 1))
            return self.bn(torch.cat([self.conv1(x), self.conv2(shifted)], 1))

    def op(kind, c, s):
        if kind == "none":
            return FactorizedReduce(c, c) if s == 2 else nn.Identity()
        if kind == "avg_3x3":
            return nn.AvgPool2d(3, s, 1, count_include_pad=False)
        if kind == "max_2x2":
            return nn.MaxPool2d(2, s)
        if kind == "conv_1x1":
            return nn.Sequential(*rcb(c, c, s=(s, s)))
        if kind == "conv_3x3":
            return nn.Sequential(*rcb(c, c // 4), *rcb(c // 4, c // 4, (3, 3), (s, s), (1, 1)),
                                 *rcb(c // 4, c))
        return nn.Sequential(*rcb(c, c // 4), *rcb(c // 4, c // 4, (1, 7), (1, s), (0, 3)),
                             *rcb(c // 4, c // 4, (7, 1), (s, 1), (3, 0)), *rcb(c // 4, c))

    class Cell(nn.Module):
        def __init__(self, cx, cp, halve, c, red):
            super().__init__()
            self.reduce1 = nn.Sequential(*rcb(cx, c))
            self.reduce2 = (FactorizedReduce(cp, c) if halve else
                            nn.Sequential(*rcb(cp, c)) if cp != c else nn.Identity())
            self.genotype = AMOEBA_REDUCTION if red else AMOEBA_NORMAL
            self.concat = AMOEBA_REDUCTION_CONCAT if red else AMOEBA_NORMAL_CONCAT
            self.ops = nn.ModuleList(op(kind, c, 2 if red and src < 2 else 1)
                                     for src, kind in self.genotype)

        def forward(self, x, p):
            states = [self.reduce1(x), self.reduce2(p)]
            for n in range(0, len(self.ops), 2):
                a, b = self.genotype[n][0], self.genotype[n + 1][0]
                states.append(self.ops[n](states[a]) + self.ops[n + 1](states[b]))
            return torch.cat([states[i] for i in self.concat], 1)

    class AmoebaNet(nn.Module):
        def __init__(self):
            super().__init__()
            r = layers // 3
            ch = filters // 4
            self.stem = nn.Sequential(*rcb(3, ch, (3, 3), (2, 2), (1, 1)))
            kinds = [True, True] + ([False] * r + [True]) * 2 + [False] * r
            self.cells = nn.ModuleList()
            # (channels, halved since) of the two outputs before each cell
            prev2, prev = (ch, False), (ch, False)
            for k, red in enumerate(kinds):
                if red:
                    ch *= 2
                cp = prev2[0] if k >= 1 else prev[0]
                cell = Cell(prev[0], cp, k >= 1 and prev[1], ch, red)
                self.cells.append(cell)
                out = ch * len(cell.concat)
                prev2, prev = (prev[0], False), (out, red)
            self.fc = nn.Linear(prev[0], classes)

        def forward(self, x):
            x = self.stem(x)
            p = x
            for cell in self.cells:
                x, p = cell(x, p), x
            return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))

    return AmoebaNet()


def family_model(cfg):
    """The built-in families (docs/config.md) as PyTorch models:
    `amoebanet` (above), `resnet` as torchvision's (v1.5, the stride on the 3x3, as gpipe's), `unet` as
    torchgpipe's U-Net (benchmarks/models/unet) written as gpipe's family
    expands it (src/config/config_family.c): per cell num_convs units of
    3x3 conv without bias, Dropout2d(0.1), InstanceNorm2d without affine,
    LeakyReLU(0.01) in place; max pooling down, nearest upsampling x2,
    the skip concatenated (zero-padded right and bottom to its size), a 1x1
    segment convolution.  Returns (model, classes) or None for a list of
    layers.  Same parameter counts as gpipe's --dry-run."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    m = cfg["model"]
    if "resnet" in m:
        import torchvision
        r = m["resnet"]
        depth, classes = r.get("depth", 50), r.get("classes", 1000)
        return getattr(torchvision.models, "resnet%d" % depth)(num_classes=classes), classes
    if "amoebanet" in m:
        a = m["amoebanet"]
        classes = a.get("classes", 1000)
        return amoebanet(a.get("layers", 18), a.get("filters", 256), classes), classes
    if "unet" not in m:
        return None
    u = m["unet"]
    depth, convs, base = u.get("depth", 5), u.get("num_convs", 5), u.get("base", 64)
    cin, cout = u.get("in_channels", m["input"][0]), u.get("out_channels", 1)

    def cell(ci, mid, out):
        mods = []
        for q in range(convs):
            o = out if q == convs - 1 else mid
            mods += [nn.Conv2d(ci, o, 3, padding=1, bias=False), nn.Dropout2d(0.1),
                     nn.InstanceNorm2d(o), nn.LeakyReLU(0.01, inplace=True)]
            ci = o
        return nn.Sequential(*mods)

    class UNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.enc, ch = nn.ModuleList(), cin
            for i in range(depth):
                self.enc.append(cell(ch, base << i, base << i))
                ch = base << i
            self.bottleneck = cell(ch, base << depth, base << (depth - 1))
            ch = base << (depth - 1)
            self.dec = nn.ModuleList()
            for d in range(depth):
                i = depth - 1 - d
                width = base // 2 if i == 0 else base << (i - 1)
                self.dec.append(cell(ch + (base << i), width, width))
                ch = width
            self.segment = nn.Conv2d(ch, cout, 1, bias=False)

        def forward(self, x):
            skips = []
            for e in self.enc:
                x = e(x)
                skips.append(x)
                x = F.max_pool2d(x, 2)
            x = self.bottleneck(x)
            for d, dec in enumerate(self.dec):
                s = skips[depth - 1 - d]
                x = F.interpolate(x, scale_factor=2, mode="nearest")
                x = F.pad(x, (0, s.shape[3] - x.shape[3], 0, s.shape[2] - x.shape[2]))
                x = dec(torch.cat([x, s], 1))
            return self.segment(x)

    return UNet(), None


def torch_model(cfg):
    import torch.nn as nn

    class BasicBlock(nn.Module):  # torchvision's, as gpipe's `residual`
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.relu = nn.ReLU(inplace=True)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

        def forward(self, x):
            y = self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))
            return self.relu(y + (self.down(x) if self.down is not None else x))

    fam = family_model(cfg)
    if fam is not None:
        return fam
    layers, ch = [], cfg["model"]["input"][0]
    feats = None  # features after flatten
    side = cfg["model"]["input"][1:]
    for entry in cfg["model"]["layers"]:
        kind, a = (entry, {}) if isinstance(entry, str) else next(iter(entry.items()))
        a = a if isinstance(a, dict) else {}
        if kind == "conv2d":
            k, s, p = a["kernel"], a.get("stride", 1), a.get("padding", 0)
            layers.append(nn.Conv2d(a.get("in", ch) or ch, a["out"], k, stride=s, padding=p,
                                    bias=a.get("bias", True)))
            ch = a["out"]
            side = [(d + 2 * p - k) // s + 1 for d in side]
        elif kind == "batchnorm":
            layers.append(nn.BatchNorm2d(ch) if feats is None else nn.BatchNorm1d(feats))
        elif kind == "relu":
            layers.append(nn.ReLU(inplace=True))
        elif kind == "maxpool2d":
            k = a["kernel"]
            s = a.get("stride", k) or k
            layers.append(nn.MaxPool2d(k, s))
            side = [(d - k) // s + 1 for d in side]
        elif kind == "residual":
            s = a.get("stride", 1)
            layers.append(BasicBlock(ch, a["out"], s))
            ch = a["out"]
            side = [(d - 1) // s + 1 for d in side]
        elif kind == "global_avgpool":
            layers.append(nn.AdaptiveAvgPool2d(1))
            side = [1, 1]
        elif kind == "flatten":
            layers.append(nn.Flatten())
            feats = ch * side[0] * side[1]
        elif kind == "linear":
            layers.append(nn.Linear(a.get("in", feats) or feats, a["out"]))
            feats = a["out"]
        else:
            sys.exit("bench_gpu_peer: layer %r has no PyTorch twin here" % kind)
    return nn.Sequential(*layers), feats


def batch_targets(cfg, model, x, classes, device="cpu"):
    """Targets for the random host batch x and the loss: class ids for
    cross-entropy, or for bce_with_logits per-pixel 0/1 (the input's first
    channel above 1/2, as gpipe's benchmarks make them).  Both peers'."""
    import torch
    if cfg["model"].get("loss") == "bce_with_logits":
        with torch.no_grad():
            shape = model(x[:1].to(device)).shape[1:]
        y = (x[:, :1].expand(x.shape[0], *shape) > 0.5).float().contiguous()
        return y, torch.nn.BCEWithLogitsLoss()
    return torch.randint(0, classes, (x.shape[0],)), torch.nn.CrossEntropyLoss()


def step_ms(cfg, batch, precision, device, steps, profile=0, layout="nchw", compiled=False):
    import contextlib
    import torch
    cuda = device.startswith("cuda")
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    torch.backends.cudnn.allow_tf32 = precision == "tf32"
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(5)
    model, classes = torch_model(cfg)
    model = model.to(device)
    opt = cfg["train"].get("optimizer", {})
    opt = opt if isinstance(opt, dict) else {}
    sgd = torch.optim.SGD(model.parameters(), lr=opt.get("lr", 0.01), momentum=0.9)
    hx = torch.rand([batch] + list(cfg["model"]["input"]))
    hy, loss_fn = batch_targets(cfg, model, hx, classes, device)
    if layout == "channels_last":
        model = model.to(memory_format=torch.channels_last)
        hx = hx.contiguous(memory_format=torch.channels_last)
    if compiled:
        model = torch.compile(model)
    if cuda:
        hx, hy = hx.pin_memory(), hy.pin_memory()
    amp = (torch.autocast(device.split(":")[0], dtype=torch.bfloat16) if precision == "bf16"
           else contextlib.nullcontext())
    def one_step():
        x = hx.to(device, non_blocking=True)
        y = hy.to(device, non_blocking=True)
        sgd.zero_grad(set_to_none=True)
        with amp:
            loss = loss_fn(model(x), y)
        loss.backward()
        sgd.step()
        loss.item()  # reads the loss: waits for the step

    ts = []
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    for s in range(steps + 3):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        one_step()
        if s >= 3:
            ts.append(time.perf_counter() - t0)
    if profile:
        # where the time goes: torch.profiler over `profile` more steps,
        # kernels by their own device time
        acts = [torch.profiler.ProfilerActivity.CPU]
        if cuda:
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=acts) as prof:
            for _ in range(profile):
                one_step()
        avg = prof.key_averages()
        for key in ("self_device_time_total", "self_cuda_time_total", "self_cpu_time_total"):
            try:
                print(avg.table(sort_by=key, row_limit=30))
                break
            except Exception:  # the key's name changed between versions
                continue
    peak = torch.cuda.max_memory_allocated(device) if cuda else 0
    return statistics.median(ts) * 1e3, peak


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="*", help="CONFIG:BATCH (default: issue 15's five)")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--precisions", default="fp32,tf32,bf16")
    ap.add_argument("--gpipe", help="gpipe's times: lines CONFIG BATCH PRECISION MS")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="after timing, N more steps under torch.profiler: its kernel table")
    ap.add_argument("--layouts", default="nchw,channels_last",
                    help="PyTorch's memory formats, each timed (nchw, channels_last)")
    ap.add_argument("--compile", action="store_true",
                    help="torch.compile's step too, in the faster layout (a column, no bar)")
    args = ap.parse_args()
    layouts = [x for x in args.layouts.split(",") if x]
    bad = [x for x in layouts if x not in ("nchw", "channels_last")]
    if bad or not layouts:
        ap.error("--layouts: nchw and/or channels_last, not %r" % args.layouts)
    import torch
    gp = {}
    if args.gpipe and os.path.exists(args.gpipe):
        for line in open(args.gpipe):
            f = line.split()
            if len(f) in (4, 5):
                gp[(os.path.normpath(f[0]), int(f[1]), f[2])] = (
                    float(f[3]), float(f[4]) if len(f) == 5 else 0.0)
    name = (torch.cuda.get_device_name(torch.device(args.device)) if args.device.startswith("cuda")
            else "CPU")
    print("PyTorch %s on %s (%s); cudnn.benchmark; median of %d steps"
          % (torch.__version__, args.device, name, args.steps))
    print()
    print("| model, batch | precision | " + " | ".join("PyTorch %s ms" % x for x in layouts) +
          (" | torch.compile ms" if args.compile else "") +
          " | gpipe ms | PyTorch (faster) / gpipe | peak GB PyTorch (faster) | peak GB gpipe |")
    print("|---|---|" + "---|" * (len(layouts) + (1 if args.compile else 0) + 4))
    for run in args.runs or DEFAULT:
        path, batch = run.rsplit(":", 1)
        batch = int(batch)
        cfg = read_config(os.path.join(ROOT, path) if not os.path.isabs(path) else path)
        four_d = len(cfg["model"]["input"]) == 3
        for prec in args.precisions.split(","):
            cols, best = [], None
            for lay in layouts:
                if lay == "channels_last" and not four_d:
                    cols.append("-")
                    continue
                t, peak = step_ms(cfg, batch, prec, args.device, args.steps, args.profile, lay)
                cols.append("%.2f" % t)
                if best is None or t < best[0]:
                    best = (t, peak, lay)
            if args.compile:
                try:
                    c, _ = step_ms(cfg, batch, prec, args.device, args.steps, 0, best[2], True)
                    cols.append("%.2f" % c)
                except Exception as e:  # a compiler missing on the machine, say
                    print("(torch.compile failed: %s)" % str(e).splitlines()[0][:200],
                          file=sys.stderr)
                    cols.append("-")
            t, peak = best[0], best[1]
            g, gpeak = gp.get((os.path.normpath(path), batch, prec), (0.0, 0.0))
            print("| %s, %d | %s | %s | %s | %s | %.2f | %s |"
                  % (path, batch, prec, " | ".join(cols), "%.2f" % g if g else "-",
                     "**%.2f**" % (t / g) if g else "-", peak / 1e9,
                     "%.2f" % (gpeak / 1e9) if gpeak else "-"))
            sys.stdout.flush()


if __name__ == "__main__":
    main()
