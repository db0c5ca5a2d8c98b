/*
 * trace.c — Chrome trace event JSON (see trace.h for the layout), written
 * with core/json.h's writer: one event a line, flushed after each step, so
 * a run killed between steps leaves a file that only lacks its closing
 * "]}" (scripts/timeline.py adds them).
 * Timestamps are microseconds since the trace was opened.
 */
#include "trace/trace.h"
#include "core/json.h"
#include "pipeline/procs.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct gp_trace {
    FILE *f;
    gp_json_writer w;     /* inside {"traceEvents": [ until gp_trace_close */
    char path[512];
    int64_t first, last;
    double t_origin;
    bool named[GP_MAX_DEVICES];
    uint64_t next_flow;
};

/* Open an event object with the fields every event has; the caller adds
 * the rest and closes it. */
static void event(gp_trace *t, const char *name, const char *cat, const char *ph, int pid)
{
    gp_json_open_object(&t->w, NULL);
    gp_json_put_str(&t->w, "name", name);
    if (cat) gp_json_put_str(&t->w, "cat", cat);
    gp_json_put_str(&t->w, "ph", ph);
    gp_json_put_int(&t->w, "pid", pid);
}

/* The events so far to the file; a failure says why (a full disk, a
 * file-size limit). */
static gp_status flush(gp_trace *t)
{
    errno = 0;
    if (!gp_json_flush(&t->w, t->f) || fflush(t->f) != 0)
        return gp_error_set(GP_ERR_IO, "writing trace file '%s' failed: %s", t->path,
                            t->w.oom ? "out of host memory"
                            : errno ? strerror(errno) : "a write error");
    return GP_OK;
}

gp_status gp_trace_open(const char *path, int64_t first, int64_t last, gp_trace **out)
{
    *out = NULL;
    gp_trace *t = calloc(1, sizeof *t);
    if (!t) return gp_error_set(GP_ERR_OOM, "out of host memory");
    t->f = fopen(path, "w");
    if (!t->f) {
        free(t);
        return gp_error_set(GP_ERR_IO, "cannot write trace file '%s'; check the directory "
                                       "exists and is writable", path);
    }
    snprintf(t->path, sizeof t->path, "%s", path);
    t->first = first;
    t->last = last;
    t->t_origin = gp_now();
    t->next_flow = 1;
    t->w.pretty = 2; /* the top level, and each event on a line of its own */
    gp_json_open_object(&t->w, NULL);
    gp_json_put_str(&t->w, "displayTimeUnit", "ms");
    gp_json_open_object(&t->w, "otherData");
    gp_json_put_str(&t->w, "producer", "gpipe");
    /* where ts = 0 is (gp_now(), CLOCK_MONOTONIC seconds), and under mpirun
     * this process's rank and its clock's offset from rank 0's: what
     * `scripts/timeline.py merge` needs to put the ranks' traces on one
     * axis */
    gp_json_put_fixed(&t->w, "origin_s", t->t_origin, 9);
    if (gp_procs_size() > 1) {
        gp_json_put_int(&t->w, "rank", gp_procs_rank());
        gp_json_put_int(&t->w, "ranks", gp_procs_size());
        gp_json_put_fixed(&t->w, "clock_offset_s", gp_procs_clock_offset(), 9);
    }
    gp_json_close(&t->w);
    gp_json_open_array(&t->w, "traceEvents");
    gp_status s = flush(t);
    if (s != GP_OK) {
        fclose(t->f);
        gp_json_writer_free(&t->w);
        free(t);
        return s;
    }
    *out = t;
    return GP_OK;
}

bool gp_trace_wants(const gp_trace *t, int64_t step)
{
    return t && step >= t->first && (t->last < 0 || step <= t->last);
}

static double us(const gp_trace *t, double s) { return (s - t->t_origin) * 1e6; }

static const char *category(const gp_event_rec *e)
{
    if (e->is_wait) return "wait";
    switch (e->kind) {
    case GP_INSTR_FORWARD: return "forward";
    case GP_INSTR_RECOMPUTE: return "recompute";
    case GP_INSTR_BACKWARD:
    case GP_INSTR_BACKWARD_DATA: return "backward";
    case GP_INSTR_BACKWARD_WEIGHTS: return "weights";
    case GP_INSTR_RECV_ACT:
    case GP_INSTR_RECV_GRAD:
    case GP_INSTR_RECV_SKIP:
    case GP_INSTR_RECV_SKIP_GRAD: return "copy";
    default: return gp_instr_kind_name(e->kind); /* the end of the step */
    }
}

