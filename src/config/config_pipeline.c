/*
 * config_pipeline.c — the pipeline section: devices (a list, a count, one
 * name, or a grid with a row per data-parallel replica), replicas, balance,
 * chunks, checkpointing, lockstep, threads and memory; and the warning for
 * threads far above this machine's cores.
 */
#include "config/config_impl.h"
#include "pipeline/procs.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const k_ckpt_names[] = {"always", "except_last", "never"};
/* gp_copy_precision's order */
static const char *const k_copy_names[] = {"auto", "fp32", "bf16"};

const char *gp_checkpoint_mode_name(gp_checkpoint_mode m)
{
    return (unsigned)m < (unsigned)GP_COUNT(k_ckpt_names) ? k_ckpt_names[m] : "?";
}

/* auto follows train.precision: bf16 storage under precision bf16, the
 * issue-50 contract PyTorch's autocast users know, on every backend.  On
 * GPUs every layer of the seeds' models has bf16 kernels, measured faster
 * and smaller than FP32 storage on every row of issue 50's table (an H100
 * on 2026-11-27: ResNet-101 at 128 95 ms and a 15.2 GB peak against 133 ms
 * and 22.7 GB); on CPUs (whose precision bf16 needs bf16 instructions)
 * convolutions and linear layers run oneDNN's bf16 kernels on bf16 memory
 * since 2026-11-27, and bf16 storage was faster and half the activations'
 * peak on bench/convnet.yaml and bench/mlp.yaml (bench/README.md, "bf16
 * activations").  FP32 storage under precision fp32 and tf32. */
gp_dtype gp_config_act_dtype(const gp_config *c)
{
    if (c->train.activations != GP_ACT_AUTO)
        return c->train.activations == GP_ACT_BF16 ? GP_BF16 : GP_F32;
    return c->train.precision == GP_PRECISION_BF16 ? GP_BF16 : GP_F32;
}

bool gp_config_bf16_copies(const gp_config *c)
{
    if (gp_config_act_dtype(c) == GP_BF16) return false;
    if (c->pipeline.copy_precision == GP_COPY_AUTO) return c->train.precision == GP_PRECISION_BF16;
    return c->pipeline.copy_precision == GP_COPY_BF16;
}

static gp_status parse_device(gp_cfg_walk *w, const gp_ynode *item, int index,
                              gp_pipeline_config *pc)
{
    char got[96], sect[48];
    snprintf(sect, sizeof sect, "pipeline.devices.%d", index);
    gp_device_spec *d = &pc->devices[index];
    const gp_ynode *name_node = item;
    d->memory = pc->memory;
    d->threads = pc->threads;
    if (item->kind == GP_YNODE_MAP) {
        const char *keys[8]; /* the table's pipeline.devices.#.<key> rows */
        int nk = gp_cfg_key_children("pipeline.devices.#", keys, 8);
        GP_TRY(gp_cfg_check_keys_list(w, item, sect, keys, nk));
        name_node = gp_ymap_get(item, "name");
        if (gp_cfg_absent(name_node))
            return gp_cfg_bad(w, item, "%s needs a name, like {name: cpu:0, memory: 512MiB}", sect);
        const gp_ynode *mem = gp_ymap_get(item, "memory");
        if (!gp_cfg_absent(mem)) {
            char nm[64];
            snprintf(nm, sizeof nm, "%s.memory", sect);
            GP_TRY(gp_cfg_parse_bytes(w, mem, nm, &d->memory));
        }
        int threads;
        GP_TRY(gp_cfg_get_int32(w, item, sect, "threads", pc->threads, 0, 4096, &threads));
        d->threads = threads;
    }
    if (name_node->kind != GP_YNODE_SCALAR)
        return gp_cfg_expected(w, name_node, "a device name like cpu:0", sect);
    if (strlen(name_node->text) >= sizeof d->name)
        return gp_cfg_bad(w, name_node, "device name %s is too long",
                          gp_cfg_describe(name_node, got, sizeof got));
    gp_device_kind kind;
    int dev_index;
    if (gp_device_parse(name_node->text, &kind, &dev_index) != GP_OK) {
        char why[512];
        snprintf(why, sizeof why, "%s", gp_error_message());
        return gp_cfg_bad(w, name_node, "%s: %s", sect, why);
    }
    snprintf(d->name, sizeof d->name, "%s", name_node->text);
    return GP_OK;
}

