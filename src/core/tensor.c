/*
 * tensor.c — shapes, tensor sizes and views: everything about a tensor that
 * needs no device.  Allocating, freeing and copying tensors go through a
 * device and are backend/tensor.c's.
 */
#include "core/core.h"

#include <string.h>

gp_shape gp_shape_make(int ndim, const int64_t *dims)
{
    GP_ASSERT(ndim >= 1 && ndim <= GP_MAX_DIMS);
    gp_shape s = {0};
    s.ndim = ndim;
    for (int i = 0; i < ndim; i++) s.dims[i] = dims[i];
    return s;
}

gp_shape gp_shape_2d(int64_t n, int64_t f)
{
    gp_shape s = {2, {n, f, 0, 0}};
    return s;
}

gp_shape gp_shape_4d(int64_t n, int64_t c, int64_t h, int64_t w)
{
    gp_shape s = {4, {n, c, h, w}};
    return s;
}

int64_t gp_shape_numel(const gp_shape *s)
{
    int64_t n = 1;
    for (int i = 0; i < s->ndim; i++) n *= s->dims[i];
    return n;
}

int64_t gp_shape_numel_within(const gp_shape *s, int64_t most)
{
    int64_t n = 1;
    for (int i = 0; i < s->ndim; i++) {
        if (s->dims[i] < 0 || __builtin_mul_overflow(n, s->dims[i], &n) || n > most) return -1;
    }
    return n;
}

bool gp_shape_equal(const gp_shape *a, const gp_shape *b)
{
    if (a->ndim != b->ndim) return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->dims[i] != b->dims[i]) return false;
    return true;
}

gp_shape gp_shape_with_batch(const gp_shape *s, int64_t n)
{
    gp_shape r = *s;
    r.dims[0] = n;
    return r;
}

const char *gp_shape_str(const gp_shape *s, char *buf, size_t len)
{
    size_t off = 0;
    off += (size_t)snprintf(buf + off, len - off, "(");
    for (int i = 0; i < s->ndim && off < len; i++)
        off += (size_t)snprintf(buf + off, len - off, i ? ", %lld" : "%lld",
                                (long long)s->dims[i]);
    if (off < len) snprintf(buf + off, len - off, ")");
    return buf;
}

const char *gp_shape_index_str(const gp_shape *s, int from, int64_t flat, int64_t add0,
                               char *buf, size_t len)
{
    size_t off = (size_t)snprintf(buf, len, "(");
    for (int d = from; d < s->ndim && off < len; d++) {
        int64_t stride = 1;
        for (int e = d + 1; e < s->ndim; e++) stride *= s->dims[e];
        off += (size_t)snprintf(buf + off, len - off, "%s%lld", d > from ? ", " : "",
                                (long long)(flat / stride + (d == from ? add0 : 0)));
        flat %= stride;
    }
    if (off < len) snprintf(buf + off, len - off, ")");
    return buf;
}

gp_shape gp_tensor_shape(const gp_tensor *t)
{
    gp_shape s = {0};
    s.ndim = t->ndim;
    memcpy(s.dims, t->dims, sizeof s.dims);
    return s;
}

int64_t gp_tensor_numel(const gp_tensor *t)
{
    if (t->ndim == 0) return 0;
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->dims[i];
    return n;
}

size_t gp_dtype_size(gp_dtype d)
{
    GP_ASSERT(d >= 0 && d < GP_DTYPE_COUNT);
    return d == GP_BF16 ? 2 : 4;
}

const char *gp_dtype_name(gp_dtype d)
{
    GP_ASSERT(d >= 0 && d < GP_DTYPE_COUNT);
    return d == GP_BF16 ? "bf16" : "fp32";
}

size_t gp_tensor_bytes(const gp_tensor *t)
{
    return (size_t)gp_tensor_numel(t) * gp_dtype_size(t->dtype);
}

size_t gp_tensor_storage_bytes(const gp_tensor *t) { return (gp_tensor_bytes(t) + 3) & ~(size_t)3; }

int64_t gp_tensor_words(const gp_tensor *t) { return (int64_t)(gp_tensor_storage_bytes(t) / 4); }

gp_tensor gp_tensor_slice(const gp_tensor *t, int64_t first, int64_t count)
{
    GP_ASSERT(t->ndim >= 1 && first >= 0 && count >= 0 && first + count <= t->dims[0]);
    gp_tensor v = *t;
    int64_t row = 1;
    for (int i = 1; i < t->ndim; i++) row *= t->dims[i];
    v.mem = t->mem ? (gp_mem *)((char *)t->mem + (size_t)(first * row) * gp_dtype_size(t->dtype))
                   : NULL;
    v.dims[0] = count;
    v.owned = false;
    return v;
}

gp_tensor gp_tensor_reshape(const gp_tensor *t, const gp_shape *shape)
{
    GP_ASSERT(gp_shape_numel(shape) == gp_tensor_numel(t));
    gp_tensor v = *t;
    v.ndim = shape->ndim;
    memcpy(v.dims, shape->dims, sizeof v.dims);
    v.owned = false;
    return v;
}
