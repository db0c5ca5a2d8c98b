/*
 * amoeba.c — the AmoebaNet-D cell (torchgpipe's benchmarks/models/amoebanet
 * Cell, with its genotype) as one layer, so that gpipe's layers are
 * torchgpipe's top-level modules one to one.
 *
 * A cell takes two tensors, the previous cell's output x (main input) and
 * the output of the cell before that, p (popped: the stem's first cell has
 * none and uses x for both).  torchgpipe passes the pair as a tuple
 * (x, skip) from cell to cell; gpipe passes p as a skip connection from the
 * cell two back (its `stash`) to this one (`pop`), which the pipeline copies
 * straight from stage to stage like any skip, so the two tensors cross
 * every stage boundary between them as in torchgpipe.
 *
 * With C = spec.out channels per state:
 *   s0 = reduce1(x)            relu -> 1x1 conv (C) -> batch norm
 *   s1 = reduce2(p)            factorized reduce (C) if p is twice x's height
 *                              and width (the previous cell was a reduction),
 *                              else relu -> 1x1 conv -> norm if p does not
 *                              have C channels, else p itself
 *   s(2+t) = op(2t)(s[i(2t)]) + op(2t+1)(s[i(2t+1)])   t = 0 .. 4
 *   y  = cat(s[c] for c in concat) along channels
 * with (i, op) and concat from the genotype below.  In a reduction cell the
 * operations on s0 and s1 have stride 2.  The operations:
 *   none           identity (stride 2: factorized reduce)
 *   avg_pool_3x3   average pool 3x3, padding 1, count_include_pad = false
 *   max_pool_3x3   torchgpipe's code builds an AVERAGE pool here, the same
 *                  as avg_pool_3x3 (operations.py); gpipe matches its
 *                  numbers, so it is an average pool too
 *   max_pool_2x2   max pool 2x2, padding 0
 *   conv_1x1       relu -> 1x1 conv (C) -> norm
 *   conv_3x3       relu -> 1x1 (C/4) -> norm -> relu -> 3x3 (C/4) -> norm ->
 *                  relu -> 1x1 (C) -> norm
 *   conv_1x7_7x1   relu -> 1x1 (C/4) -> norm -> relu -> 1x7 (C/4) -> norm ->
 *                  relu -> 7x1 (C/4) -> norm -> relu -> 1x1 (C) -> norm
 * Convolutions have no bias and PyTorch's default init (torchgpipe's
 * AmoebaNet sets none); the norms take the cell's momentum, eps and sync.
 *
 * Every unit is a child layer of the stand-alone type (relu, conv2d,
 * batchnorm, avgpool2d, maxpool2d, factorized_reduce), so the math is
 * theirs; the cell owns the parameters (children hold views, as in
 * residual.c), named as torchgpipe's state dict names them inside a cell:
 * "reduce1.1.weight", "reduce1.2.running_mean", "reduce2.conv1.weight",
 * "operations.3.module.4.weight" (Operation wraps its module; the index is
 * the unit's place in its nn.Sequential).
 *
 * gp_saved (training forward): s->sub[c] is child c's own gp_saved; the
 * tensors, each child's output (index c) and the sums s2 .. s6 (index
 * n_child + k), live in the blocks after them, GP_SAVED_MAX to a block.
 * Backward runs the graph in reverse: the concatenation's gradient is cut
 * into its states, then node by node from the last, each state's gradient
 * goes back through both of its operations and is added to the gradient of
 * the state each read (a fixed order, so the sums are deterministic), and
 * finally through reduce1 and reduce2 into dx[0] and dx[1] (or both into
 * dx[0] for the first cell).  It produces dx and every weight gradient in
 * one pass, so backward_data does it all and flags gp_saved, as batch norm
 * and factorized reduce do.
 */
#include "layers/layers_impl.h"

#include <stdlib.h>
#include <string.h>

enum { MAX_CHILD = 64, N_OPS = 10, N_NODES = N_OPS / 2, MAX_STATES = 2 + N_NODES,
       N_CHAINS = 2 + N_OPS, MAX_COUNTERS = 32 };

typedef enum {
    OP_NONE, OP_AVG_3X3, OP_MAX_3X3 /* an average pool: see above */, OP_MAX_2X2,
    OP_CONV_1X1, OP_CONV_3X3, OP_CONV_1X7_7X1
} op_kind;

typedef struct {
    int from;   /* the state it reads */
    op_kind op;
} genotype_op;

/* torchgpipe's benchmarks/models/amoebanet/genotype.py (AmoebaNet-D, with
 * TensorFlow's normal_concat [0, 3, 4, 6], which reproduces GPipe's
 * parameter counts). */
