#!/usr/bin/env python3
"""make_torch_csv.py — the schedules in this folder, written by PyTorch's own
schedule code (torch.distributed.pipelining, PyTorch 2.15 from PyPI: the
venv bench/torch_venv.sh makes), for tests/test_schedule_file.py: each
schedule class's per-rank actions for n ranks and m micro-batches, computed
the way its constructor does (no process group is needed: the order is a
pure function of n, m and the stages), then, for the *_comms files, lowered
with the sends and receives by PyTorch's _add_send_recv, and written as its
_dump_csv writes them (csv.writer, one row per rank); for RUNTIME's, the
*_runtime files too: the schedule read by PyTorch's own runtime
(_PipelineScheduleRuntime._load_csv) and written back by it as
format="compute_comms" (sends, receives, each send's WAIT_SEND_*, and
whatever else its lowering adds), which is what a PyTorch user's dump is.

    /opt/gpipe-torch/bin/python tests/data/schedules/make_torch_csv.py

Kept as test data, so the tests need no torch; rerun it to refresh them.
"""
import csv
import os

import torch
import torch.distributed.pipelining.schedules as S
from torch.distributed.pipelining._utils import generate_stage_to_rank_mapping

HERE = os.path.dirname(os.path.abspath(__file__))


def orders(cls, n, m, stages):
    o = object.__new__(cls)  # the attributes its __init__ sets before ordering
    o.pp_group_size = n
    o._n_microbatches = m
    o._num_stages = o.num_stages = stages
    o.n_local_stages = stages // n
    o.number_of_rounds = max(1, m // n)
    o.microbatches_per_round = m // o.number_of_rounds
    return {r: o._calculate_single_rank_operations(r) for r in range(n)}


def write(name, rows):
    with open(os.path.join(HERE, name), "w", newline="") as f:
        w = csv.writer(f)
        for r in sorted(rows):
            w.writerow(["" if a is None else str(a) for a in rows[r]])


CASES = [  # file stem, class, ranks, micro-batches, stages, placement style
    ("zbv_n2_m4", S.ScheduleZBVZeroBubble, 2, 4, 4, "v"),
    ("zbv_n2_m8", S.ScheduleZBVZeroBubble, 2, 8, 4, "v"),
    ("zbv_n4_m8", S.ScheduleZBVZeroBubble, 4, 8, 8, "v"),
    ("interleaved_n2_m4", S.ScheduleInterleaved1F1B, 2, 4, 4, "loop"),
    ("interleaved_zb_n2_m4", S.ScheduleInterleavedZeroBubble, 2, 4, 4, "loop"),
    ("dualpipev_n2_m4", S.ScheduleDualPipeV, 2, 4, 4, "v"),
    ("dualpipev_n2_m8", S.ScheduleDualPipeV, 2, 8, 4, "v"),
]

RUNTIME = ("zbv_n2_m4", "interleaved_n2_m4", "dualpipev_n2_m4")


def runtime_dump(stem, n, m, stages):
    """stem.csv through PyTorch's runtime: read, lowered, written back."""
    o = object.__new__(S._PipelineScheduleRuntime)  # what _load_csv reads of it
    o.pp_group_size = n
    o._num_stages = stages
    o._n_microbatches = m
    o._stages = []
    o.pipeline_order = {}
    o._defer_pp_recv = False
    o._max_active_stages = 3
    o._unshard_lookahead = "full"
    o._defer_reduce_grad_wait = False
    o._max_outstanding_sends = None
    o._load_csv(os.path.join(HERE, stem + ".csv"))
    o._dump_csv(os.path.join(HERE, stem + "_runtime.csv"), format="compute_comms")


if __name__ == "__main__":
    print("PyTorch", torch.__version__)
    for stem, cls, n, m, stages, style in CASES:
        rows = orders(cls, n, m, stages)
        write(stem + ".csv", rows)
        mapping = generate_stage_to_rank_mapping(n, stages, style=style)
        write(stem + "_comms.csv", S._add_send_recv(rows, lambda s: mapping[s], stages))
        if stem in RUNTIME:
            runtime_dump(stem, n, m, stages)
        print("wrote", stem)
