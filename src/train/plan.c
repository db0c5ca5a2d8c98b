/*
 * plan.c — one planner over a run's layout (issue 79, item 3): given a
 * model, N devices of a kind and their memory, the layouts of stages x
 * replicas, schedule, micro-batches and checkpointing that fit, ranked by
 * predicted throughput (gpipe-balance --plan).
 *
 * For each n dividing N (a pipeline of n devices, R = N / n replicas of
 * it, each with train.batch_size / R samples), each schedule (gpipe, 1f1b,
 * zb-h1, interleaved with 2 stages a device, the V schedules zb-v,
 * dualpipe-v, v-half and v-min on zb-v's split), m in 1, 2, 4, .. 64 and
 * each checkpoint mode (and always / except_last keeping the products and
 * attention, or the config's pipeline.checkpoint.keep): the split gp_balance_plan makes within the
 * devices' memory, then gp_simulate_schedule's step, bubble and device
 * peaks (free-running, the optimizer's state split over the R replicas:
 * ZeRO stage 1), and the replicas' reduction added: the gradients of the
 * device that holds the most, reduce-scattered and all-gathered, 2 (R -
 * 1) / R of their bytes over the link (a GPU's NVLink, 360 GB/s; CPU
 * devices: this machine's copy bandwidth, measured once).
 *
 * Times: on CPU devices the profile of this machine (every micro-batch
 * size a layout needs, at most 16, the rest interpolated), with the other
 * N - 1 devices loaded as a run loads them; on GPUs the roofline's floor
 * (gp_roofline_profile), so a GPU plan ranks layouts by what their
 * kernels could reach, not what they measure.  Memory: every layer's bytes
 * from its shapes (gp_profile_estimate), as the check before a run's first
 * step counts them.
 */
#include "train/train.h"
#include "balance/balance.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* m = 1, 2, 4, .. MAX_M (512: micro-batches of one sequence at Llama 3
 * 70B's batch on 4 replicas) */
enum { MAX_M = 512, PLAN_MS = 10 };

static const gp_schedule_kind k_plan_kinds[] = {
    GP_SCHEDULE_GPIPE, GP_SCHEDULE_1F1B,       GP_SCHEDULE_ZB_H1,  GP_SCHEDULE_INTERLEAVED,
    GP_SCHEDULE_ZB_V,  GP_SCHEDULE_DUALPIPE_V, GP_SCHEDULE_V_HALF, GP_SCHEDULE_V_MIN};

/* This machine's copy bandwidth (bytes/s): 64 MiB copied twice, the
 * faster taken. */
static double host_copy_bw(void)
{
    size_t n = (size_t)64 << 20;
    char *a = malloc(n), *b = malloc(n);
    double best = 0;
    if (a && b) {
        memset(a, 1, n);
        memset(b, 2, n);
        for (int r = 0; r < 2; r++) {
            double t0 = gp_now();
            memcpy(b, a, n);
            double t = gp_now() - t0;
            if (t > 0 && (double)n / t > best) best = (double)n / t;
        }
    }
    free(a);
    free(b);
    return best > 0 ? best : 5e9;
}

/* The micro-batch sizes the layouts need: ceil and floor of B_R / m for
 * each replica count R dividing N and each m, ascending, at most 16 (the
 * largest spread kept; the profile interpolates between them). */