static const genotype_op k_normal[N_OPS] = {
    {1, OP_CONV_1X1}, {1, OP_MAX_3X3}, {1, OP_NONE}, {0, OP_CONV_1X7_7X1},
    {0, OP_CONV_1X1}, {0, OP_CONV_1X7_7X1}, {2, OP_MAX_3X3}, {2, OP_NONE},
    {1, OP_AVG_3X3}, {5, OP_CONV_1X1},
};
static const int k_normal_concat[] = {0, 3, 4, 6};
static const genotype_op k_reduction[N_OPS] = {
    {0, OP_MAX_2X2}, {0, OP_MAX_3X3}, {2, OP_NONE}, {1, OP_CONV_3X3},
    {2, OP_CONV_1X7_7X1}, {2, OP_MAX_3X3}, {3, OP_NONE}, {1, OP_MAX_2X2},
    {2, OP_AVG_3X3}, {3, OP_CONV_1X1},
};
static const int k_reduction_concat[] = {4, 5, 6};

/* Chain ci's input: the main input, the popped one (the main one if none),
 * or a state. */
enum { FROM_X = -1, FROM_P = -2 };

typedef struct {
    int from;    /* FROM_X, FROM_P or a state index */
    int c0, nc;  /* its child layers [c0, c0 + nc); nc = 0: identity */
} chain;

/* What a cell is made of, for given input shapes: the child specs in
 * order, their parameter prefixes, and the chains (0 reduce1, 1 reduce2,
 * 2 + k operation k). */
typedef struct {
    gp_layer_spec spec[MAX_CHILD];
    char prefix[MAX_CHILD][32];
    int n_child;
    chain ch[N_CHAINS];
    const genotype_op *ops;
    const int *concat;
    int n_concat;
    /* tensor i (tensor_at's numbering: child i's output, or state k's sum
     * at n_child + k) is dropped, its shape kept, once a training forward
     * is done: no backward reads its values (plan_unkept) */
    bool unkept[MAX_CHILD + MAX_STATES];
} cell_plan;

typedef struct {
    cell_plan plan;
    gp_layer child[MAX_CHILD];
    int first[MAX_CHILD];  /* index in the cell's params of child's params[0] */
    char counter_name[MAX_COUNTERS][64];
    int64_t *counter[MAX_COUNTERS];
    int n_counters;
} cell_state;

/* ---- the plan ------------------------------------------------------------------- */

/* Child `name` of type t (a Sequential's unit: "<base>.<j>"; j < 0: the
 * module itself, "<base>"). */
static gp_layer_spec *unit(const gp_layer *l, cell_plan *p, gp_layer_type t, const char *base,
                           int j)
{
    GP_ASSERT(p->n_child < MAX_CHILD);
    gp_layer_spec *s = &p->spec[p->n_child];
    char name[sizeof p->prefix[0]];
    if (j < 0) snprintf(name, sizeof name, "%s", base);
    else snprintf(name, sizeof name, "%s.%d", base, j);
    memcpy(p->prefix[p->n_child], name, sizeof name);
    *s = gp_layers_child_spec(l, t, name);
    s->momentum = l->spec.momentum;
    s->eps = l->spec.eps;
    s->sync = l->spec.sync;
    p->n_child++;
    return s;
}

/* relu -> conv (no bias) -> norm, as units j, j + 1, j + 2 of the
 * Sequential `base`. */
static void relu_conv_bn(const gp_layer *l, cell_plan *p, const char *base, int j, int64_t out,
                         gp_hw kernel, gp_hw stride, gp_hw pad)
{
    unit(l, p, GP_LAYER_RELU, base, j);
    gp_layer_spec *c = unit(l, p, GP_LAYER_CONV2D, base, j + 1);
    c->out = out;
    c->kernel = kernel;
    c->stride = stride;
    c->padding = pad;
    c->bias = false;
    unit(l, p, GP_LAYER_BATCHNORM, base, j + 2);
}

static void begin_chain(cell_plan *p, int ci, int from)
{
    p->ch[ci].from = from;
    p->ch[ci].c0 = p->n_child;
}

static void end_chain(cell_plan *p, int ci) { p->ch[ci].nc = p->n_child - p->ch[ci].c0; }

/* Whether some backward reads state k's values: a chain's first child that
 * reads its input (an identity chain hands the state to a sum, and sums
 * and the concatenation read no values). */
static bool state_read(const cell_plan *p, int k)
{
    for (int ci = 2; ci < N_CHAINS; ci++)
        if (p->ch[ci].from == k && p->ch[ci].nc > 0 &&
            !gp_layer_spec_ignores_x(&p->spec[p->ch[ci].c0]))
            return true;
    return false;
}

