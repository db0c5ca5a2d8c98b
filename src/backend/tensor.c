/*
 * tensor.c — the device half of gp_tensor: allocation through the device's
 * accounted allocator (gp_dev_alloc), zeroing, freeing, and copies between
 * any two devices.  Shapes and views are core's (core/tensor.c); these live
 * here because core knows nothing of devices.
 */
#include "backend/backend.h"

#include <stdlib.h>
#include <string.h>

gp_status gp_tensor_alloc(gp_tensor *t, gp_device *dev, const gp_shape *shape,
                          gp_mem_category cat)
{
    return gp_tensor_alloc_as(t, dev, shape, GP_F32, cat);
}

gp_status gp_tensor_alloc_as(gp_tensor *t, gp_device *dev, const gp_shape *shape,
                             gp_dtype dtype, gp_mem_category cat)
{
    memset(t, 0, sizeof *t);
    int64_t n = gp_shape_numel(shape);
    GP_ASSERT(n >= 0);
    t->dtype = dtype;
    t->ndim = shape->ndim;
    memcpy(t->dims, shape->dims, sizeof t->dims);
    size_t bytes = gp_tensor_storage_bytes(t);
    void *p = NULL;
    if (n > 0) GP_TRY(gp_dev_alloc(dev, bytes, cat, &p));
    /* the half word an odd bf16 count leaves: zeros (core.h) */
    if (n > 0 && bytes != gp_tensor_bytes(t)) {
        gp_status s = gp_dev_fill(dev, (float *)p + bytes / 4 - 1, 0.0f, 1);
        if (s != GP_OK) {
            gp_dev_free(dev, p, bytes, cat);
            memset(t, 0, sizeof *t);
            return s;
        }
    }
    t->mem = p;
    t->dev = dev;
    t->cat = cat;
    t->owned = true;
    return GP_OK;
}

gp_status gp_tensor_zeros(gp_tensor *t, gp_device *dev, const gp_shape *shape,
                          gp_mem_category cat)
{
    GP_TRY(gp_tensor_alloc(t, dev, shape, cat));
    int64_t n = gp_tensor_numel(t);
    if (n > 0) {
        gp_status s = gp_dev_fill(dev, gp_f32(t), 0.0f, n);
        if (s != GP_OK) {
            gp_tensor_free(t);
            return s;
        }
    }
    return GP_OK;
}

void gp_tensor_free(gp_tensor *t)
{
    if (!t) return;
    if (t->owned && t->mem)
        gp_dev_free(t->dev, t->mem, gp_tensor_storage_bytes(t), t->cat);
    memset(t, 0, sizeof *t);
}

void gp_tensor_drop(gp_tensor *t)
{
    gp_tensor shape = *t;
    gp_tensor_free(t);
    *t = shape;
    t->mem = NULL;
    t->owned = false;
}

/* A synchronous copy between any two devices: peer copy where the backend
 * has one, else staged through host memory. */
static gp_status copy_between(gp_device *dd, void *dst, gp_device *sd, const void *src,
                              size_t bytes)
{
    if (bytes == 0) return GP_OK;
    if (dd == sd) return gp_dev_copy_d2d(dd, dst, src, bytes);
    gp_dev_weights_written(dd, dst, bytes);
    if (dd->iface->copy_peer) {
        gp_status s = dd->iface->copy_peer(dd, dst, sd, src, bytes);
        /* A backend that cannot read the other device's memory (the CPU
         * from a GPU) says so; staging through the host still works. */
        if (s != GP_ERR_UNSUPPORTED) return s;
        gp_error_clear();
    }
    /* Fallback: stage through host memory. */
    void *host = malloc(bytes);
    if (!host) return gp_error_set(GP_ERR_OOM, "out of host memory staging %zu bytes", bytes);
    gp_status s = sd->iface->copy_d2h(sd, host, src, bytes);
    if (s == GP_OK) s = gp_dev_synchronize(sd);
    if (s == GP_OK) s = dd->iface->copy_h2d(dd, dst, host, bytes);
    if (s == GP_OK) s = gp_dev_synchronize(dd);
    free(host);
    return s;
}

gp_status gp_tensor_copy(gp_tensor *dst, const gp_tensor *src)
{
    GP_ASSERT(gp_tensor_numel(dst) == gp_tensor_numel(src) && dst->dtype == src->dtype);
    return copy_between(dst->dev, dst->mem, src->dev, src->mem, gp_tensor_bytes(src));
}

gp_status gp_tensor_convert(gp_tensor *dst, const gp_tensor *src)
{
    int64_t n = gp_tensor_numel(src);
    GP_ASSERT(gp_tensor_numel(dst) == n && dst->dev == src->dev);
    if (n == 0 || dst->mem == src->mem) return GP_OK;
    if (dst->dtype == src->dtype) return gp_dev_copy_d2d(dst->dev, dst->mem, src->mem, gp_tensor_bytes(src));
    if (dst->dtype == GP_BF16) return gp_dev_bf16_pack(dst->dev, gp_bf16(dst), gp_f32(src), n);
    return gp_dev_bf16_unpack(dst->dev, gp_f32(dst), gp_bf16(src), n);
}

gp_status gp_tensor_as(gp_tensor *out, const gp_tensor *src, gp_dtype dtype, gp_mem_category cat)
{
    *out = *src;
    out->owned = false;
    if (src->dtype == dtype) return GP_OK;
    out->dtype = dtype;
    if (!src->mem) return GP_OK; /* the shape alone */
    gp_shape sh = gp_tensor_shape(src);
    GP_TRY(gp_tensor_alloc_as(out, src->dev, &sh, dtype, cat));
    gp_status s = gp_tensor_convert(out, src);
    if (s != GP_OK) gp_tensor_free(out);
    return s;
}

gp_status gp_dev_copy_async(gp_device *dev, void *dst, gp_device *src_dev, const void *src,
                            size_t bytes, void *after, void *done)
{
    gp_dev_weights_written(dev, dst, bytes);
    /* Into host memory (a CPU stage) from another backend that can copy
     * out from this thread: one host wait, for the producer and the copy
     * together, and nothing of the source's own queue. */
    if (src_dev->iface != dev->iface && dev->kind == GP_DEV_CPU && src_dev->iface->copy_to_host) {
        if (bytes) {
            gp_dev_count_wait(src_dev);
            GP_TRY(src_dev->iface->copy_to_host(src_dev, dst, src, bytes, after));
        } else if (after) {
            GP_TRY(gp_dev_event_sync(src_dev, after)); /* counts its wait */
        }
        return done ? gp_dev_event_record(dev, done) : GP_OK;
    }
    /* Another backend's event means nothing to this one: the host waits. */
    if (after && src_dev->iface != dev->iface) {
        GP_TRY(gp_dev_event_sync(src_dev, after));
        after = NULL;
    }
    if (dev->iface->copy_async) {
        gp_status s = dev->iface->copy_async(dev, dst, src_dev, src, bytes, after, done);
        if (s != GP_ERR_UNSUPPORTED) return s;
        gp_error_clear();
    }
    if (after) GP_TRY(gp_dev_event_sync(src_dev, after));
    GP_TRY(copy_between(dev, dst, src_dev, src, bytes));
    return done ? gp_dev_event_record(dev, done) : GP_OK;
}