static int plan_sizes(int64_t B, int N, int L, int64_t *sizes)
{
    int64_t all[512];
    int na = 0;
    for (int n = 1; n <= N && n <= L; n++) {
        if (N % n) continue;
        int R = N / n;
        int64_t br = (B + R - 1) / R;
        for (int m = 1; m <= MAX_M && (int64_t)m * R <= B && m * R <= GP_MAX_CHUNKS; m *= 2) {
            int64_t lo = br / m, hi = (br + m - 1) / m;
            if (na < 510) all[na++] = lo > 0 ? lo : 1;
            if (na < 510) all[na++] = hi;
        }
    }
    /* unique, ascending */
    for (int a = 1; a < na; a++)
        for (int b = a; b > 0 && all[b - 1] > all[b]; b--) {
            int64_t t = all[b];
            all[b] = all[b - 1];
            all[b - 1] = t;
        }
    int nu = 0;
    for (int a = 0; a < na; a++)
        if (nu == 0 || all[a] != all[nu - 1]) all[nu++] = all[a];
    if (nu <= GP_PROFILE_MAX_SIZES) {
        memcpy(sizes, all, (size_t)nu * sizeof *sizes);
        return nu;
    }
    for (int z = 0; z < GP_PROFILE_MAX_SIZES; z++) /* spread over the range */
        sizes[z] = all[(size_t)z * (size_t)(nu - 1) / (GP_PROFILE_MAX_SIZES - 1)];
    return GP_PROFILE_MAX_SIZES;
}

/* The gradient bytes of the pipeline device holding the most parameters
 * under `balance` (S stages on n devices, dev_of). */
static double most_grad_bytes(const gp_profile *p, const gp_schedule_kind kind, int n, int v,
                              const int *balance)
{
    double dev[GP_MAX_DEVICES] = {0}, most = 0;
    for (int j = 0, f = 0; j < n * v; f += balance[j++])
        for (int k = f; k < f + balance[j]; k++)
            dev[gp_schedule_device_of(kind, n, j)] += (double)p->mem[k].grad_bytes;
    for (int d = 0; d < n; d++) most = fmax(most, dev[d]);
    return most;
}

/* One candidate layout planned and simulated into *lt; false (with the
 * reason counted) where it does not fit or cannot be made. */
/* A V split made for one V schedule, for the others of the same (n, m,
 * checkpoint): the exact V partition costs L^3 n, and planning four V
 * schedules each its own took GPT-2 on 8 GPUs from 7 to 32 s. */
typedef struct {
    bool have;
    int balance[GP_MAX_DEVICES];
} v_split;

/* The bytes a device holds in the plan (0: unlimited): --memory, else the
 * smallest the config gives its devices (pipeline.devices[d].memory, else
 * pipeline.memory), since the plan's N devices are of one kind and any of
 * them may hold any stage.  *smallest: the config's devices differ (one
 * limited and another not counts) and the smallest was taken.  (It took
 * pipeline.memory alone: a config that capped each device planned as if
 * memory were unlimited.) */
static double plan_capacity(const gp_config *cfg, const gp_plan_request *rq, bool *smallest)
{
    *smallest = false;
    if (rq->memory > 0) return rq->memory;
    const gp_pipeline_config *pc = &cfg->pipeline;
    int listed = pc->n_devices * (pc->replicas > 1 ? pc->replicas : 1);
    if (listed > GP_MAX_DEVICES) listed = GP_MAX_DEVICES;
    double least = 0;
    bool unlimited = false;
    for (int d = 0; d < listed; d++) {
        size_t b = pc->devices[d].memory ? pc->devices[d].memory : pc->memory;
        if (!b) {
            unlimited = true;
            continue;
        }
        if (least > 0 && (double)b != least) *smallest = true;
        if (least <= 0 || (double)b < least) least = (double)b;
    }
    if (least > 0 && unlimited) *smallest = true;
    return least > 0 ? least : (double)pc->memory;
}