/* p->unkept: the cell's tensors whose values no backward reads, as
 * gp_layers_unkept finds them between a stage's layers: a child whose
 * backward ignores its output, read by nothing that reads values (the next
 * child of its chain, or for a chain's last child its sum, or the
 * operations and concatenation that take the state), and the sums read
 * likewise.  Every unit's batch-norm output (a relu or a sum reads it),
 * the states only sums, relus, average pools and the concatenation take,
 * and the average pools' outputs (their backward reads neither x nor y):
 * 21 maps of an AmoebaNet-D normal cell (13 norms' outputs, 5 sums, 3
 * pools' outputs), which PyTorch's autograd does not keep either. */
static void plan_unkept(cell_plan *p)
{
    memset(p->unkept, 0, sizeof p->unkept);
    for (int ci = 0; ci < N_CHAINS; ci++) {
        const chain *ch = &p->ch[ci];
        for (int c = ch->c0; c < ch->c0 + ch->nc; c++) {
            if (!gp_layer_spec_ignores_y(&p->spec[c])) continue;
            if (c + 1 < ch->c0 + ch->nc) p->unkept[c] = gp_layer_spec_ignores_x(&p->spec[c + 1]);
            else p->unkept[c] = ci >= 2 || !state_read(p, ci);
        }
    }
    for (int k = 2; k < MAX_STATES; k++) p->unkept[p->n_child + k] = !state_read(p, k);
}

/* The plan for main input x and popped p (NULL: none), batch 1.  Checks
 * what only the cell can (the child layers check the rest). */
static gp_status make_plan(const gp_layer *l, const gp_shape *x, const gp_shape *pop,
                           cell_plan *p)
{
    char b[96], b2[96];
    const int64_t c = l->spec.out;
    const bool red = l->spec.reduction;
    memset(p, 0, sizeof *p);
    if (x->ndim != 4 || (pop && pop->ndim != 4))
        return gp_layer_spec_error(l, "expected 4-D inputs (N, C, H, W) but got %s; an "
                                   "amoeba_cell cannot follow flatten or linear layers",
                                   gp_layers_shape_n(x->ndim != 4 ? x : pop, b, sizeof b));
    if (c <= 0 || c % 4 != 0)
        return gp_layer_spec_error(l, "out = %lld must be a positive multiple of 4 (the "
                                   "channels of each state; its 3x3 and 1x7/7x1 branches "
                                   "narrow to out / 4); write e.g. {amoeba_cell: {out: 64}}",
                                   (long long)c);
    if (red && (x->dims[2] % 2 || x->dims[3] % 2))
        return gp_layer_spec_error(l, "a reduction cell needs an even height and width (its "
                                   "2x2 max pool and stride-2 3x3 branches must agree) but "
                                   "its input is %s", gp_layers_shape_n(x, b, sizeof b));
    bool halve = false; /* the popped tensor is the one before a reduction */
    if (pop && (pop->dims[2] != x->dims[2] || pop->dims[3] != x->dims[3])) {
        halve = (pop->dims[2] + 1) / 2 == x->dims[2] && (pop->dims[3] + 1) / 2 == x->dims[3];
        if (!halve)
            return gp_layer_spec_error(l, "popped '%s' is %s but the input is %s: the popped "
                                       "tensor must have the input's height and width, or "
                                       "twice them (the output of the cell before a "
                                       "reduction cell)", l->spec.pop[0],
                                       gp_layers_shape_n(pop, b, sizeof b),
                                       gp_layers_shape_n(x, b2, sizeof b2));
    }
    const int64_t cp = pop ? pop->dims[1] : x->dims[1];
    const gp_hw one = gp_hw_square(1), zero = gp_hw_square(0);

    begin_chain(p, 0, FROM_X);
    relu_conv_bn(l, p, "reduce1", 0, c, one, one, zero);
    end_chain(p, 0);
    begin_chain(p, 1, FROM_P);
    if (halve) unit(l, p, GP_LAYER_FACTORIZED_REDUCE, "reduce2", -1)->out = c;
    else if (cp != c) relu_conv_bn(l, p, "reduce2", 0, c, one, one, zero);
    end_chain(p, 1);

    p->ops = red ? k_reduction : k_normal;
    p->concat = red ? k_reduction_concat : k_normal_concat;
    p->n_concat = red ? 3 : 4;
    for (int k = 0; k < N_OPS; k++) {
        const int s = red && p->ops[k].from < 2 ? 2 : 1;
        char f[32];
        snprintf(f, sizeof f, "operations.%d.module", k);
        begin_chain(p, 2 + k, p->ops[k].from);
        switch (p->ops[k].op) {
        case OP_NONE:
            if (s == 2) unit(l, p, GP_LAYER_FACTORIZED_REDUCE, f, -1)->out = c;
            break;
        case OP_AVG_3X3:
        case OP_MAX_3X3: {
            gp_layer_spec *u = unit(l, p, GP_LAYER_AVGPOOL2D, f, -1);
            u->kernel = gp_hw_square(3);
            u->stride = gp_hw_square(s);
            u->padding = one;
            u->count_include_pad = false;
            break;
        }
        case OP_MAX_2X2: {
            gp_layer_spec *u = unit(l, p, GP_LAYER_MAXPOOL2D, f, -1);
            u->kernel = gp_hw_square(2);
            u->stride = gp_hw_square(s);
            u->padding = zero;
            break;
        }
        case OP_CONV_1X1:
            relu_conv_bn(l, p, f, 0, c, one, gp_hw_square(s), zero);
            break;
        case OP_CONV_3X3:
            relu_conv_bn(l, p, f, 0, c / 4, one, one, zero);
            relu_conv_bn(l, p, f, 3, c / 4, gp_hw_square(3), gp_hw_square(s), one);
            relu_conv_bn(l, p, f, 6, c, one, one, zero);
            break;
        case OP_CONV_1X7_7X1:
            relu_conv_bn(l, p, f, 0, c / 4, one, one, zero);
            relu_conv_bn(l, p, f, 3, c / 4, (gp_hw){1, 7}, (gp_hw){1, s}, (gp_hw){0, 3});
            relu_conv_bn(l, p, f, 6, c / 4, (gp_hw){7, 1}, (gp_hw){s, 1}, (gp_hw){3, 0});
            relu_conv_bn(l, p, f, 9, c, one, one, zero);
            break;
        }
        end_chain(p, 2 + k);
    }
    plan_unkept(p);
    return GP_OK;
}

