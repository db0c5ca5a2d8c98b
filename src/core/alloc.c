/*
 * alloc.c — per-device memory accounting and byte-size parsing.
 *
 * The allocator does not hand out memory (the backend does); it keeps the
 * books: current and peak bytes, in total and per category, against an
 * optional capacity.  Every backend allocation passes through
 * gp_allocator_reserve first, so the numbers are the truth.
 */
#include "core/core.h"

#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *cat_names[GP_MEM_COUNT] = {
    "parameters", "gradients", "optimizer", "activations", "copies", "workspace"};

const char *gp_mem_category_name(gp_mem_category c)
{
    return (c >= 0 && c < GP_MEM_COUNT) ? cat_names[c] : "?";
}

void gp_allocator_init(gp_allocator *a, const char *device, size_t capacity)
{
    memset(a, 0, sizeof *a);
    snprintf(a->device, sizeof a->device, "%s", device);
    a->capacity = capacity;
    pthread_mutex_init(&a->lock, NULL);
}

void gp_allocator_destroy(gp_allocator *a) { pthread_mutex_destroy(&a->lock); }

gp_status gp_allocator_reserve(gp_allocator *a, size_t bytes, gp_mem_category cat)
{
    GP_ASSERT(cat >= 0 && cat < GP_MEM_COUNT);
    pthread_mutex_lock(&a->lock);
    if (a->capacity && bytes > a->capacity - (a->current < a->capacity ? a->current : a->capacity)) {
        char b1[32], b2[32], b3[32], by[GP_MEM_COUNT * 48] = "";
        size_t cur = a->current, cap = a->capacity, n = 0;
        /* what holds the memory, by category, so the user knows which knob */
        for (int c = 0; c < GP_MEM_COUNT; c++) {
            char b[32];
            if (!a->cur_by[c] || n >= sizeof by) continue;
            n += (size_t)snprintf(by + n, sizeof by - n, "%s%s %s", n ? ", " : "",
                                  gp_format_bytes(a->cur_by[c], b, sizeof b), cat_names[c]);
        }
        pthread_mutex_unlock(&a->lock);
        return gp_error_set(GP_ERR_OOM,
                            "out of memory on device %s: requested %s for %s with %s in use "
                            "(%s) of a capacity of %s; use more devices (pipeline.devices), "
                            "fewer or smaller micro-batches, checkpointing, or a larger "
                            "capacity (pipeline.memory)",
                            a->device, gp_format_bytes(bytes, b1, sizeof b1),
                            gp_mem_category_name(cat), gp_format_bytes(cur, b2, sizeof b2),
                            n ? by : "nothing", gp_format_bytes(cap, b3, sizeof b3));
    }
    a->current += bytes;
    a->cur_by[cat] += bytes;
    a->live_blocks++;
    pthread_mutex_unlock(&a->lock);
    return GP_OK;
}

void gp_allocator_commit(gp_allocator *a, gp_mem_category cat)
{
    GP_ASSERT(cat >= 0 && cat < GP_MEM_COUNT);
    pthread_mutex_lock(&a->lock);
    if (a->current > a->peak) a->peak = a->current;
    if (a->cur_by[cat] > a->peak_by[cat]) a->peak_by[cat] = a->cur_by[cat];
    pthread_mutex_unlock(&a->lock);
}

void gp_allocator_release(gp_allocator *a, size_t bytes, gp_mem_category cat)
{
    pthread_mutex_lock(&a->lock);
    GP_ASSERT(a->current >= bytes && a->cur_by[cat] >= bytes);
    a->current -= bytes;
    a->cur_by[cat] -= bytes;
    a->live_blocks--;
    pthread_mutex_unlock(&a->lock);
}

size_t gp_allocator_current(gp_allocator *a)
{
    pthread_mutex_lock(&a->lock);
    size_t c = a->current;
    pthread_mutex_unlock(&a->lock);
    return c;
}

void gp_allocator_reset_peak(gp_allocator *a)
{
    pthread_mutex_lock(&a->lock);
    a->peak = a->current;
    for (int i = 0; i < GP_MEM_COUNT; i++) a->peak_by[i] = a->cur_by[i];
    pthread_mutex_unlock(&a->lock);
}

void gp_allocator_snapshot(gp_allocator *a, gp_allocator *out)
{
    pthread_mutex_lock(&a->lock);
    memcpy(out->device, a->device, sizeof out->device);
    out->capacity = a->capacity;
    out->current = a->current;
    out->peak = a->peak;
    memcpy(out->cur_by, a->cur_by, sizeof out->cur_by);
    memcpy(out->peak_by, a->peak_by, sizeof out->peak_by);
    out->live_blocks = a->live_blocks;
    pthread_mutex_unlock(&a->lock);
}

bool gp_parse_bytes(const char *s, size_t *out)
{
    if (!s) return false;
    while (isspace((unsigned char)*s)) s++;
    char *end;
    double v = strtod(s, &end);
    if (end == s || !(v >= 0) || !isfinite(v)) return false;
    while (isspace((unsigned char)*end)) end++;
    double mul = 1;
    char u = (char)toupper((unsigned char)*end);
    if (u == 'K' || u == 'M' || u == 'G' || u == 'T') {
        mul = u == 'K' ? 1024.0 : u == 'M' ? 1048576.0 : u == 'G' ? 1073741824.0 : 1099511627776.0;
        end++;
        if (*end == 'i') end++;
        if (toupper((unsigned char)*end) == 'B') end++;
    } else if (u == 'B') {
        end++;
    }
    while (isspace((unsigned char)*end)) end++;
    if (*end) return false;
    double bytes = v * mul;
    if (bytes > 9.0e18) return false;
    *out = (size_t)bytes;
    return true;
}

const char *gp_format_bytes(size_t bytes, char *buf, size_t len)
{
    const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024 && u < 4) { v /= 1024; u++; }
    if (u == 0) snprintf(buf, len, "%zu B", bytes);
    else snprintf(buf, len, "%.1f %s", v, units[u]);
    return buf;
}