/* With replicas, every device of every replica distinct: devices of one
 * process.  One replica may put several stages on one device (each entry
 * opens its own handle: own streams, own memory accounting), but replicas
 * sharing a device would put two ranks of one data-parallel group's
 * all-reduce on it, which NCCL refuses, and two groups on one GPU could
 * order their collectives differently and deadlock.  Under mpirun each rank
 * runs one entry on its own machine, so two entries may name the same
 * device (cuda:0 on each of two machines, or two ranks sharing one GPU). */
static gp_status check_all_distinct(const gp_cfg_walk *w, const gp_ynode *at,
                                    const gp_pipeline_config *pc)
{
    if (gp_procs_launched() || pc->replicas <= 1) return GP_OK;
    int total = pc->n_devices * pc->replicas;
    gp_device_kind kinds[GP_MAX_DEVICES];
    int idx[GP_MAX_DEVICES];
    for (int a = 0; a < total; a++) {
        if (gp_device_parse(pc->devices[a].name, &kinds[a], &idx[a]) != GP_OK)
            return gp_cfg_bad(w, at, "pipeline.devices: %s", gp_error_message());
        for (int b = 0; b < a; b++)
            if (kinds[a] == kinds[b] && idx[a] == idx[b])
                return gp_cfg_bad(w, at, "device '%s' is used by replica %d stage %d and by "
                                  "replica %d stage %d; with replicas every stage of every "
                                  "replica needs its own device, as their all-reduce (NCCL) "
                                  "takes one rank per GPU (list them as a grid, one row per "
                                  "replica: [[cpu:0, cpu:1], [cpu:2, cpu:3]]; several stages "
                                  "on one device work without replicas)", pc->devices[a].name,
                                  b / pc->n_devices, b % pc->n_devices, a / pc->n_devices,
                                  a % pc->n_devices);
        /* a stage's replicas all-reduce through one communicator, which
         * takes one backend (gp_comm_create): said here, not at the first
         * step */
        int j = a % pc->n_devices;
        if (a >= pc->n_devices && kinds[a] != kinds[j])
            return gp_cfg_bad(w, at, "stage %d is on %s in replica 0 but on %s in replica %d: a "
                              "stage's replicas reduce their gradients together, which needs one "
                              "kind of device; put each stage on the same kind (all cpu:N or all "
                              "cuda:N) in every replica", j, pc->devices[j].name,
                              pc->devices[a].name, a / pc->n_devices);
    }
    return GP_OK;
}

/* devices: [[a, b], [c, d]]: one row per replica, stages along the row. */
static gp_status parse_device_grid(gp_cfg_walk *w, const gp_ynode *dv, const gp_ynode *rep_node,
                                   gp_pipeline_config *pc)
{
    int rows = dv->n, cols = dv->items[0]->n;
    if (cols == 0)
        return gp_cfg_bad(w, dv->items[0], "pipeline.devices.0 is an empty row; give each "
                          "replica's stage devices, like [[cpu:0, cpu:1], [cpu:2, cpu:3]]");
    if ((int64_t)rows * cols > GP_MAX_DEVICES)
        return gp_cfg_bad(w, dv, "pipeline.devices has %d x %d devices; at most %d are "
                          "supported", rows, cols, GP_MAX_DEVICES);
    if (!gp_cfg_absent(rep_node)) {
        int64_t r;
        GP_TRY(gp_cfg_parse_int(w, rep_node, "pipeline.replicas", &r));
        if (r != rows)
            return gp_cfg_bad(w, rep_node, "pipeline.replicas = %lld but pipeline.devices has "
                              "%d row%s (one per replica); drop replicas or make them agree",
                              (long long)r, rows, rows == 1 ? "" : "s");
    }
    pc->replicas = rows;
    pc->n_devices = cols;
    for (int r = 0; r < rows; r++) {
        const gp_ynode *row = dv->items[r];
        if (gp_cfg_absent(row) || row->kind != GP_YNODE_SEQ || row->n != cols)
            return gp_cfg_bad(w, gp_cfg_absent(row) ? dv : row, "pipeline.devices.%d must be "
                              "a list of %d devices like row 0 (every replica has the same "
                              "stages)", r, cols);
        for (int j = 0; j < cols; j++) {
            if (gp_cfg_absent(row->items[j]))
                return gp_cfg_bad(w, row, "pipeline.devices.%d.%d is empty; give a device "
                                  "name", r, j);
            GP_TRY(parse_device(w, row->items[j], r * cols + j, pc));
        }
    }
    return check_all_distinct(w, dv, pc);
}