/* Walks the plan's child layers in order with their input shapes (batch 1),
 * calling visit(child, in, out) on each; fills the states' shapes. */
typedef gp_status (*visit_fn)(void *arg, int c, const gp_layer_spec *spec, const gp_shape *in);

static gp_status walk(const gp_layer *l, const cell_plan *p, const gp_shape *x,
                      const gp_shape *pop, gp_shape *states, visit_fn visit, void *arg)
{
    for (int ci = 0; ci < N_CHAINS; ci++) {
        const chain *ch = &p->ch[ci];
        gp_shape cur = ch->from == FROM_X ? *x : ch->from == FROM_P ? (pop ? *pop : *x)
                                                                    : states[ch->from];
        for (int c = ch->c0; c < ch->c0 + ch->nc; c++) {
            gp_layer t;
            GP_TRY(gp_layer_shapes(&p->spec[c], l->index, &cur, &t));
            if (visit) GP_TRY(visit(arg, c, &p->spec[c], &cur));
            cur = t.out_shape;
        }
        if (ci < 2) {
            states[ci] = cur;
        } else if (ci % 2 == 1) { /* the second operation of node (ci - 2) / 2 */
            int k = 2 + (ci - 2) / 2;
            gp_shape a = states[k]; /* the first's output, kept there */
            if (!gp_shape_equal(&a, &cur)) {
                char b1[96], b2[96];
                return gp_layer_spec_error(l, "state %d adds %s and %s, which differ (the "
                                           "input %s is too small or odd-sized for this cell)",
                                           k, gp_layers_shape_n(&a, b1, sizeof b1),
                                           gp_layers_shape_n(&cur, b2, sizeof b2),
                                           gp_layers_shape_n(x, b1, sizeof b1));
            }
        } else {
            states[2 + (ci - 2) / 2] = cur;
        }
    }
    return GP_OK;
}

static gp_status cell_infer(const gp_layer *l, const gp_shape *in, gp_shape *out)
{
    cell_plan *p = malloc(sizeof *p);
    if (!p) return gp_error_set(GP_ERR_OOM, "out of host memory for an amoeba cell");
    const gp_shape *pop = l->n_in > 1 ? &in[1] : NULL;
    gp_shape st[MAX_STATES];
    gp_status s = make_plan(l, &in[0], pop, p);
    if (s == GP_OK) s = walk(l, p, &in[0], pop, st, NULL, NULL);
    if (s == GP_OK) {
        const gp_shape *a = &st[p->concat[0]];
        int64_t ch = 0;
        for (int q = 0; q < p->n_concat; q++) ch += st[p->concat[q]].dims[1];
        *out = gp_shape_4d(in[0].dims[0], ch, a->dims[2], a->dims[3]);
    }
    free(p);
    return s;
}

/* ---- construction ------------------------------------------------------------------ */

typedef struct {
    gp_layer *l;
    cell_state *st;
    uint64_t seed;
} init_arg;

static gp_status init_child(void *arg, int c, const gp_layer_spec *spec, const gp_shape *in)
{
    init_arg *a = arg;
    return gp_layers_child_setup(a->l, spec, a->st->plan.prefix[c], in, a->seed,
                                 &a->st->child[c], &a->st->first[c]);
}