static bool plan_one(const gp_config *cfg, const gp_profile *base, int N, int n,
                     gp_schedule_kind kind, int m, gp_checkpoint_mode ck, gp_ckpt_keep keep,
                     double capacity, double link_bw, v_split *vs, gp_plan_result *res,
                     gp_layout *lt)
{
    int64_t B = cfg->train.batch_size;
    int R = N / n, v = gp_schedule_stages_per_device(kind, 2), S = n * v;
    gp_profile p = *base; /* (a shallow copy: the replica's batch and state split) */
    p.batch = (B + R - 1) / R;
    p.optim_shards = gp_model_optim_shards_for(cfg, R); /* (1 for tied weights, as a run) */
    gp_model_profile_keep(cfg, keep, &p); /* (the layers' flags: this candidate's keep) */
    /* the plan's options as a run of this layout takes them, free-running,
     * split by time alone and its memory checked after: the memory-bound
     * split walks a stage's schedule for every (stage, first, count), too
     * slow over hundreds of layouts of a large model (a layout that fits
     * only with a memory-bound split is missed: gpipe-balance --simulate
     * with its devices finds it) */
    gp_config c = *cfg; /* (shallow: the pipeline's numbers alone differ) */
    gp_pipeline_config *pc = &c.pipeline;
    pc->n_devices = n;
    pc->schedule = kind;
    pc->chunks = m;
    pc->checkpoint = ck;
    pc->checkpoint_keep = keep;
    pc->lockstep = false;
    pc->memory = 0;
    for (int d = 0; d < n; d++) pc->devices[d].memory = 0;
    gp_plan_opts po;
    gp_model_plan_opts(&c, S, &po);
    int bal[GP_MAX_DEVICES];
    bool vk = gp_schedule_v_shape(kind);
    if (vk && vs->have) {
        memcpy(bal, vs->balance, sizeof bal);
    } else if (gp_balance_plan(&p, &po, bal) != GP_OK) {
        gp_error_clear();
        res->no_memory++;
        return false;
    } else if (vk) {
        memcpy(vs->balance, bal, sizeof bal);
        vs->have = true;
    }
    double cap[GP_MAX_DEVICES];
    for (int d = 0; d < n; d++) cap[d] = capacity;
    gp_sim_result sim;
    if (gp_simulate_schedule(&p, kind, n, v, bal, m, ck, false, capacity > 0 ? cap : NULL,
                             &sim) != GP_OK) {
        gp_error_clear();
        res->no_schedule++;
        return false;
    }
    if (!sim.fits) {
        res->no_memory++;
        return false;
    }
    memset(lt, 0, sizeof *lt);
    lt->devices = n;
    lt->replicas = R;
    lt->schedule = kind;
    lt->virtual_stages = v;
    lt->m = m;
    lt->checkpoint = ck;
    lt->keep = keep;
    memcpy(lt->balance, bal, (size_t)S * sizeof *bal);
    lt->reduce = R > 1 ? 2.0 * (R - 1) / R * most_grad_bytes(&p, kind, n, v, bal) / link_bw : 0;
    lt->step = sim.step + lt->reduce;
    lt->bubble = sim.bubble;
    lt->samples_per_s = (double)B / lt->step;
    lt->peak = gp_sim_peak(&sim);
    return true;
}

/* The selective recompute the planner weighs beside the modes: the
 * config's pipeline.checkpoint.keep, else Megatron-LM's choice (the
 * products' and attention's outputs kept) where the model has both; 0:
 * none. */
static gp_ckpt_keep plan_keep_of(const gp_config *cfg)
{
    if (cfg->pipeline.checkpoint_keep) return cfg->pipeline.checkpoint_keep;
    gp_ckpt_keep has = 0, want = 1u << GP_LAYER_LINEAR | 1u << GP_LAYER_ATTENTION;
    for (int k = 0; k < cfg->model.n_layers; k++) has |= 1u << cfg->model.layers[k].type;
    return (has & want) == want ? want : 0;
}

static int by_throughput(const void *a, const void *b)
{
    double x = ((const gp_layout *)a)->samples_per_s, y = ((const gp_layout *)b)->samples_per_s;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* The profile: this machine's CPU devices (N of them loaded, as a run of N
 * would) or the GPU's roofline, at the micro-batch sizes the layouts need. */