/* Replica r's copy of device j of a plain list: its index shifted by r x
 * (devices listed), into d (the rest of the spec copied); the shifted
 * index, or -1 where the name does not parse. */
static int shifted_device(const gp_pipeline_config *pc, int r, int j, gp_device_spec *d)
{
    gp_device_kind kind;
    int index;
    if (gp_device_parse(pc->devices[j].name, &kind, &index) != GP_OK) return -1;
    int at = index + r * pc->n_devices;
    *d = pc->devices[j];
    if (at <= 4095) gp_device_format(kind, at, d->name, sizeof d->name);
    return at;
}

bool gp_pipeline_replicas_shifted(const gp_pipeline_config *pc)
{
    const int n = pc->n_devices;
    for (int r = 1; r < gp_pipeline_replicas(pc); r++)
        for (int j = 0; j < n; j++) {
            gp_device_spec d;
            const gp_device_spec *b = &pc->devices[r * n + j];
            int at = shifted_device(pc, r, j, &d);
            if (at < 0) gp_error_clear();
            if (at < 0 || at > 4095 || strcmp(d.name, b->name) || d.memory != b->memory ||
                d.threads != b->threads)
                return false;
        }
    return true;
}

/* replicas: R with a plain device list: replica r runs on the listed
 * devices with their indices shifted by r x (devices listed), so
 * [cpu:0, cpu:1] with replicas: 2 adds [cpu:2, cpu:3]. */
static gp_status derive_replicas(gp_cfg_walk *w, const gp_ynode *at, const gp_ynode *rep_at,
                                 gp_pipeline_config *pc)
{
    int n = pc->n_devices;
    if ((int64_t)n * pc->replicas > GP_MAX_DEVICES)
        return gp_cfg_bad(w, rep_at, "pipeline.replicas = %d of %d device%s makes %d devices; at "
                          "most %d are supported in all: give at most %d replicas of %d "
                          "device%s", pc->replicas, n, n == 1 ? "" : "s", n * pc->replicas,
                          GP_MAX_DEVICES, GP_MAX_DEVICES / n, n, n == 1 ? "" : "s");
    for (int r = 1; r < pc->replicas; r++)
        for (int j = 0; j < n; j++) {
            gp_device_spec d;
            int index = shifted_device(pc, r, j, &d);
            if (index < 0) return gp_cfg_bad(w, at, "pipeline.devices: %s", gp_error_message());
            if (index > 4095) /* what gp_device_parse takes */
                return gp_cfg_bad(w, at, "replica %d's copy of %s would be device index %d, past "
                                  "4095 (replica r runs on the listed devices shifted by r x %d); "
                                  "list every replica's devices as rows instead",
                                  r, pc->devices[j].name, index, n);
            pc->devices[r * n + j] = d;
        }
    gp_cfg_note(w, "pipeline.devices of replicas 1..%d: the listed devices shifted by %d per "
                "replica", pc->replicas - 1, n);
    return check_all_distinct(w, at, pc);
}

/* Math threads far above the machine's cores take turns on them and slow
 * each other down, but a config may be written for a larger machine than
 * the one that checks it, so this is a warning, not an error.  "Far above"
 * is more than 4x the online cores (sysconf(_SC_NPROCESSORS_ONLN)): for
 * one value (pipeline.threads, a device's threads) or, failing that, for
 * the threads of all CPU devices of all replicas together, counted as
 * the trainer starts them (0 = the cores split among the CPU devices). */
#define GP_CFG_THREADS_FAR 4

bool gp_device_spec_is_cpu(const gp_device_spec *d) { return !strncmp(d->name, "cpu", 3); }