static gp_status cell_init(gp_layer *l, uint64_t seed)
{
    cell_state *st = calloc(1, sizeof *st);
    if (!st) return gp_error_set(GP_ERR_OOM, "out of host memory for an amoeba cell");
    l->state = st;
    const gp_shape *pop = l->n_in > 1 ? &l->pop_shape[0] : NULL;
    GP_TRY(make_plan(l, &l->in_shape, pop, &st->plan));
    gp_shape states[MAX_STATES];
    init_arg a = {l, st, seed};
    GP_TRY(walk(l, &st->plan, &l->in_shape, pop, states, init_child, &a));
    /* the norms' step counters, named as in the state dict */
    for (int c = 0; c < st->plan.n_child; c++) {
        const char *cn[4];
        int64_t *cv[4];
        int nc = gp_layer_counters(&st->child[c], cn, cv, 4);
        GP_ASSERT(nc <= 4 && st->n_counters + nc <= MAX_COUNTERS);
        for (int q = 0; q < nc; q++) {
            snprintf(st->counter_name[st->n_counters], sizeof st->counter_name[0], "%s.%s",
                     st->plan.prefix[c], cn[q]);
            st->counter[st->n_counters++] = cv[q];
        }
    }
    return GP_OK;
}

static void cell_destroy(gp_layer *l)
{
    cell_state *st = l->state;
    if (!st) return;
    for (int c = 0; c < MAX_CHILD; c++) gp_layer_destroy(&st->child[c]); /* views only */
    free(st);
    l->state = NULL;
}

/* Every child's parameter views, and its output type: the cell's tensors'
 * own (dt: bf16 where the cell runs on bf16 storage, cell_takes_bf16; the
 * children's wrappers then run each on bf16 or through the adapter). */
static void sync_all(gp_layer *l, cell_state *st, gp_dtype dt)
{
    for (int c = 0; c < st->plan.n_child; c++) {
        gp_layers_child_view(l, &st->child[c], st->first[c]);
        st->child[c].out_dtype = dt;
    }
}

/* sum = a + b, of the cell's element type (bf16: rounded once). */
static gp_status add_states(gp_device *dev, const gp_tensor *a, const gp_tensor *b,
                            gp_tensor *sum)
{
    int64_t n = gp_tensor_numel(sum);
    if (n == 0) return GP_OK;
    if (sum->dtype == GP_F32) return gp_dev_add(dev, gp_f32(a), gp_f32(b), gp_f32(sum), n);
    GP_TRY(gp_layers_copy(dev, gp_tensor_mem(sum), a));
    return gp_layers_accumulate(dev, sum, b);
}

/* ---- the saved tensors ------------------------------------------------------------- */

/* Tensor i: child i's output (i < n_child), or state k's sum (n_child + k). */
static gp_tensor *tensor_at(gp_saved *s, const cell_state *st, int i)
{
    int n = st->plan.n_child;
    GP_ASSERT(i >= 0 && i < n + MAX_STATES && s->n_sub > n + i / GP_SAVED_MAX);
    return &s->sub[n + i / GP_SAVED_MAX].t[i % GP_SAVED_MAX];
}

static gp_status saved_setup(gp_saved *s, const cell_state *st)
{
    int n = st->plan.n_child;
    int blocks = (n + MAX_STATES + GP_SAVED_MAX - 1) / GP_SAVED_MAX;
    GP_ASSERT(s->sub == NULL);
    s->sub = calloc((size_t)(n + blocks), sizeof *s->sub);
    if (!s->sub) return gp_error_set(GP_ERR_OOM, "out of host memory for an amoeba cell");
    s->n_sub = n + blocks;
    return GP_OK;
}

/* The plan's unkept tensors freed, their shapes kept (a training forward,
 * done: the checkpoint's rule for a stage's unkept outputs). */
static void drop_unkept(gp_saved *s, const cell_state *st)
{
    for (int i = 0; i < st->plan.n_child + MAX_STATES; i++)
        if (st->plan.unkept[i]) gp_tensor_drop(tensor_at(s, st, i));
}

/* The input chain ci reads, and its output (its last child's, or its
 * input for an identity chain). */
static const gp_tensor *chain_in(const cell_state *st, int ci, const gp_tensor *x, int n_in,
                                 const gp_tensor **states)
{
    int f = st->plan.ch[ci].from;
    return f == FROM_X ? &x[0] : f == FROM_P ? &x[n_in > 1 ? 1 : 0] : states[f];
}

static const gp_tensor *chain_out(gp_saved *s, const cell_state *st, int ci, const gp_tensor *in)
{
    const chain *ch = &st->plan.ch[ci];
    return ch->nc ? tensor_at(s, st, ch->c0 + ch->nc - 1) : in;
}