static gp_status plan_profile(const gp_config *cfg, const gp_plan_request *rq,
                              const int64_t *sizes, int nz, gp_profile *prof)
{
    int N = rq->devices;
    gp_config c = *cfg; /* (shallow: the devices alone differ) */
    c.pipeline.replicas = 1;
    c.pipeline.n_balance = 0;
    if (rq->gpu) return gp_roofline_profile(&c, rq->gpu, sizes, nz, prof);
    c.pipeline.n_devices = N;
    for (int j = 0; j < N; j++) {
        snprintf(c.pipeline.devices[j].name, sizeof c.pipeline.devices[j].name, "cpu:%d", j);
        c.pipeline.devices[j].threads = rq->threads > 0 ? rq->threads : 1;
        c.pipeline.devices[j].memory = 0;
    }
    /* devices that share cores run every layout slower than the profile
     * (one device's load and its neighbours') says */
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int t = c.pipeline.devices[0].threads, need = N * t;
    if (rq->say && cores > 0 && need > cores)
        fprintf(stderr, "warning: %d CPU devices x %d thread%s need %d cores and this machine "
                        "has %ld: the devices will share cores and run every layout slower "
                        "than planned (2.0-2.2x measured with 4 devices on 2 cores, "
                        "bench/README.md); plan for at most %ld devices of one thread here\n",
                N, t, t == 1 ? "" : "s", need, cores, cores);
    gp_model_profile_opts mo = {.timed = true, .warmup = 1, .reps = rq->reps > 0 ? rq->reps : 3,
                                .n_sizes = nz, .say = rq->say, .threads = t};
    memcpy(mo.sizes, sizes, (size_t)nz * sizeof *sizes);
    return gp_model_profile(&c, &mo, prof); /* (measured whole: each replica's share is set
                                               per layout) */
}

/* The layers the V's exact split works over: a long model's units
 * (gp_profile_units: it is split at its repeated blocks, said where `say`),
 * else every layer. */
static int plan_units(const gp_profile *prof, bool say)
{
    int L = prof->L, *ustart = malloc(((size_t)L + 1) * sizeof *ustart);
    int U = ustart ? gp_profile_units(prof, ustart) : 0, blocks = 0;
    for (int u = 0; u < U; u++) blocks += ustart[u + 1] - ustart[u] > 1;
    free(ustart);
    if (say && U > 0)
        fprintf(stderr, "planning: the %d layers split between %d repeated blocks of %d layers "
                        "and at the %d others\n",
                L, blocks, blocks ? (L - (U - blocks)) / blocks : 0, U - blocks);
    return U > 0 ? U : L;
}

