/*
 * trace.c — Chrome trace event JSON (see trace.h for the layout).
 * Timestamps are microseconds since the trace was opened.
 */
#include "trace/trace.h"

#include <stdlib.h>
#include <string.h>

struct gp_trace {
    FILE *f;
    char path[512];
    int64_t first, last;
    double t_origin;
    bool any;             /* an event was written (comma handling) */
    bool named[GP_MAX_DEVICES];
    uint64_t next_flow;
};

static void sep(gp_trace *t)
{
    fputs(t->any ? ",\n" : "\n", t->f);
    t->any = true;
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
    fputs("{\"displayTimeUnit\":\"ms\",\"otherData\":{\"producer\":\"gpipe\"},\"traceEvents\":[", t->f);
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
    case GP_INSTR_BACKWARD: return "backward";
    case GP_INSTR_RECV_ACT:
    case GP_INSTR_RECV_GRAD: return "copy";
    default: return gp_instr_kind_name(e->kind); /* the end of the step */
    }
}

/* The slice on device `j` that produced what a copy consumed. */
static const gp_event_rec *producer(const gp_pipeline *p, const gp_event_rec *c)
{
    int j = c->from;
    gp_instr_kind want = c->kind == GP_INSTR_RECV_ACT ? GP_INSTR_FORWARD : GP_INSTR_BACKWARD;
    int cnt;
    const gp_event_rec *ev = gp_pipeline_events(p, j, &cnt);
    for (int e = 0; e < cnt; e++)
        if (ev[e].kind == want && ev[e].i == c->i && !ev[e].is_wait) return &ev[e];
    return NULL;
}

gp_status gp_trace_add_step(gp_trace *t, const gp_pipeline *p, gp_device *const *devs,
                            int64_t step)
{
    int n = gp_pipeline_stages(p);
    double t_start = 1e300;
    for (int j = 0; j < n; j++) {
        int cnt;
        const gp_event_rec *ev = gp_pipeline_events(p, j, &cnt);
        if (cnt && ev[0].t0 < t_start) t_start = ev[0].t0;
        if (!t->named[j]) {
            t->named[j] = true;
            sep(t);
            fprintf(t->f, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":"
                          "{\"name\":\"%s (stage %d)\"}}", j, devs[j]->name, j);
            sep(t);
            fprintf(t->f, "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,\"args\":"
                          "{\"sort_index\":%d}}", j, j);
            sep(t);
            fprintf(t->f, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
                          "\"args\":{\"name\":\"compute\"}}", j);
            sep(t);
            fprintf(t->f, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":1,"
                          "\"args\":{\"name\":\"copy\"}}", j);
        }
    }
    if (t_start < 1e300) {
        sep(t);
        fprintf(t->f, "{\"name\":\"step %lld\",\"ph\":\"i\",\"s\":\"g\",\"ts\":%.3f,\"pid\":0,"
                      "\"tid\":0,\"args\":{\"step\":%lld}}",
                (long long)step, us(t, t_start), (long long)step);
    }
    for (int j = 0; j < n; j++) {
        int cnt;
        const gp_event_rec *ev = gp_pipeline_events(p, j, &cnt);
        for (int e = 0; e < cnt; e++) {
            const gp_event_rec *r = &ev[e];
            bool copy = r->kind == GP_INSTR_RECV_ACT || r->kind == GP_INSTR_RECV_GRAD;
            char name[64];
            gp_event_name(r, name, sizeof name);
            sep(t);
            fprintf(t->f, "{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"ts\":%.3f,"
                          "\"dur\":%.3f,\"pid\":%d,\"tid\":%d,\"args\":{\"step\":%lld,"
                          "\"stage\":%d,\"micro_batch\":%d,\"clock\":%d,\"layers\":\"%d-%d\","
                          "\"bytes\":%zu}}",
                    name, category(r), us(t, r->t0), (r->t1 - r->t0) * 1e6, j, copy ? 1 : 0,
                    (long long)step, j, r->i, r->k, r->layer_first,
                    r->layer_first + r->layer_count - 1, r->bytes);
            if (copy && !r->is_wait) {
                const gp_event_rec *src = producer(p, r);
                if (src) {
                    uint64_t id = t->next_flow++;
                    int sj = r->from;
                    sep(t);
                    fprintf(t->f, "{\"name\":\"data\",\"cat\":\"flow\",\"ph\":\"s\",\"id\":%llu,"
                                  "\"ts\":%.3f,\"pid\":%d,\"tid\":0}",
                            (unsigned long long)id, us(t, src->t1) - 0.001, sj);
                    sep(t);
                    fprintf(t->f, "{\"name\":\"data\",\"cat\":\"flow\",\"ph\":\"f\",\"bp\":\"e\","
                                  "\"id\":%llu,\"ts\":%.3f,\"pid\":%d,\"tid\":1}",
                            (unsigned long long)id, us(t, r->t0) + 0.001, j);
                }
            }
            sep(t);
            fprintf(t->f, "{\"name\":\"allocated bytes\",\"ph\":\"C\",\"ts\":%.3f,\"pid\":%d,"
                          "\"args\":{\"bytes\":%zu}}", us(t, r->t1), j, r->mem_after);
        }
    }
    return ferror(t->f) ? gp_error_set(GP_ERR_IO, "writing trace file '%s' failed", t->path)
                        : GP_OK;
}

gp_status gp_trace_close(gp_trace *t)
{
    if (!t) return GP_OK;
    fputs("\n]}\n", t->f);
    bool bad = ferror(t->f) != 0;
    if (fclose(t->f) != 0) bad = true;
    gp_status s = bad ? gp_error_set(GP_ERR_IO, "writing trace file '%s' failed", t->path) : GP_OK;
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