/* The states' tensors after a forward. */
static void states_of(gp_saved *s, const cell_state *st, const gp_tensor *x, int n_in,
                      const gp_tensor **states)
{
    for (int k = 0; k < 2; k++) states[k] = chain_out(s, st, k, chain_in(st, k, x, n_in, states));
    for (int k = 2; k < MAX_STATES; k++) states[k] = tensor_at(s, st, st->plan.n_child + k);
}

/* ---- forward ----------------------------------------------------------------------- */

static gp_status run_chain(gp_layer *l, cell_state *st, const gp_fwd_ctx *ctx, int ci,
                           const gp_tensor *in, gp_saved *s)
{
    (void)l;
    const chain *ch = &st->plan.ch[ci];
    const gp_tensor *cur = in;
    for (int c = ch->c0; c < ch->c0 + ch->nc; c++) {
        gp_tensor *y = tensor_at(s, st, c);
        GP_TRY(gp_layer_forward(&st->child[c], ctx, cur, y, &s->sub[c]));
        cur = y;
    }
    return GP_OK;
}

static gp_status cell_forward(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                              gp_tensor *y, gp_saved *s)
{
    cell_state *st = l->state;
    const cell_plan *p = &st->plan;
    gp_device *dev = l->dev;
    const gp_dtype dt = x[0].dtype; /* y's, and the popped input's (cell_takes_bf16) */
    sync_all(l, st, dt);
    GP_TRY(saved_setup(s, st));
    const gp_tensor *states[MAX_STATES] = {NULL};
    gp_status r = GP_OK;
    for (int ci = 0; ci < 2 && r == GP_OK; ci++) {
        const gp_tensor *in = chain_in(st, ci, x, l->n_in, states);
        r = run_chain(l, st, ctx, ci, in, s);
        states[ci] = chain_out(s, st, ci, in);
    }
    for (int t = 0; t < N_NODES && r == GP_OK; t++) {
        const gp_tensor *h[2];
        for (int q = 0; q < 2 && r == GP_OK; q++) {
            int ci = 2 + 2 * t + q;
            const gp_tensor *in = chain_in(st, ci, x, l->n_in, states);
            r = run_chain(l, st, ctx, ci, in, s);
            h[q] = chain_out(s, st, ci, in);
        }
        if (r != GP_OK) break;
        gp_tensor *sum = tensor_at(s, st, p->n_child + 2 + t);
        gp_shape hs = gp_tensor_shape(h[0]);
        r = gp_tensor_alloc_as(sum, dev, &hs, dt, GP_MEM_ACTIVATIONS);
        if (r == GP_OK) r = add_states(dev, h[0], h[1], sum);
        states[2 + t] = sum;
    }
    int64_t off = 0;
    for (int q = 0; q < p->n_concat && r == GP_OK; q++) {
        const gp_tensor *a = states[p->concat[q]];
        r = gp_layers_copy_channels(dev, y, off, a, 0, a->dims[1]);
        off += a->dims[1];
    }
    if (r == GP_OK && ctx->training) drop_unkept(s, st);
    if (r != GP_OK || !ctx->training) {
        gp_saved_free(s); /* a failure, or eval: no backward will come */
        if (r == GP_OK) s->flags |= GP_SAVED_EVAL;
    }
    return r;
}

/* ---- backward ---------------------------------------------------------------------- */

/* *acc += *g, taking g over if acc is empty; g is freed either way. */
static gp_status accumulate(gp_device *dev, gp_tensor *acc, gp_tensor *g)
{
    if (!gp_tensor_mem(acc) && !acc->ndim) {
        *acc = *g;
        *g = (gp_tensor){0};
        return GP_OK;
    }
    gp_status r = gp_tensor_numel(g) ? gp_layers_accumulate(dev, acc, g) : GP_OK;
    gp_tensor_free(g);
    return r;
}

/* Backward through chain ci from dy (its output's gradient); *g = the
 * gradient of its input (owned), unless need_dx is false for its first
 * child (the weights still get theirs). */
static gp_status back_chain(gp_layer *l, cell_state *st, const gp_fwd_ctx *ctx, int ci,
                            const gp_tensor *in, const gp_tensor *dy, bool need_dx, gp_saved *s,
                            gp_tensor *g)
{
    const chain *ch = &st->plan.ch[ci];
    *g = (gp_tensor){0};
    if (ch->nc == 0) { /* identity: the gradient passes as it is */
        if (!need_dx) return GP_OK;
        gp_shape ds = gp_tensor_shape(dy);
        GP_TRY(gp_tensor_alloc_as(g, l->dev, &ds, dy->dtype, GP_MEM_ACTIVATIONS));
        return gp_layers_copy(l->dev, gp_tensor_mem(g), dy);
    }
    gp_tensor cur = *dy;
    cur.owned = false; /* lent */
    gp_status r = GP_OK;
    for (int c = ch->c0 + ch->nc - 1; c >= ch->c0 && r == GP_OK; c--) {
        const gp_tensor *xc = c == ch->c0 ? in : tensor_at(s, st, c - 1);
        gp_tensor dx = {0};
        bool want = c > ch->c0 || need_dx;
        r = gp_layer_backward(&st->child[c], ctx, xc, tensor_at(s, st, c), &cur,
                              want ? &dx : NULL, &s->sub[c]);
        gp_tensor_free(&cur); /* frees only what this loop made */
        cur = dx;
    }
    if (r != GP_OK) {
        gp_tensor_free(&cur);
        return r;
    }
    *g = cur;
    return GP_OK;
}