gp_status gp_plan_layouts(const gp_config *cfg, const gp_plan_request *rq, gp_plan_result *out)
{
    memset(out, 0, sizeof *out);
    int N = rq->devices, L = cfg->model.n_layers;
    if (N < 1 || N > GP_MAX_DEVICES)
        return gp_error_set(GP_ERR_INVALID, "--plan %d: give 1 to %d devices", N, GP_MAX_DEVICES);
    int64_t B = cfg->train.batch_size;
    int64_t sizes[GP_PROFILE_MAX_SIZES];
    int nz = plan_sizes(B, N, L, sizes);
    if (nz < 1) return gp_error_set(GP_ERR_INVALID, "--plan: no layout has a sample a micro-batch");
    gp_profile prof;
    GP_TRY(plan_profile(cfg, rq, sizes, nz, &prof));
    gp_model_profile_facts(cfg, &prof); /* (the optimizer's shards: per layout) */
    double capacity = plan_capacity(cfg, rq, &out->capacity_smallest);
    if (capacity <= 0 && rq->gpu) capacity = strcmp(rq->gpu, "h200") ? 80e9 : 141e9;
    double link = rq->gpu ? 360e9 : host_copy_bw() / 3.0; /* (a reduction: ~3 passes) */
    gp_ckpt_keep plan_keep = plan_keep_of(cfg);
    int Lv = plan_units(&prof, rq->say); /* (the V's exact split: up to 128) */
    int cap = 0;
    double t_say = gp_now();
    for (int n = 1; n <= N && n <= L; n++) {
        if (N % n) continue;
        int R = N / n;
        if (rq->say && gp_now() - t_say > 5) {
            fprintf(stderr, "planning: pipelines of %d devices x %d replicas (%d layouts so "
                            "far)\n", n, R, out->considered);
            t_say = gp_now();
        }
        v_split vsplit[PLAN_MS][5]; /* by m (1, 2, 4, ...) and checkpoint choice */
        memset(vsplit, 0, sizeof vsplit);
        for (size_t q = 0; q < sizeof k_plan_kinds / sizeof *k_plan_kinds; q++) {
            gp_schedule_kind kind = k_plan_kinds[q];
            int v = gp_schedule_stages_per_device(kind, 2);
            if (n == 1 && kind != GP_SCHEDULE_GPIPE) continue; /* (one device: one order) */
            /* (the exact V split costs L^3 n: a 355-layer model took
             * seconds a layout; the V is planned up to 8 devices and 128
             * layers) */
            if (gp_schedule_v_shape(kind) && (n > 8 || Lv > 128)) continue;
            for (int m = 1, mi = 0; m <= MAX_M; m *= 2, mi++)
                for (int cq = 0; cq < 5; cq++) { /* the modes, then always and except_last keeping */
                    gp_checkpoint_mode ck = (gp_checkpoint_mode)(cq % 3);
                    gp_ckpt_keep keep = cq < 3 ? 0 : plan_keep;
                    if (cq >= 3 && !keep) continue;
                    /* one stage is its pipeline's last: except_last, kept or
                     * not, checkpoints nothing, never's run listed twice */
                    if (n * v == 1 && ck == GP_CKPT_EXCEPT_LAST) continue;
                    out->considered++;
                    /* (the config's limit too: a layout it refuses is no plan) */
                    if ((int64_t)m * R > B || (int64_t)m * R > GP_MAX_CHUNKS) {
                        out->no_batch++;
                        continue;
                    }
                    if (n * v > L || (kind == GP_SCHEDULE_INTERLEAVED && m % n)) {
                        out->no_schedule++;
                        continue;
                    }
                    if (out->n_layouts == cap) {
                        int nc = cap ? 2 * cap : 64;
                        gp_layout *nl = realloc(out->layouts, (size_t)nc * sizeof *nl);
                        if (!nl) {
                            gp_profile_free(&prof);
                            gp_plan_result_free(out);
                            return gp_error_set(GP_ERR_OOM, "out of host memory planning");
                        }
                        out->layouts = nl;
                        cap = nc;
                    }
                    if (plan_one(cfg, &prof, N, n, kind, m, ck, keep, capacity, link,
                                 &vsplit[mi][cq], out, &out->layouts[out->n_layouts]))
                        out->n_layouts++;
                }
        }
    }
    /* MFU on a GPU: the step's FLOPs (3 x the forward's) over N x peak */
    double flops = 0;
    for (int k = 0; k < prof.L; k++) flops += prof.mem[k].flops_per_sample;
    double peak = rq->gpu ? gp_roofline_peak(rq->gpu, cfg->train.precision) : 0;
    for (int i = 0; i < out->n_layouts; i++) {
        gp_layout *lt = &out->layouts[i];
        lt->mfu = peak > 0 ? 3.0 * flops * (double)B / (lt->step * N * peak) : NAN;
    }
    qsort(out->layouts, (size_t)out->n_layouts, sizeof *out->layouts, by_throughput);
    out->capacity = capacity;
    gp_profile_free(&prof);
    return GP_OK;
}

void gp_plan_result_free(gp_plan_result *r)
{
    free(r->layouts);
    memset(r, 0, sizeof *r);
}