gp_status gp_trace_add_step(gp_trace *t, const gp_pipeline *p, gp_device *const *devs,
                            int64_t step, int replica, int replicas)
{
    gp_json_writer *w = &t->w;
    int n = gp_pipeline_devices(p), S = gp_pipeline_stages(p);
    /* replica r's devices are processes r n .. r n + n - 1 of the trace */
    int base = replica * n;
    if (base + n > GP_MAX_DEVICES)
        return gp_error_set(GP_ERR_INVALID, "trace: replica %d of %d devices is past the %d "
                            "devices a trace holds", replica, n, GP_MAX_DEVICES);
    double t_start = 1e300;
    for (int j = 0; j < n; j++) {
        int cnt;
        const gp_event_rec *ev = gp_pipeline_events(p, j, &cnt);
        if (cnt && ev[0].t0 < t_start) t_start = ev[0].t0;
        if (!t->named[base + j] && cnt) { /* (under mpirun, only this process's device has events) */
            t->named[base + j] = true;
            char name[128], rep[32] = "";
            if (replicas > 1) snprintf(rep, sizeof rep, "replica %d, ", replica);
            int off = snprintf(name, sizeof name, "%s (%sstage%s %d", devs[j]->name, rep,
                               S > n ? "s" : "", j);
            for (int q = j + 1; q < S && off < (int)sizeof name - 8; q++)
                if (gp_pipeline_device_of(p, q) == j)
                    off += snprintf(name + off, sizeof name - (size_t)off, ", %d", q);
            snprintf(name + off, sizeof name - (size_t)off, ")");
            event(t, "process_name", NULL, "M", base + j);
            gp_json_open_object(w, "args");
            gp_json_put_str(w, "name", name);
            gp_json_close(w);
            gp_json_close(w);
            event(t, "process_sort_index", NULL, "M", base + j);
            gp_json_open_object(w, "args");
            gp_json_put_int(w, "sort_index", base + j);
            gp_json_close(w);
            gp_json_close(w);
            for (int tid = 0; tid < 2; tid++) {
                event(t, "thread_name", NULL, "M", base + j);
                gp_json_put_int(w, "tid", tid);
                gp_json_open_object(w, "args");
                gp_json_put_str(w, "name", tid ? "copy" : "compute");
                gp_json_close(w);
                gp_json_close(w);
            }
        }
    }
    if (t_start < 1e300 && replica == 0) { /* (one marker per step) */
        char name[32];
        snprintf(name, sizeof name, "step %lld", (long long)step);
        event(t, name, NULL, "i", 0);
        gp_json_put_str(w, "s", "g");
        gp_json_put_fixed(w, "ts", us(t, t_start), 3);
        gp_json_put_int(w, "tid", 0);
        gp_json_open_object(w, "args");
        gp_json_put_int(w, "step", step);
        gp_json_close(w);
        gp_json_close(w);
    }
    for (int j = 0; j < n; j++) {
        int cnt;
        const gp_event_rec *ev = gp_pipeline_events(p, j, &cnt);
        for (int e = 0; e < cnt; e++) {
            const gp_event_rec *r = &ev[e];
            bool copy = gp_instr_copies(r->kind);
            char name[64], layers[48];
            gp_event_name(r, name, sizeof name);
            snprintf(layers, sizeof layers, "%d-%d", r->layer_first,
                     r->layer_first + r->layer_count - 1);
            event(t, name, category(r), "X", base + j);
            gp_json_put_int(w, "tid", copy ? 1 : 0);
            gp_json_put_fixed(w, "ts", us(t, r->t0), 3);
            gp_json_put_fixed(w, "dur", (r->t1 - r->t0) * 1e6, 3);
            gp_json_open_object(w, "args");
            gp_json_put_int(w, "step", step);
            gp_json_put_int(w, "stage", r->j);
            gp_json_put_int(w, "micro_batch", r->i);
            gp_json_put_int(w, "clock", r->k);
            gp_json_put_str(w, "layers", layers);
            gp_json_put_uint(w, "bytes", r->bytes);
            if (r->whole) gp_json_put_bool(w, "whole_backward", true);
            if (r->device_time) { /* ts is the device's; when the host issued it */
                gp_json_put_fixed(w, "issued_us", us(t, r->h0), 3);
                gp_json_put_str(w, "time", "device");
            }
            gp_json_close(w);
            gp_json_close(w);
            if (copy && !r->is_wait) {
                const gp_event_rec *src = gp_pipeline_producer(p, r);
                if (src) {
                    /* an arrow from the producing slice to this copy */
                    uint64_t id = t->next_flow++;
                    event(t, "data", "flow", "s", base + gp_pipeline_device_of(p, r->from));
                    gp_json_put_int(w, "tid", 0);
                    gp_json_put_uint(w, "id", id);
                    gp_json_put_fixed(w, "ts", us(t, src->t1) - 0.001, 3);
                    gp_json_close(w);
                    event(t, "data", "flow", "f", base + j);
                    gp_json_put_int(w, "tid", 1);
                    gp_json_put_str(w, "bp", "e");
                    gp_json_put_uint(w, "id", id);
                    gp_json_put_fixed(w, "ts", us(t, r->t0) + 0.001, 3);
                    gp_json_close(w);
                }
            }
            event(t, "allocated bytes", NULL, "C", base + j);
            gp_json_put_fixed(w, "ts", us(t, r->t1), 3);
            gp_json_open_object(w, "args");
            gp_json_put_uint(w, "bytes", r->mem_after);
            gp_json_close(w);
            gp_json_close(w);
        }
    }
    return flush(t);
}

gp_status gp_trace_close(gp_trace *t)
{
    if (!t) return GP_OK;
    gp_json_close(&t->w); /* traceEvents */
    gp_json_close(&t->w);
    gp_json_put_raw(&t->w, "\n");
    gp_status s = flush(t);
    if (fclose(t->f) != 0 && s == GP_OK)
        s = gp_error_set(GP_ERR_IO, "writing trace file '%s' failed", t->path);
    gp_json_writer_free(&t->w);
    free(t);
    return s;
}

bool gp_trace_parse_range(const char *s, int64_t *first, int64_t *last)
{
    char *end;
    const char *colon = strchr(s, ':');
    *first = 0;
    *last = -1;
    if (!colon) {
        long long v = strtoll(s, &end, 10);
        if (end == s || *end || v < 0) return false;
        *first = *last = v;
        return true;
    }
    if (colon != s) {
        long long v = strtoll(s, &end, 10);
        if (end != colon || v < 0) return false;
        *first = v;
    }
    if (colon[1]) {
        long long v = strtoll(colon + 1, &end, 10);
        if (*end || v < 0) return false;
        *last = v;
    }
    return *last < 0 || *last >= *first;
}