/* The whole backward; dx == NULL skips the work only dx needs. */
static gp_status cell_backward_all(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                   const gp_tensor *dy, gp_tensor *dx, gp_saved *s)
{
    cell_state *st = l->state;
    const cell_plan *p = &st->plan;
    gp_device *dev = l->dev;
    if (s->flags & GP_SAVED_EVAL)
        return gp_layer_spec_error(l, "backward after an eval-mode forward: the layer saved "
                                      "nothing (run forward with training)");
    GP_ASSERT(s->n_sub > 0);
    const gp_dtype dt = x[0].dtype;
    sync_all(l, st, dt);
    const gp_tensor *states[MAX_STATES] = {NULL};
    states_of(s, st, x, l->n_in, states);
    gp_tensor ds[MAX_STATES];
    memset(ds, 0, sizeof ds);
    gp_status r = GP_OK;
    /* the concatenation: each state's slice of dy */
    int64_t off = 0;
    for (int q = 0; q < p->n_concat && r == GP_OK; q++) {
        int k = p->concat[q];
        gp_shape ks = gp_tensor_shape(states[k]);
        gp_tensor g = {0};
        r = gp_tensor_alloc_as(&g, dev, &ks, dt, GP_MEM_ACTIVATIONS);
        if (r == GP_OK) r = gp_layers_copy_channels(dev, &g, 0, dy, off, ks.dims[1]);
        if (r == GP_OK) r = accumulate(dev, &ds[k], &g);
        gp_tensor_free(&g);
        off += ks.dims[1];
    }
    /* the nodes, last first; each sum's gradient to both of its operations */
    for (int t = N_NODES - 1; t >= 0 && r == GP_OK; t--) {
        gp_tensor *dsum = &ds[2 + t];
        if (!gp_tensor_mem(dsum) && !dsum->ndim) continue; /* unused state: no gradient */
        for (int q = 0; q < 2 && r == GP_OK; q++) {
            int ci = 2 + 2 * t + q;
            gp_tensor g;
            r = back_chain(l, st, ctx, ci, chain_in(st, ci, x, l->n_in, states), dsum, true,
                           s, &g);
            if (r == GP_OK) r = accumulate(dev, &ds[p->ch[ci].from], &g);
            gp_tensor_free(&g);
        }
        gp_tensor_free(dsum);
    }
    /* reduce1 and reduce2, into dx[0] and dx[1] (both into dx[0] with no pop) */
    gp_tensor g[2];
    memset(g, 0, sizeof g);
    for (int ci = 0; ci < 2 && r == GP_OK; ci++) {
        if (!gp_tensor_mem(&ds[ci]) && !ds[ci].ndim) continue;
        r = back_chain(l, st, ctx, ci, chain_in(st, ci, x, l->n_in, states), &ds[ci],
                       dx != NULL, s, &g[ci]);
    }
    if (r == GP_OK && dx) {
        for (int q = 0; q < l->n_in && r == GP_OK; q++) { /* zero bits: 0.0 in either type */
            int64_t e = gp_tensor_words(&dx[q]);
            if (e) r = gp_dev_fill(dev, (float *)gp_tensor_mem(&dx[q]), 0.0f, e);
        }
        for (int ci = 0; ci < 2 && r == GP_OK; ci++) {
            gp_tensor *d = &dx[ci == 1 && l->n_in > 1 ? 1 : 0];
            if (gp_tensor_mem(&g[ci]) && gp_tensor_numel(d)) r = gp_layers_accumulate(dev, d, &g[ci]);
        }
    }
    for (int k = 0; k < MAX_STATES; k++) gp_tensor_free(&ds[k]);
    gp_tensor_free(&g[0]);
    gp_tensor_free(&g[1]);
    return r;
}

static gp_status cell_backward_data(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                    const gp_tensor *y, const gp_tensor *dy, gp_tensor *dx,
                                    gp_saved *s)
{
    (void)y;
    GP_TRY(cell_backward_all(l, ctx, x, dy, dx, s));
    s->flags |= GP_SAVED_WEIGHTS_DONE;
    return GP_OK;
}