int gp_pipeline_cpu_devices(const gp_pipeline_config *pc)
{
    int total = gp_pipeline_devices_total(pc), n_cpu = 0;
    for (int a = 0; a < total; a++) n_cpu += gp_device_spec_is_cpu(&pc->devices[a]);
    return n_cpu;
}

/* The `threads` node a listed device gives itself, or NULL. */
static const gp_ynode *device_threads_node(const gp_ynode *dv, bool grid, int a, int n)
{
    const gp_ynode *item = NULL;
    if (gp_cfg_absent(dv)) return NULL;
    if (grid)
        item = dv->items[a / n]->items[a % n];
    else if (dv->kind == GP_YNODE_MAP && a == 0)
        item = dv;
    else if (dv->kind == GP_YNODE_SEQ && a < dv->n)
        item = dv->items[a];
    if (gp_cfg_absent(item) || item->kind != GP_YNODE_MAP) return NULL;
    const gp_ynode *t = gp_ymap_get(item, "threads");
    return gp_cfg_absent(t) ? NULL : t;
}

static void check_threads(gp_cfg_walk *w, const gp_ynode *m, const gp_ynode *dv, bool grid,
                          const gp_pipeline_config *pc)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores < 1) return; /* unknown: nothing to compare with */
    long far = GP_CFG_THREADS_FAR * cores;
    int total = gp_pipeline_devices_total(pc), n = pc->n_devices;
    int n_cpu = gp_pipeline_cpu_devices(pc);
    if (n_cpu == 0) return;
    const gp_ynode *pt = gp_ymap_get(m, "threads");
    if (gp_cfg_absent(pt)) pt = NULL;
    const gp_ynode *first = pt; /* the first threads key given, for the total */
    bool warned = false;
    if (pt && pc->threads > far) {
        gp_cfg_warn(w, pt, "pipeline.threads is %d, far above this machine's %ld core%s (more "
                    "than %dx): math threads beyond the cores take turns on them and slow "
                    "each other down; 0 (the default) splits the cores among the devices",
                    pc->threads, cores, cores == 1 ? "" : "s", GP_CFG_THREADS_FAR);
        warned = true;
    }
    /* devices derived for replicas 1.. share their listed device's node */
    int listed = grid ? total : n;
    for (int a = 0; a < listed; a++) {
        const gp_ynode *t = device_threads_node(dv, grid, a, n);
        if (!t || !gp_device_spec_is_cpu(&pc->devices[a])) continue;
        if (!first) first = t;
        if (pc->devices[a].threads <= far) continue;
        char key[64];
        if (grid) snprintf(key, sizeof key, "pipeline.devices.%d.%d", a / n, a % n);
        else snprintf(key, sizeof key, "pipeline.devices.%d", a);
        gp_cfg_warn(w, t, "%s.threads is %d, far above this machine's %ld core%s (more than "
                    "%dx): math threads beyond the cores take turns on them and slow each "
                    "other down", key, pc->devices[a].threads, cores, cores == 1 ? "" : "s",
                    GP_CFG_THREADS_FAR);
        warned = true;
    }
    if (warned || !first) return;
    long sum = 0, split = cores / n_cpu > 0 ? cores / n_cpu : 1;
    for (int a = 0; a < total; a++)
        if (gp_device_spec_is_cpu(&pc->devices[a]))
            sum += pc->devices[a].threads ? pc->devices[a].threads : split;
    if (sum > far)
        gp_cfg_warn(w, first, "the %d CPU device%s run %ld math threads in all, far above this "
                    "machine's %ld core%s (more than %dx): threads beyond the cores take turns "
                    "on them and slow each other down; lower pipeline.threads or the devices' "
                    "threads", n_cpu, n_cpu == 1 ? "" : "s", sum, cores, cores == 1 ? "" : "s",
                    GP_CFG_THREADS_FAR);
}

/* pipeline.checkpoint: a mode, or {mode: MODE, keep: [TYPE, ...]}: the
 * layer types (model.layers' names) whose outputs a checkpointed forward
 * keeps, so the recompute runs only the rest (checkpoint.h, gp_ckpt_kept).
 * keep with mode never is refused: nothing is recomputed there. */
static gp_status parse_checkpoint(gp_cfg_walk *w, const gp_ynode *m, gp_pipeline_config *pc)
{
    const gp_ynode *cn = gp_ymap_get(m, "checkpoint");
    int ck = 0;
    pc->checkpoint_keep = 0;
    if (gp_cfg_absent(cn) || cn->kind != GP_YNODE_MAP) {
        GP_TRY(gp_cfg_get_enum(w, m, "pipeline", "checkpoint", k_ckpt_names,
                               GP_COUNT(k_ckpt_names), GP_CKPT_EXCEPT_LAST, &ck));
        pc->checkpoint = (gp_checkpoint_mode)ck;
        return GP_OK;
    }
    GP_TRY(gp_cfg_check_keys(w, cn, "pipeline.checkpoint"));
    GP_TRY(gp_cfg_get_enum(w, cn, "pipeline.checkpoint", "mode", k_ckpt_names,
                           GP_COUNT(k_ckpt_names), GP_CKPT_EXCEPT_LAST, &ck));
    pc->checkpoint = (gp_checkpoint_mode)ck;
    const gp_ynode *kn = gp_ymap_get(cn, "keep");
    if (gp_cfg_absent(kn)) return GP_OK;
    if (kn->kind != GP_YNODE_SEQ)
        return gp_cfg_bad(w, kn, "pipeline.checkpoint.keep: expected a list of layer types, "
                          "e.g. keep: [linear, attention]");
    const char *names[GP_LAYER_TYPE_COUNT];
    for (int t = 0; t < GP_LAYER_TYPE_COUNT; t++) names[t] = gp_layer_type_name((gp_layer_type)t);
    for (int q = 0; q < kn->n; q++) {
        char name[48];
        snprintf(name, sizeof name, "pipeline.checkpoint.keep.%d", q);
        int t = 0;
        GP_TRY(gp_cfg_parse_enum(w, kn->items[q], name, names, GP_LAYER_TYPE_COUNT, &t));
        pc->checkpoint_keep |= 1u << t;
    }
    if (pc->checkpoint == GP_CKPT_NEVER && pc->checkpoint_keep)
        return gp_cfg_bad(w, kn, "pipeline.checkpoint.keep applies to checkpointed "
                          "micro-batches, and mode never checkpoints none (it keeps every "
                          "layer's output); use mode: always or except_last, or drop keep");
    return GP_OK;
}

/* pipeline.schedule: {file: PATH}: PyTorch's per-rank action CSV, read and
 * checked now (gp_schedule_file_read), its placement and stages taken
 * from it (issue 78). */
static gp_status parse_schedule_file(gp_cfg_walk *w, const gp_ynode *m, const gp_ynode *sn,
                                     gp_pipeline_config *pc)
{
    GP_TRY(gp_cfg_check_keys(w, sn, "pipeline.schedule"));
    const gp_ynode *fn = gp_ymap_get(sn, "file");
    if (gp_cfg_absent(fn) || fn->kind != GP_YNODE_SCALAR || !fn->text || !fn->text[0])
        return gp_cfg_bad(w, gp_cfg_absent(fn) ? sn : fn, "pipeline.schedule as a map is "
                          "{file: PATH}, a schedule written as PyTorch's per-rank action CSV "
                          "(gpipe-balance --simulate --write-schedule PATH writes one); or give "
                          "a name: gpipe, 1f1b, zb-h1, interleaved, zb-v");
    if (strlen(fn->text) >= sizeof pc->schedule_path)
        return gp_cfg_bad(w, fn, "pipeline.schedule.file is longer than %zu characters",
                          sizeof pc->schedule_path - 1);
    snprintf(pc->schedule_path, sizeof pc->schedule_path, "%s", fn->text);
    gp_schedule_file *f = calloc(1, sizeof *f);
    if (!f) return gp_error_set(GP_ERR_OOM, "out of host memory");
    gp_status s = gp_schedule_file_read(fn->text, pc->n_devices, f);
    if (s != GP_OK) {
        free(f);
        char msg[1600];
        snprintf(msg, sizeof msg, "%s", gp_last_error());
        return gp_cfg_bad(w, fn, "pipeline.schedule.file: %s", msg);
    }
    (void)m;
    pc->schedule_file = f;
    pc->schedule = f->v_shape ? GP_SCHEDULE_FILE_V : GP_SCHEDULE_FILE;
    pc->virtual_stages = f->stages / f->n;
    return GP_OK;
}