static gp_status cell_backward_weights(gp_layer *l, const gp_fwd_ctx *ctx, const gp_tensor *x,
                                       const gp_tensor *y, const gp_tensor *dy, gp_saved *s)
{
    (void)y;
    if (gp_saved_take_weights_done(s)) return GP_OK;
    return cell_backward_all(l, ctx, x, dy, NULL, s);
}

/* ---- statistics and costs ---------------------------------------------------------- */

static gp_status cell_commit(gp_layer *l)
{
    cell_state *st = l->state;
    sync_all(l, st, l->out_dtype);
    for (int c = 0; c < st->plan.n_child; c++)
        if (st->child[c].ops->commit) GP_TRY(st->child[c].ops->commit(&st->child[c]));
    return GP_OK;
}

static void cell_discard(gp_layer *l)
{
    cell_state *st = l->state;
    gp_layers_discard(st->child, st->plan.n_child);
}

static gp_status cell_allreduce_stats(gp_layer *l, gp_comm *comm)
{
    cell_state *st = l->state;
    sync_all(l, st, l->out_dtype);
    for (int c = 0; c < st->plan.n_child; c++)
        if (st->child[c].ops->allreduce_stats)
            GP_TRY(st->child[c].ops->allreduce_stats(&st->child[c], comm));
    return GP_OK;
}

static int cell_counters(gp_layer *l, const char **names, int64_t **values, int max)
{
    cell_state *st = l->state;
    for (int q = 0; q < st->n_counters && q < max; q++) {
        names[q] = st->counter_name[q];
        values[q] = st->counter[q];
    }
    return st->n_counters;
}

/* The costs walk the plan from the shapes alone (no device needed). */
typedef struct {
    int64_t n;
    double flops;
    size_t bytes;
    gp_dtype dt;     /* the cell's out_dtype: its maps' */
    gp_device *dev;  /* the cell's (NULL: none), for what children keep per device (a max
                        pool's indices) */
    const bool *unkept; /* the plan's: outputs a forward does not keep */
} cost_arg;

static gp_status cost_child(void *arg, int c, const gp_layer_spec *spec, const gp_shape *in)
{
    (void)c;
    cost_arg *a = arg;
    gp_layer t;
    GP_TRY(gp_layer_shapes(spec, 0, in, &t));
    t.out_dtype = a->dt;
    t.dev = a->dev;
    a->flops += t.ops->flops(&t, a->n);
    size_t out = a->unkept[c] ? 0 : (size_t)a->n * (size_t)gp_shape_numel(&t.out_shape) *
                                        gp_dtype_size(a->dt);
    a->bytes += out + (t.ops->saved_bytes ? t.ops->saved_bytes(&t, a->n) : 0);
    return GP_OK;
}

static cost_arg costs(const gp_layer *l, int64_t n)
{
    cost_arg a = {n, 0.0, 0, l->out_dtype, l->dev, NULL};
    cell_plan *p = malloc(sizeof *p);
    const gp_shape *pop = l->n_in > 1 ? &l->pop_shape[0] : NULL;
    gp_shape st[MAX_STATES];
    if (p && make_plan(l, &l->in_shape, pop, p) == GP_OK) {
        a.unkept = p->unkept;
        if (walk(l, p, &l->in_shape, pop, st, cost_child, &a) == GP_OK) {
            for (int k = 2; k < MAX_STATES; k++) { /* the sums, those kept */
                double e = (double)n * (double)gp_shape_numel(&st[k]);
                a.flops += e;
                if (!p->unkept[p->n_child + k])
                    a.bytes += (size_t)e * gp_dtype_size(l->out_dtype);
            }
        }
    }
    gp_error_clear();
    free(p);
    return a;
}

static double cell_flops(const gp_layer *l, int64_t n) { return costs(l, n).flops; }

static size_t cell_saved_bytes(const gp_layer *l, int64_t n) { return n ? costs(l, n).bytes : 0; }

/* On bf16 storage the cell keeps its inner maps (its children's outputs,
 * the states' sums) and the gradients between them in bf16: each child's
 * wrapper runs it on bf16 or through the storage adapter around it alone,
 * the sums round once, the concatenation moves bits. */
static bool cell_takes_bf16(const gp_layer *l) { return l->dev && l->dev->iface->copy_box; }

const gp_layer_ops gp_amoeba_cell_ops = {
    .type = GP_LAYER_AMOEBA_CELL,
    .takes_bf16 = cell_takes_bf16,
    .infer = cell_infer,
    .init = cell_init,
    .forward = cell_forward,
    .backward_data = cell_backward_data,
    .backward_weights = cell_backward_weights,
    .commit = cell_commit,
    .discard = cell_discard,
    .allreduce_stats = cell_allreduce_stats,
    .flops = cell_flops,
    .saved_bytes = cell_saved_bytes,
    .destroy = cell_destroy,
    .counters = cell_counters,
    .pops = 1,
    .pops_optional = true,
};