gp_status gp_cfg_parse_pipeline(gp_cfg_walk *w, const gp_ynode *root, gp_pipeline_config *pc)
{
    char got[96];
    const gp_ynode *m;
    GP_TRY(gp_cfg_get_map(w, root, "", "pipeline", "{devices: [cpu:0, cpu:1], chunks: 4}", &m));
    GP_TRY(gp_cfg_check_keys(w, m, "pipeline"));
    GP_TRY(gp_cfg_get_int32(w, m, "pipeline", "threads", 0, 0, 4096, &pc->threads));
    GP_TRY(gp_cfg_get_bytes(w, m, "pipeline", "memory", &pc->memory));
    const gp_ynode *mn = gp_ymap_get(m, "memory");
    if (!gp_cfg_absent(mn)) gp_yloc(w->file, mn, pc->memory_at, sizeof pc->memory_at);

    /* devices: [names or maps], a single name, a count of CPU devices, or a
     * grid with one row of names per data-parallel replica */
    const gp_ynode *dv = gp_ymap_get(m, "devices");
    const gp_ynode *rep_node = gp_ymap_get(m, "replicas");
    if (!gp_cfg_absent(dv)) gp_yloc(w->file, dv, pc->devices_at, sizeof pc->devices_at);
    bool grid = !gp_cfg_absent(dv) && dv->kind == GP_YNODE_SEQ && dv->n > 0 &&
                !gp_cfg_absent(dv->items[0]) && dv->items[0]->kind == GP_YNODE_SEQ;
    if (!grid) GP_TRY(gp_cfg_get_int32(w, m, "pipeline", "replicas", 1, 1, 1024, &pc->replicas));
    if (grid) {
        GP_TRY(parse_device_grid(w, dv, rep_node, pc));
    } else if (gp_cfg_absent(dv)) {
        pc->n_devices = 1;
        snprintf(pc->devices[0].name, sizeof pc->devices[0].name, "cpu:0");
        pc->devices[0].memory = pc->memory;
        pc->devices[0].threads = pc->threads;
        gp_cfg_note(w, "pipeline.devices = [cpu:0] (default)");
    } else if (dv->kind == GP_YNODE_SCALAR && dv->text[0] >= '0' && dv->text[0] <= '9') {
        int64_t count;
        GP_TRY(gp_cfg_parse_int(w, dv, "pipeline.devices", &count));
        if (count < 1 || count > GP_MAX_DEVICES)
            return gp_cfg_bad(w, dv, "pipeline.devices must be in [1, %d] when it is a count, "
                              "got %lld", GP_MAX_DEVICES, (long long)count);
        pc->n_devices = (int)count;
        for (int j = 0; j < pc->n_devices; j++) {
            snprintf(pc->devices[j].name, sizeof pc->devices[j].name, "cpu:%d", j);
            pc->devices[j].memory = pc->memory;
            pc->devices[j].threads = pc->threads;
        }
    } else if (dv->kind == GP_YNODE_SCALAR || dv->kind == GP_YNODE_MAP) {
        pc->n_devices = 1;
        GP_TRY(parse_device(w, dv, 0, pc));
    } else {
        if (dv->n == 0)
            return gp_cfg_bad(w, dv, "pipeline.devices is empty; give at least one device");
        if (dv->n > GP_MAX_DEVICES)
            return gp_cfg_bad(w, dv, "pipeline.devices lists %d devices; at most %d are supported",
                              dv->n, GP_MAX_DEVICES);
        pc->n_devices = dv->n;
        for (int j = 0; j < dv->n; j++) {
            if (gp_cfg_absent(dv->items[j]))
                return gp_cfg_bad(w, dv->items[j], "pipeline.devices.%d is empty; give a "
                                  "device name like cpu:%d", j, j);
            /* the same device twice: two stages on it (each entry its own
             * handle); replicas check theirs in derive_replicas */
            GP_TRY(parse_device(w, dv->items[j], j, pc));
        }
    }
    if (!grid && pc->replicas > 1)
        GP_TRY(derive_replicas(w, dv ? dv : m, gp_cfg_absent(rep_node) ? m : rep_node, pc));

    /* the schedule, and for interleaving the stages per device */
    static const char *const k_schedules[] = {"gpipe", "1f1b", "zb-h1", "interleaved", "zb-v",
                                              "dualpipe-v", "v-half", "v-min"};
    _Static_assert(GP_COUNT(k_schedules) == GP_SCHEDULE_KINDS, "a name for every schedule");
    int sk = 0;
    const gp_ynode *sn = gp_ymap_get(m, "schedule");
    if (!gp_cfg_absent(sn) && sn->kind == GP_YNODE_MAP) {
        GP_TRY(parse_schedule_file(w, m, sn, pc));
        sk = pc->schedule;
    } else {
        GP_TRY(gp_cfg_get_enum(w, m, "pipeline", "schedule", k_schedules, GP_COUNT(k_schedules),
                               GP_SCHEDULE_GPIPE, &sk));
    }
    pc->schedule = (gp_schedule_kind)sk;
    bool il = pc->schedule == GP_SCHEDULE_INTERLEAVED;
    bool zv = gp_schedule_v_shape(pc->schedule); /* (a file's is read above) */
    if (pc->schedule == GP_SCHEDULE_FILE_V) zv = false;
    bool fl = pc->schedule == GP_SCHEDULE_FILE || pc->schedule == GP_SCHEDULE_FILE_V;
    int file_v = pc->virtual_stages;
    GP_TRY(gp_cfg_get_int32(w, m, "pipeline", "virtual", il || zv ? 2 : fl ? file_v : 1, 1,
                            GP_MAX_DEVICES, &pc->virtual_stages));
    const gp_ynode *vn = gp_ymap_get(m, "virtual");
    if (fl && pc->virtual_stages != file_v)
        return gp_cfg_bad(w, vn, "pipeline.virtual = %d, but the schedule file %s places %d "
                          "stage%s on each device; leave virtual out", pc->virtual_stages,
                          pc->schedule_path, file_v, file_v == 1 ? "" : "s");
    if (zv && pc->virtual_stages != 2)
        return gp_cfg_bad(w, vn, "pipeline.virtual = %d: schedule %s places exactly 2 stages "
                          "on each device (in a V); leave virtual out", pc->virtual_stages,
                          gp_schedule_kind_name(pc->schedule));
    if (!il && !zv && !fl && pc->virtual_stages > 1)
        return gp_cfg_bad(w, vn, "pipeline.virtual = %d needs schedule: interleaved (stages per "
                          "device); set pipeline.schedule: interleaved or leave virtual out",
                          pc->virtual_stages);
    if (il && pc->virtual_stages < 2)
        return gp_cfg_bad(w, vn, "pipeline.virtual must be >= 2 with schedule: interleaved (the "
                          "stages each device holds), got %d", pc->virtual_stages);
    int stages = pc->n_devices * pc->virtual_stages;
    if (stages > GP_MAX_DEVICES)
        return gp_cfg_bad(w, vn ? vn : m, "%d devices x pipeline.virtual %d = %d stages; at most "
                          "%d", pc->n_devices, pc->virtual_stages, stages, GP_MAX_DEVICES);

    /* balance: auto or one layer count per stage */
    const gp_ynode *bal = gp_ymap_get(m, "balance");
    if (gp_cfg_absent(bal) || (bal->kind == GP_YNODE_SCALAR && !strcmp(bal->text, "auto"))) {
        pc->n_balance = 0;
        if (gp_cfg_absent(bal)) gp_cfg_note(w, "pipeline.balance = auto (default)");
    } else if (bal->kind != GP_YNODE_SEQ) {
        return gp_cfg_bad(w, bal, "expected auto or a list of layer counts, one per device, for "
                          "pipeline.balance, got %s", gp_cfg_describe(bal, got, sizeof got));
    } else {
        if (bal->n != stages && zv)
            return gp_cfg_bad(w, bal, "pipeline.balance has %d entr%s but there are %d stages "
                              "(%d devices x 2: %s places two on each, device d holding "
                              "stages d and %d - d); give one layer count per stage, in the "
                              "model's order (or balance: auto)", bal->n,
                              bal->n == 1 ? "y" : "ies", stages, pc->n_devices,
                              gp_schedule_kind_name(pc->schedule), stages - 1);
        if (bal->n != stages && pc->virtual_stages > 1)
            return gp_cfg_bad(w, bal, "pipeline.balance has %d entr%s but there are %d stages "
                              "(%d devices x pipeline.virtual %d); give one layer count per "
                              "stage (or balance: auto)", bal->n, bal->n == 1 ? "y" : "ies",
                              stages, pc->n_devices, pc->virtual_stages);
        if (bal->n != stages)
            return gp_cfg_bad(w, bal, "pipeline.balance has %d entr%s but there %s %d "
                              "device%s; give one layer count per device (or balance: auto)",
                              bal->n, bal->n == 1 ? "y" : "ies",
                              pc->n_devices == 1 ? "is" : "are", pc->n_devices,
                              pc->n_devices == 1 ? "" : "s");
        for (int j = 0; j < bal->n; j++) {
            char name[48];
            snprintf(name, sizeof name, "pipeline.balance.%d", j);
            const gp_ynode *b = bal->items[j];
            if (gp_cfg_absent(b))
                return gp_cfg_bad(w, b, "expected an integer for %s, got nothing", name);
            int64_t v;
            GP_TRY(gp_cfg_parse_int(w, b, name, &v));
            if (v < 1)
                return gp_cfg_bad(w, b, "%s must be >= 1 (every stage needs a layer), got %lld",
                                  name, (long long)v);
            if (v > INT_MAX)
                return gp_cfg_bad(w, b, "%s is too large, got %lld", name, (long long)v);
            pc->balance[j] = (int)v;
        }
        pc->n_balance = bal->n;
    }
    GP_TRY(gp_cfg_get_int32(w, m, "pipeline", "chunks", 1, 1, GP_MAX_CHUNKS, &pc->chunks));
    if (pc->schedule == GP_SCHEDULE_DUALPIPE_V && pc->chunks < 2 * pc->n_devices)
        return gp_cfg_bad(w, gp_ymap_get(m, "chunks") ? gp_ymap_get(m, "chunks") : sn,
                          "pipeline.chunks = %d: dualpipe-v needs at least as many micro-batches "
                          "as stages (2 x %d devices); set chunks: %d or more, or use zb-v",
                          pc->chunks, pc->n_devices, 2 * pc->n_devices);
    if (pc->schedule_file && pc->schedule_file->m != pc->chunks)
        return gp_cfg_bad(w, gp_ymap_get(m, "chunks") ? gp_ymap_get(m, "chunks") : sn,
                          "pipeline.chunks = %d, but the schedule file %s runs %d micro-batches; "
                          "set chunks: %d", pc->chunks, pc->schedule_path,
                          pc->schedule_file->m, pc->schedule_file->m);
    /* a step splits its batch into chunks micro-batches per replica */
    if (pc->replicas > 1 && (int64_t)pc->chunks * pc->replicas > GP_MAX_CHUNKS)
        return gp_cfg_bad(w, gp_ymap_get(m, "chunks") ? gp_ymap_get(m, "chunks") : m,
                          "pipeline.chunks = %d with %d replicas splits each batch into %lld "
                          "micro-batches, over the %d supported; lower chunks to %d or fewer",
                          pc->chunks, pc->replicas, (long long)pc->chunks * pc->replicas,
                          GP_MAX_CHUNKS, GP_MAX_CHUNKS / pc->replicas);
    GP_TRY(parse_checkpoint(w, m, pc));
    pc->lockstep_given = !gp_cfg_absent(gp_ymap_get(m, "lockstep")); /* (null: absent) */
    GP_TRY(gp_cfg_get_bool(w, m, "pipeline", "lockstep", gp_lockstep_default(pc->schedule),
                           &pc->lockstep));
    int cp = 0;
    GP_TRY(gp_cfg_get_enum(w, m, "pipeline", "copy_precision", k_copy_names,
                           GP_COUNT(k_copy_names), GP_COPY_AUTO, &cp));
    pc->copy_precision = (gp_copy_precision)cp;
    GP_TRY(gp_cfg_get_double(w, m, "pipeline", "peer_timeout", GP_PEER_TIMEOUT_DEFAULT, 0, 1e7,
                             GP_CFG_LO_OPEN, &pc->peer_timeout));
    check_threads(w, m, dv, grid, pc);
    return GP_OK;
}
