/*
 * image_folder.c — data.dataset: image_folder.  The file index of a split
 * (built once, cached, checked against the files' sizes and times), and
 * one sample made from its file: read, decoded (at reduced DCT scale where
 * the crop allows), cropped, resized, flipped and normalised straight into
 * the batch's float buffer.
 *
 * Layouts (data.layout):
 *   classification  <path>/<split>/<class>/.../<image>.{jpg,jpeg,png}: classes are
 *                   the sorted folder names, files sorted by folder path,
 *                   then name, under each, as torchvision's ImageFolder
 *                   orders them.
 *   segmentation    <path>/<split>/images/<name>.<ext> with a mask
 *                   <path>/<split>/masks/<name>.<ext> of the same stem.
 * <split> is "train" or "val".
 *
 * The cache: a text file, <path>/.gpipe-index-<split> (or under
 * data.cache_dir, or ~/.cache/gpipe when <path> is read-only), holding the
 * folders' modification times and every file's size and time, and ending
 * in the number of files and a CRC-32 of every line before it.  It is used
 * only when all of them still match and the index is whole (files unique
 * and in order, each label its class folder's, every class with files);
 * otherwise the folder is listed again and the cache rewritten.
 */
#define _DEFAULT_SOURCE /* DT_DIR, strcasecmp */
#include "data/data.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

typedef struct folder_file {
    char *rel;      /* path under the split folder (owned) */
    char *mask_rel; /* segmentation: the mask's (owned) */
    int32_t label;
    int64_t size, mt_s, mt_ns;
    int64_t msize, mmt_s, mmt_ns;
} folder_file;

typedef struct folder_dir {
    char *rel; /* "" = the split folder itself */
    int64_t mt_s, mt_ns;
    dev_t dev; /* which folder it is, whatever the path: a link back to */
    ino_t ino; /* one listed already is not walked again */
} folder_dir;

struct gp_image_folder {
    char dir[1024];   /* <path>/<split> */
    bool segmentation;
    int classes;
    char **class_names;
    int64_t n;
    folder_file *files;
    int n_dirs;
    folder_dir *dirs;
    /* the transform */
    int out_h, out_w, resize;
    bool rrc, hflip, masks_binary, skip_bad;
    float scale[2], ratio[2];
    /* files found bad (data.on_bad_file: skip): set once, warned once */
    _Atomic unsigned char *bad;
    atomic_llong n_bad;
};

/* ---- listing ----------------------------------------------------------- */

static bool image_ext(const char *name)
{
    const char *dot = strrchr(name, '.');
    return dot && (!strcasecmp(dot, ".jpg") || !strcasecmp(dot, ".jpeg") ||
                   !strcasecmp(dot, ".png"));
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

typedef struct strvec {
    char **v;
    int64_t n, cap;
} strvec;

static gp_status sv_push(strvec *s, const char *str)
{
    if (s->n == s->cap) {
        int64_t nc = s->cap ? 2 * s->cap : 64;
        char **p = realloc(s->v, sizeof *p * (size_t)nc);
        if (!p) return gp_error_set(GP_ERR_OOM, "out of host memory listing image files");
        s->v = p;
        s->cap = nc;
    }
    s->v[s->n] = strdup(str);
    if (!s->v[s->n]) return gp_error_set(GP_ERR_OOM, "out of host memory listing image files");
    s->n++;
    return GP_OK;
}

/* torchvision's ImageFolder order of a class's files (sorted(os.walk())
 * and each folder's names sorted): by folder path, then by name.  Not the
 * depth-first walk's, which put "a/x/1.jpg" before "a-b/1.jpg" ('-' sorts
 * before '/'). */
static int cmp_tv(const void *a, const void *b)
{
    const char *x = *(char *const *)a, *y = *(char *const *)b;
    const char *sx = strrchr(x, '/'), *sy = strrchr(y, '/');
    size_t dx = sx ? (size_t)(sx - x) : 0, dy = sy ? (size_t)(sy - y) : 0;
    int c = memcmp(x, y, dx < dy ? dx : dy);
    if (c || dx != dy) return c ? c : (dx > dy) - (dx < dy);
    return strcmp(x + dx, y + dy);
}

/* qsort with a NULL array is undefined even for 0 elements */
static void sv_sort(strvec *s, int64_t from, int (*cmp)(const void *, const void *))
{
    if (s->n - from > 1) qsort(s->v + from, (size_t)(s->n - from), sizeof *s->v, cmp);
}

static void sv_free(strvec *s)
{
    for (int64_t i = 0; i < s->n; i++) free(s->v[i]);
    free(s->v);
    *s = (strvec){0};
}

static gp_status push_dir(gp_image_folder *f, const char *rel, const struct stat *st)
{
    folder_dir *p = realloc(f->dirs, sizeof *p * (size_t)(f->n_dirs + 1));
    if (!p) return gp_error_set(GP_ERR_OOM, "out of host memory listing image folders");
    f->dirs = p;
    p[f->n_dirs] = (folder_dir){.rel = strdup(rel), .mt_s = st->st_mtim.tv_sec,
                                .mt_ns = st->st_mtim.tv_nsec, .dev = st->st_dev,
                                .ino = st->st_ino};
    if (!p[f->n_dirs].rel) return gp_error_set(GP_ERR_OOM, "out of host memory");
    f->n_dirs++;
    return GP_OK;
}

/* Files with an image extension under dir/rel, recursively (hidden entries
 * skipped), into out as paths relative to dir; the folders into f->dirs. */
static gp_status walk(gp_image_folder *f, const char *rel, bool recurse, strvec *out,
                      int64_t *ignored)
{
    char path[2048];
    snprintf(path, sizeof path, "%s%s%s", f->dir, rel[0] ? "/" : "", rel);
    DIR *d = opendir(path);
    if (!d)
        return gp_error_set(GP_ERR_IO, "%s: cannot open the folder: %s", path, strerror(errno));
    struct stat st;
    if (fstat(dirfd(d), &st) != 0) {
        closedir(d);
        return gp_error_set(GP_ERR_IO, "%s: cannot read the folder", path);
    }
    for (int k = 0; k < f->n_dirs; k++)
        if (f->dirs[k].dev == st.st_dev && f->dirs[k].ino == st.st_ino) {
            /* a link to a folder listed already (a loop such as a -> .,
             * or a second path to it): its files once, not again */
            GP_WARN("%s: the same folder as %s/%s (a link); not listed twice", path, f->dir,
                    f->dirs[k].rel);
            closedir(d);
            return GP_OK;
        }
    if (push_dir(f, rel, &st) != GP_OK) {
        closedir(d);
        return gp_error_set(GP_ERR_IO, "%s: cannot read the folder", path);
    }
    strvec subs = {0};
    int64_t first = out->n;
    gp_status s = GP_OK;
    struct dirent *e;
    while (s == GP_OK && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char sub[2048];
        int len = snprintf(sub, sizeof sub, "%s%s%s", rel, rel[0] ? "/" : "", e->d_name);
        if (len < 0 || (size_t)len >= sizeof sub) continue;
        char full[4096];
        snprintf(full, sizeof full, "%s/%s", f->dir, sub);
        /* the entry's type from readdir where the filesystem gives it (one
         * stat per file less: the listing stats each image once, for its
         * size and time); links and unknown types are followed */
        bool dir = e->d_type == DT_DIR, reg = e->d_type == DT_REG;
        if (e->d_type == DT_UNKNOWN || e->d_type == DT_LNK) {
            if (stat(full, &st) != 0) continue;
            dir = S_ISDIR(st.st_mode);
            reg = S_ISREG(st.st_mode);
        }
        if (dir) {
            if (recurse) s = sv_push(&subs, sub);
        } else if (reg && image_ext(e->d_name)) {
            if (strchr(sub, '\n') || strchr(sub, '\t'))
                s = gp_error_set(GP_ERR_DATA, "%s: a file name with a tab or a newline; rename "
                                 "it", full);
            else
                s = sv_push(out, sub);
        } else {
            (*ignored)++;
        }
    }
    closedir(d);
    /* this folder's files in sorted order, then its sub-folders' */
    if (s == GP_OK) sv_sort(out, first, cmp_str);
    sv_sort(&subs, 0, cmp_str);
    for (int64_t i = 0; s == GP_OK && i < subs.n; i++) s = walk(f, subs.v[i], true, out, ignored);
    sv_free(&subs);
    return s;
}

static gp_status stat_file(const gp_image_folder *f, const char *rel, int64_t *size,
                           int64_t *s_, int64_t *ns)
{
    char full[4096];
    snprintf(full, sizeof full, "%s/%s", f->dir, rel);
    struct stat st;
    if (stat(full, &st) != 0)
        return gp_error_set(GP_ERR_IO, "%s: %s", full, strerror(errno));
    *size = st.st_size;
    *s_ = st.st_mtim.tv_sec;
    *ns = st.st_mtim.tv_nsec;
    return GP_OK;
}

static const char *stem_end(const char *name)
{
    const char *dot = strrchr(name, '.'), *slash = strrchr(name, '/');
    return dot && (!slash || dot > slash) ? dot : name + strlen(name);
}

static int cmp_stem(const void *a, const void *b)
{
    const char *x = *(char *const *)a, *y = *(char *const *)b;
    /* compare the names after "masks/" or "images/" up to their extension */
    x = strchr(x, '/') + 1;
    y = strchr(y, '/') + 1;
    size_t lx = (size_t)(stem_end(x) - x), ly = (size_t)(stem_end(y) - y);
    int c = strncmp(x, y, lx < ly ? lx : ly);
    return c ? c : (lx > ly) - (lx < ly);
}

/* In names sorted by stem (cmp_stem): the first i >= 1 whose name has the
 * stem of the one before it, else 0. */
static int64_t same_stem_at(char *const *v, int64_t n)
{
    for (int64_t i = 1; i < n; i++)
        if (cmp_stem(&v[i - 1], &v[i]) == 0) return i;
    return 0;
}

/* A class folder that is a folder listed already, through a link (to
 * another class, to a folder inside one, or to the split folder), would
 * give two classes the same images: refused, naming both and the link. */
static gp_status class_alias(const gp_image_folder *f, const char *cls)
{
    char full[2048];
    snprintf(full, sizeof full, "%s/%s", f->dir, cls);
    struct stat st, lst;
    if (stat(full, &st) != 0) return GP_OK; /* the walk reports it */
    for (int k = 0; k < f->n_dirs; k++) {
        if (f->dirs[k].dev != st.st_dev || f->dirs[k].ino != st.st_ino) continue;
        const char *other = f->dirs[k].rel;
        if (!other[0])
            return gp_error_set(GP_ERR_DATA, "%s: class folder '%s' is a link to the split "
                                "folder %s itself; remove the link", full, cls, f->dir);
        int n = (int)strcspn(other, "/");
        bool link = lstat(full, &lst) == 0 && S_ISLNK(lst.st_mode);
        return gp_error_set(GP_ERR_DATA, "%s: class folder '%s' %s %s/%s (class '%.*s'), so two "
                            "classes would hold the same images; gpipe refuses that: remove the "
                            "link, or copy the folder if both classes are meant to have them",
                            full, cls, link ? "is a link to" : "is the folder linked to by",
                            f->dir, other, n, other);
    }
    return GP_OK;
}

static gp_status list_classification(gp_image_folder *f)
{
    DIR *d = opendir(f->dir);
    if (!d)
        return gp_error_set(GP_ERR_IO, "%s: cannot open the folder: %s; data.path must hold "
                            "train/<class>/ and val/<class>/ folders of images", f->dir,
                            strerror(errno));
    strvec cls = {0};
    gp_status s = GP_OK;
    struct dirent *e;
    while (s == GP_OK && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char full[2048];
        struct stat st;
        snprintf(full, sizeof full, "%s/%s", f->dir, e->d_name);
        if (stat(full, &st) == 0 && S_ISDIR(st.st_mode)) s = sv_push(&cls, e->d_name);
    }
    closedir(d);
    if (s == GP_OK && cls.n == 0)
        s = gp_error_set(GP_ERR_DATA, "%s: no class folders; the classification layout is "
                         "<path>/<split>/<class>/<image>.jpg", f->dir);
    if (s != GP_OK) {
        sv_free(&cls);
        return s;
    }
    sv_sort(&cls, 0, cmp_str);
    struct stat rst;
    if (stat(f->dir, &rst) == 0) s = push_dir(f, "", &rst);
    strvec files = {0};
    int32_t *labels = NULL;
    int64_t ignored = 0;
    for (int64_t c = 0; s == GP_OK && c < cls.n; c++) {
        int64_t before = files.n;
        s = class_alias(f, cls.v[c]);
        if (s == GP_OK) s = walk(f, cls.v[c], true, &files, &ignored);
        if (s == GP_OK) sv_sort(&files, before, cmp_tv);
        if (s == GP_OK && files.n == before)
            s = gp_error_set(GP_ERR_DATA, "%s/%s: class folder with no images (.jpg, .jpeg or "
                             ".png); add images or remove the folder", f->dir, cls.v[c]);
        if (s == GP_OK) {
            int32_t *p = realloc(labels, sizeof *p * (size_t)files.n);
            if (!p) s = gp_error_set(GP_ERR_OOM, "out of host memory");
            labels = p;
            for (int64_t i = before; p && i < files.n; i++) labels[i] = (int32_t)c;
        }
    }
    if (s == GP_OK) {
        f->files = calloc((size_t)files.n, sizeof *f->files);
        if (!f->files) s = gp_error_set(GP_ERR_OOM, "out of host memory");
    }
    for (int64_t i = 0; s == GP_OK && i < files.n; i++) {
        folder_file *ff = &f->files[i];
        ff->rel = files.v[i];
        files.v[i] = NULL;
        ff->label = labels[i];
        f->n = i + 1;
        s = stat_file(f, ff->rel, &ff->size, &ff->mt_s, &ff->mt_ns);
    }
    if (s == GP_OK) {
        f->classes = (int)cls.n;
        f->class_names = cls.v;
        cls.v = NULL;
        cls.n = 0;
    }
    free(labels);
    sv_free(&files);
    sv_free(&cls);
    return s;
}

/* A segmentation folder's classes: 0 / 1, or every byte value. */
static int segmentation_classes(const gp_image_folder *f) { return f->masks_binary ? 2 : 256; }

static gp_status list_segmentation(gp_image_folder *f)
{
    strvec im = {0}, mk = {0};
    int64_t ignored = 0;
    struct stat rst;
    gp_status s = stat(f->dir, &rst) == 0
                      ? push_dir(f, "", &rst)
                      : gp_error_set(GP_ERR_IO, "%s: %s; data.path must hold train/images, "
                                     "train/masks, val/images and val/masks", f->dir,
                                     strerror(errno));
    if (s == GP_OK) s = walk(f, "images", false, &im, &ignored);
    if (s == GP_OK) s = walk(f, "masks", false, &mk, &ignored);
    if (s == GP_OK && im.n == 0)
        s = gp_error_set(GP_ERR_DATA, "%s/images: no images (.jpg, .jpeg or .png)", f->dir);
    if (s == GP_OK) {
        sv_sort(&im, 0, cmp_str);
        sv_sort(&mk, 0, cmp_stem);
        /* two images of one stem (a.jpg, a.png) would both take a's mask */
        char **by_stem = malloc((size_t)im.n * sizeof *by_stem);
        if (!by_stem) s = gp_error_set(GP_ERR_OOM, "out of host memory");
        int64_t i = 0;
        if (s == GP_OK) {
            memcpy(by_stem, im.v, (size_t)im.n * sizeof *by_stem);
            qsort(by_stem, (size_t)im.n, sizeof *by_stem, cmp_stem);
            i = same_stem_at(by_stem, im.n);
        }
        if (i)
            s = gp_error_set(GP_ERR_DATA, "%s: images %s and %s have the same name, so they "
                             "would share one mask; rename one", f->dir, by_stem[i - 1],
                             by_stem[i]);
        free(by_stem);
        if (s == GP_OK && (i = same_stem_at(mk.v, mk.n)))
            s = gp_error_set(GP_ERR_DATA, "%s: masks %s and %s have the same name; keep one",
                             f->dir, mk.v[i - 1], mk.v[i]);
    }
    if (s == GP_OK) {
        f->files = calloc((size_t)im.n, sizeof *f->files);
        if (!f->files) s = gp_error_set(GP_ERR_OOM, "out of host memory");
    }
    unsigned char *used = mk.n ? calloc((size_t)mk.n, 1) : NULL;
    for (int64_t i = 0; s == GP_OK && i < im.n; i++) {
        char **hit = mk.n ? bsearch(&im.v[i], mk.v, (size_t)mk.n, sizeof *mk.v, cmp_stem)
                          : NULL;
        if (!hit) {
            const char *nm = im.v[i] + strlen("images/");
            s = gp_error_set(GP_ERR_DATA, "%s/%s has no mask: expected %s/masks/%.*s.png (or "
                             ".jpg) beside it", f->dir, im.v[i], f->dir,
                             (int)(stem_end(nm) - nm), nm);
            break;
        }
        if (used) used[hit - mk.v] = 1;
        folder_file *ff = &f->files[i];
        ff->rel = im.v[i];
        im.v[i] = NULL;
        ff->mask_rel = strdup(*hit);
        f->n = i + 1;
        if (!ff->mask_rel) s = gp_error_set(GP_ERR_OOM, "out of host memory");
        if (s == GP_OK) s = stat_file(f, ff->rel, &ff->size, &ff->mt_s, &ff->mt_ns);
        if (s == GP_OK) s = stat_file(f, ff->mask_rel, &ff->msize, &ff->mmt_s, &ff->mmt_ns);
    }
    for (int64_t i = 0; s == GP_OK && i < mk.n; i++)
        if (!used || !used[i])
            s = gp_error_set(GP_ERR_DATA, "%s/%s has no image of the same name in %s/images",
                             f->dir, mk.v[i], f->dir);
    free(used);
    sv_free(&im);
    sv_free(&mk);
    f->classes = segmentation_classes(f);
    return s;
}

/* ---- the cache --------------------------------------------------------- */

/* (version 2 ends in the count and checksum line; version 3 lists a
 * class's files in torchvision's order, cmp_tv) */
#define CACHE_MAGIC_STEM "gpipe-image-index "
#define CACHE_MAGIC CACHE_MAGIC_STEM "3"

static void cache_path(const gp_data_config *cfg, const char *split, const char *dir, char *out,
                       size_t len, bool fallback)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a of the folder and layout */
    for (const char *p = dir; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
    h = (h ^ (unsigned)cfg->layout) * 1099511628211ull;
    if (cfg->cache_dir[0]) {
        snprintf(out, len, "%s/gpipe-index-%016llx", cfg->cache_dir, (unsigned long long)h);
    } else if (!fallback) {
        snprintf(out, len, "%s/.gpipe-index-%s%s", cfg->path, split,
                 cfg->layout == GP_LAYOUT_SEGMENTATION ? "-seg" : "");
    } else {
        const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
        if (xdg && xdg[0])
            snprintf(out, len, "%s/gpipe/index-%016llx", xdg, (unsigned long long)h);
        else
            snprintf(out, len, "%s/.cache/gpipe/index-%016llx", home ? home : "/tmp",
                     (unsigned long long)h);
    }
}

/* One line of the cache, its bytes added to *crc; false if it does not fit
 * (no line of a listing is that long) or cannot be written. */
static bool cache_put(FILE *fp, uLong *crc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static bool cache_put(FILE *fp, uLong *crc, const char *fmt, ...)
{
    char line[8192];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof line) return false;
    *crc = crc32(*crc, (const Bytef *)line, (uInt)n);
    return fwrite(line, 1, (size_t)n, fp) == (size_t)n;
}

static gp_status cache_write(const gp_image_folder *f, const char *path)
{
    char tmp[1200];
    snprintf(tmp, sizeof tmp, "%s.tmp%ld", path, (long)getpid());
    /* the cache directory under ~/.cache may not exist yet */
    char dir[1200];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir) {
        *slash = '\0';
        if (gp_make_dirs(dir, "index cache directory") != GP_OK) {
            gp_error_clear();
            return GP_ERR_IO;
        }
    }
    FILE *fp = fopen(tmp, "w");
    if (!fp) return GP_ERR_IO;
    uLong crc = crc32(0, NULL, 0);
    bool ok = cache_put(fp, &crc, "%s\t%d\t%s\n", CACHE_MAGIC, f->segmentation, f->dir);
    for (int i = 0; ok && i < f->n_dirs; i++)
        ok = cache_put(fp, &crc, "D\t%lld\t%lld\t%s\n", (long long)f->dirs[i].mt_s,
                       (long long)f->dirs[i].mt_ns, f->dirs[i].rel);
    for (int c = 0; ok && c < f->classes && f->class_names; c++)
        ok = cache_put(fp, &crc, "C\t%s\n", f->class_names[c]);
    for (int64_t i = 0; ok && i < f->n; i++) {
        const folder_file *ff = &f->files[i];
        if (ff->mask_rel)
            ok = cache_put(fp, &crc, "F\t%d\t%lld\t%lld\t%lld\t%s\t%lld\t%lld\t%lld\t%s\n",
                           ff->label, (long long)ff->size, (long long)ff->mt_s,
                           (long long)ff->mt_ns, ff->rel, (long long)ff->msize,
                           (long long)ff->mmt_s, (long long)ff->mmt_ns, ff->mask_rel);
        else
            ok = cache_put(fp, &crc, "F\t%d\t%lld\t%lld\t%lld\t%s\n", ff->label,
                           (long long)ff->size, (long long)ff->mt_s, (long long)ff->mt_ns,
                           ff->rel);
    }
    /* the end: a cache cut anywhere, or edited, does not match it */
    if (ok) fprintf(fp, "E\t%lld\t%08lx\n", (long long)f->n, (unsigned long)crc);
    ok = ok && !ferror(fp);
    ok = fclose(fp) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return GP_ERR_IO;
    }
    return GP_OK;
}

/* Split a line at tabs in place: up to max fields. */
static int fields(char *line, char **out, int max)
{
    int n = 0;
    char *p = line;
    while (n < max) {
        out[n++] = p;
        char *t = strchr(p, '\t');
        if (!t) break;
        *t = '\0';
        p = t + 1;
    }
    return n;
}

/* The class a cached file's path names: its first folder among the
 * sorted class names, else -1. */
static int cache_class_of(const strvec *cls, const char *rel)
{
    size_t k = strcspn(rel, "/");
    if (!rel[k]) return -1;
    int64_t lo = 0, hi = cls->n;
    while (lo < hi) {
        int64_t mid = (lo + hi) / 2;
        int c = strncmp(cls->v[mid], rel, k);
        if (c == 0 && cls->v[mid][k]) c = 1; /* a longer name sorts after */
        if (c == 0) return (int)mid;
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return -1;
}

/* File ff of a cache's F line (fields fl, n of them: 10 with a mask) as
 * it is now: its size and time (and its mask's) into ff; false where they
 * are not the line's, or it is gone. */
static bool cache_file_current(const gp_image_folder *f, folder_file *ff, char **fl, int n)
{
    int64_t sz = -1, s_ = 0, ns = 0;
    bool ok = ff->rel && (n == 6 || ff->mask_rel) &&
              stat_file(f, ff->rel, &sz, &s_, &ns) == GP_OK && sz == atoll(fl[2]) &&
              s_ == atoll(fl[3]) && ns == atoll(fl[4]);
    ff->size = sz;
    ff->mt_s = s_;
    ff->mt_ns = ns;
    if (ok && n == 10) {
        ok = stat_file(f, ff->mask_rel, &sz, &s_, &ns) == GP_OK && sz == atoll(fl[6]) &&
             s_ == atoll(fl[7]) && ns == atoll(fl[8]);
        ff->msize = sz;
        ff->mmt_s = s_;
        ff->mmt_ns = ns;
    }
    return ok;
}

/* A cache read line by line whose lines each passed: every class has
 * files (the listing refuses an empty class), and no file is there twice;
 * false with *why otherwise (or out of host memory). */
static bool cache_whole(const gp_image_folder *f, const strvec *cls, int64_t nf,
                        const char **why)
{
    bool ok = true;
    int64_t with_files = 0; /* (labels ascend: each new one is a class) */
    for (int64_t i = 0; i < nf; i++)
        with_files += i == 0 || f->files[i].label != f->files[i - 1].label;
    if (!f->segmentation && with_files != cls->n) {
        ok = false;
        *why = "a class with no files";
    }
    if (ok && !f->segmentation && nf > 1) {
        char **names = malloc(sizeof *names * (size_t)nf);
        ok = names != NULL;
        for (int64_t i = 0; ok && i < nf; i++) names[i] = f->files[i].rel;
        if (ok) qsort(names, (size_t)nf, sizeof *names, cmp_str);
        for (int64_t i = 1; ok && i < nf; i++)
            if (!strcmp(names[i - 1], names[i])) {
                ok = false;
                *why = "a file listed twice";
            }
        free(names);
    }
    return ok;
}

/* What a cache that was not used left in f (its first nf files, its
 * folders) freed: f is then listed afresh. */
static void cache_discard(gp_image_folder *f, int64_t nf)
{
    for (int64_t i = 0; i < nf; i++) {
        free(f->files[i].rel);
        free(f->files[i].mask_rel);
    }
    free(f->files);
    f->files = NULL;
    f->n = 0;
    for (int i = 0; i < f->n_dirs; i++) free(f->dirs[i].rel);
    free(f->dirs);
    f->dirs = NULL;
    f->n_dirs = 0;
}

/* Read the cache at path into f if it is there, whole, and still matches
 * every folder's time and every file's size and time; false otherwise (f
 * is then left for listing).  *damaged says why when the cache is not as
 * gpipe wrote it (cut, edited, a line twice) rather than out of date: its
 * labels must be its class folders' indices, classes sorted and unique,
 * every class with files, files unique and in the listing's order (by
 * class; by name for segmentation), and the last line the number of files
 * and the CRC-32 of every line before it. */
static bool cache_read(gp_image_folder *f, const char *path, const char **damaged)
{
    *damaged = NULL;
    FILE *fp = gp_fopen_regular(path); /* a FIFO named like the cache must not block */
    if (!fp) return false;
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    bool ok = true, ended = false;
    const char *why = NULL;
    uLong crc = crc32(0, NULL, 0);
    int64_t nf = 0, capf = 0;
    strvec cls = {0};
    char want[1200];
    snprintf(want, sizeof want, "%s\t%d\t%s", CACHE_MAGIC, f->segmentation, f->dir);
    if ((len = getline(&line, &cap, fp)) <= 0) {
        ok = false;
        why = "empty";
    } else {
        crc = crc32(crc, (const Bytef *)line, (uInt)len);
        line[len - 1] = '\0';
        /* another version's cache, or another folder's: out of date */
        if (strcmp(line, want)) ok = false;
        if (!ok && strncmp(line, CACHE_MAGIC_STEM, strlen(CACHE_MAGIC_STEM)))
            why = "not an index gpipe writes";
    }
    while (ok && (len = getline(&line, &cap, fp)) > 0) {
        if (ended || line[len - 1] != '\n') {
            ok = false;
            why = ended ? "lines after its end" : "cut short";
            break;
        }
        if (line[0] != 'E') crc = crc32(crc, (const Bytef *)line, (uInt)len);
        line[len - 1] = '\0';
        char *fl[10] = {0};
        int n = fields(line, fl, 10);
        if (fl[0][0] == 'E' && n == 3) {
            char *end = NULL;
            long long count = strtoll(fl[1], &end, 10);
            unsigned long sum = strtoul(fl[2], NULL, 16);
            ended = true;
            if (end == fl[1] || *end || count != nf || sum != (unsigned long)crc) {
                ok = false;
                why = "its file count or checksum does not match its lines";
            }
        } else if (fl[0][0] == 'D' && n == 4) {
            char full[2048];
            snprintf(full, sizeof full, "%s%s%s", f->dir, fl[3][0] ? "/" : "", fl[3]);
            struct stat st;
            ok = stat(full, &st) == 0 && st.st_mtim.tv_sec == atoll(fl[1]) &&
                 st.st_mtim.tv_nsec == atoll(fl[2]) && push_dir(f, fl[3], &st) == GP_OK;
        } else if (fl[0][0] == 'C' && n == 2) {
            if (nf > 0 || (cls.n > 0 && strcmp(cls.v[cls.n - 1], fl[1]) >= 0)) {
                ok = false;
                why = "classes out of order or listed twice";
            } else {
                ok = sv_push(&cls, fl[1]) == GP_OK;
            }
        } else if (fl[0][0] == 'F' && (n == 6 || n == 10)) {
            if (nf == capf) {
                capf = capf ? 2 * capf : 1024;
                folder_file *p = realloc(f->files, sizeof *p * (size_t)capf);
                if (!p) {
                    ok = false;
                    break;
                }
                f->files = p;
            }
            folder_file *ff = &f->files[nf];
            char *end = NULL;
            long label = strtol(fl[1], &end, 10);
            *ff = (folder_file){.label = (int)label, .rel = strdup(fl[5]),
                                .mask_rel = n == 10 ? strdup(fl[9]) : NULL};
            nf++;
            f->n = nf;
            const folder_file *prev = nf > 1 ? ff - 1 : NULL;
            /* the label is the class folder's (segmentation: always 0),
             * the files in the listing's order */
            int derived = f->segmentation ? 0 : ff->rel ? cache_class_of(&cls, ff->rel) : -1;
            if (end == fl[1] || *end || label != derived || (n == 10) != (f->segmentation != 0)) {
                ok = false;
                why = "a label that is not its class folder's, or a malformed line";
            } else if (prev && (f->segmentation ? strcmp(prev->rel, ff->rel) >= 0
                                                : prev->label > ff->label)) {
                ok = false;
                why = "files out of order or listed twice";
            }
            ok = ok && cache_file_current(f, ff, fl, n);
        } else {
            ok = false;
            why = "a line gpipe does not write";
        }
    }
    if (ok && !ended) {
        ok = false;
        why = "cut short";
    }
    free(line);
    fclose(fp);
    gp_error_clear();
    if (ok) ok = cache_whole(f, &cls, nf, &why);
    if (!ok) *damaged = why;
    if (ok && nf > 0 && (f->segmentation || cls.n > 0)) {
        f->class_names = cls.v;
        f->classes = f->segmentation ? segmentation_classes(f) : (int)cls.n;
        return true;
    }
    sv_free(&cls);
    cache_discard(f, nf);
    return false;
}

/* ---- open / free ------------------------------------------------------- */

void gp_image_folder_free(gp_image_folder *f)
{
    if (!f) return;
    for (int64_t i = 0; i < f->n; i++) {
        free(f->files[i].rel);
        free(f->files[i].mask_rel);
    }
    free(f->files);
    for (int i = 0; i < f->n_dirs; i++) free(f->dirs[i].rel);
    free(f->dirs);
    for (int c = 0; f->class_names && c < f->classes; c++) free(f->class_names[c]);
    free(f->class_names);
    free((void *)f->bad);
    free(f);
}

gp_status gp_image_folder_open(const gp_data_config *cfg, bool train_split, int out_h, int out_w,
                               gp_image_folder **out, bool *cached)
{
    *out = NULL;
    if (!gp_image_supported()) {
        gp_image_codec *cd;
        return gp_image_codec_create(&cd); /* the "built without" message */
    }
    const char *split = train_split ? "train" : "val";
    gp_image_folder *f = calloc(1, sizeof *f);
    if (!f) return gp_error_set(GP_ERR_OOM, "out of host memory");
    int len = snprintf(f->dir, sizeof f->dir, "%s/%s", cfg->path, split);
    if (len < 0 || (size_t)len >= sizeof f->dir) {
        free(f);
        return gp_error_set(GP_ERR_INVALID, "data.path '%s' is too long", cfg->path);
    }
    f->segmentation = cfg->layout == GP_LAYOUT_SEGMENTATION;
    f->masks_binary = cfg->masks_binary;
    f->out_h = out_h;
    f->out_w = out_w;
    f->resize = gp_data_config_resize(cfg, out_h, out_w);
    f->rrc = cfg->rrc;
    f->hflip = cfg->hflip;
    f->skip_bad = cfg->skip_bad_files;
    memcpy(f->scale, cfg->rrc_scale, sizeof f->scale);
    memcpy(f->ratio, cfg->rrc_ratio, sizeof f->ratio);
    struct stat st;
    int found = stat(cfg->path, &st) == 0 ? 0 : errno;
    if (found || !S_ISDIR(st.st_mode)) {
        gp_status s = gp_error_set(GP_ERR_IO, "data.path '%s': %s; image_folder reads a folder "
                                   "in ImageNet's layout, train/<class>/*.jpg and "
                                   "val/<class>/*.jpg (scripts/make-image-folder.py DIR makes a "
                                   "small one to try)", cfg->path,
                                   found ? strerror(found) : "not a folder");
        free(f);
        return s;
    }
    char cpath[1100], cfall[1100];
    cache_path(cfg, split, f->dir, cpath, sizeof cpath, false);
    cache_path(cfg, split, f->dir, cfall, sizeof cfall, true);
    const char *damaged = NULL, *fall_damaged = NULL;
    bool hit = cache_read(f, cpath, &damaged) ||
               (!cfg->cache_dir[0] && cache_read(f, cfall, &fall_damaged));
    gp_status s = GP_OK;
    if (!hit && (damaged || fall_damaged))
        GP_INFO("%s: the index cache is damaged (%s); listing the folder again",
                damaged ? cpath : cfall, damaged ? damaged : fall_damaged);
    if (!hit) {
        /* a big folder takes a while the first time: say what is going on */
        GP_INFO("indexing %s (once: the index is cached)", f->dir);
        double t0 = gp_now();
        s = f->segmentation ? list_segmentation(f) : list_classification(f);
        /* a cache that cannot be written costs the next start a listing,
         * nothing more */
        const char *where = cpath;
        if (s == GP_OK && cache_write(f, cpath) != GP_OK)
            where = !cfg->cache_dir[0] && cache_write(f, cfall) == GP_OK ? cfall : NULL;
        char what[64];
        if (f->segmentation) snprintf(what, sizeof what, "with masks");
        else snprintf(what, sizeof what, "in %d classes", f->classes);
        if (s == GP_OK)
            GP_INFO("%s: %lld images %s, listed in %.1f s; index %s%s", f->dir, (long long)f->n,
                    what, gp_now() - t0, where ? "cached in " : "not cached (no writable place)",
                    where ? where : "");
    }
    if (s == GP_OK) {
        f->bad = calloc((size_t)f->n, 1);
        if (!f->bad) s = gp_error_set(GP_ERR_OOM, "out of host memory");
    }
    if (s != GP_OK) {
        gp_image_folder_free(f);
        return s;
    }
    /* a segmentation folder read as classes trains "image or mask?" */
    if (!f->segmentation && f->classes == 2 && !strcmp(f->class_names[0], "images") &&
        !strcmp(f->class_names[1], "masks"))
        GP_WARN("%s: its two classes are 'images' and 'masks', which is a segmentation folder's "
                "layout; to learn the masks set data.layout: segmentation (and model.loss: "
                "bce_with_logits)", f->dir);
    if (cached) *cached = hit;
    *out = f;
    return GP_OK;
}

gp_status gp_image_folder_align_classes(gp_image_folder *val, const gp_image_folder *train)
{
    if (val->segmentation || train->segmentation) return GP_OK;
    int32_t *map = malloc(sizeof *map * (size_t)(val->classes > 0 ? val->classes : 1));
    if (!map) return gp_error_set(GP_ERR_OOM, "out of host memory");
    for (int c = 0; c < val->classes; c++) {
        char **hit = bsearch(&val->class_names[c], train->class_names, (size_t)train->classes,
                             sizeof *train->class_names, cmp_str);
        if (!hit) {
            free(map);
            return gp_error_set(GP_ERR_DATA, "%s/%s: a class that %s does not have; the "
                                "evaluation split's classes must be among the training "
                                "split's (their labels are the training split's indices)",
                                val->dir, val->class_names[c], train->dir);
        }
        map[c] = (int32_t)(hit - train->class_names);
    }
    for (int64_t i = 0; i < val->n; i++) val->files[i].label = map[val->files[i].label];
    free(map);
    /* the evaluation split now counts the training split's classes */
    for (int c = 0; c < val->classes; c++) free(val->class_names[c]);
    free(val->class_names);
    val->class_names = calloc((size_t)train->classes, sizeof *val->class_names);
    if (!val->class_names) {
        val->classes = 0;
        return gp_error_set(GP_ERR_OOM, "out of host memory");
    }
    for (int c = 0; c < train->classes; c++) {
        val->class_names[c] = strdup(train->class_names[c]);
        if (!val->class_names[c]) {
            val->classes = c;
            return gp_error_set(GP_ERR_OOM, "out of host memory");
        }
    }
    val->classes = train->classes;
    return GP_OK;
}

void gp_image_folder_keep(gp_image_folder *f, int64_t keep)
{
    if (keep <= 0 || keep >= f->n) return;
    /* file floor(i n / keep) for i < keep: increasing, so the kept ones
     * move down in place (k <= j), and the others are freed */
    int64_t n = f->n, next = 0;
    for (int64_t j = 0; j < n; j++) {
        bool kept = next < keep && j == next * n / keep;
        if (kept) f->files[next++] = f->files[j];
        else {
            free(f->files[j].rel);
            free(f->files[j].mask_rel);
        }
    }
    f->n = keep;
}

int64_t gp_image_folder_size(const gp_image_folder *f) { return f->n; }
int gp_image_folder_classes(const gp_image_folder *f) { return f->classes; }
bool gp_image_folder_segmentation(const gp_image_folder *f) { return f->segmentation; }
const char *gp_image_folder_dir(const gp_image_folder *f) { return f->dir; }
int gp_image_folder_label(const gp_image_folder *f, int64_t i) { return f->files[i].label; }
const char *gp_image_folder_file(const gp_image_folder *f, int64_t i) { return f->files[i].rel; }
int64_t gp_image_folder_bad_files(const gp_image_folder *f) { return atomic_load(&f->n_bad); }

/* ---- one sample -------------------------------------------------------- */

struct gp_folder_worker {
    gp_image_codec *codec;
    uint8_t *buf; /* the file's bytes */
    size_t cap;
    gp_image img, mask;
    uint8_t *out; /* (out_h, out_w, 3) resampled */
    uint8_t *mout;
    size_t out_cap;
    gp_fbuf tmp;
};

gp_status gp_folder_worker_create(gp_folder_worker **out)
{
    gp_folder_worker *w = calloc(1, sizeof *w);
    if (!w) return gp_error_set(GP_ERR_OOM, "out of host memory for a loader worker");
    gp_status s = gp_image_codec_create(&w->codec);
    if (s != GP_OK) {
        free(w);
        return s;
    }
    *out = w;
    return GP_OK;
}

void gp_folder_worker_destroy(gp_folder_worker *w)
{
    if (!w) return;
    gp_image_codec_destroy(w->codec);
    free(w->buf);
    gp_image_free(&w->img);
    gp_image_free(&w->mask);
    free(w->out);
    free(w->mout);
    free(w->tmp.p);
    free(w);
}

static gp_status read_file(gp_folder_worker *w, const char *path, size_t *len)
{
    /* a FIFO named like an image must not stall the open */
    int fd = gp_open_regular(path);
    if (fd < 0 && errno != EINVAL)
        return gp_error_set(GP_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fd >= 0 && fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return gp_error_set(GP_ERR_IO, "%s: %s", path, strerror(e));
    }
    /* read whole before any check: bounded, so a huge or special file is a
     * bad file (on_bad_file decides), not the machine's memory */
    if (fd < 0 || st.st_size > ((off_t)1 << 30)) {
        if (fd >= 0) close(fd);
        return gp_error_set(GP_ERR_DATA, "%s: %s; not an image gpipe reads (remove it, or set "
                            "data.on_bad_file: skip)", path,
                            fd >= 0 ? "larger than 1 GiB" : "not a regular file");
    }
    size_t n = (size_t)st.st_size;
    if (n + 1 > w->cap) {
        uint8_t *p = realloc(w->buf, n + 1);
        if (!p) {
            close(fd);
            return gp_error_set(GP_ERR_OOM, "%s: out of host memory for %zu bytes", path, n);
        }
        w->buf = p;
        w->cap = n + 1;
    }
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, w->buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            int e = errno;
            close(fd);
            return gp_error_set(GP_ERR_IO, "%s: read failed at byte %zu of %zu: %s", path, got,
                                n, r < 0 ? strerror(e) : "the file shrank");
        }
        got += (size_t)r;
    }
    close(fd);
    if (n == 0) return gp_error_set(GP_ERR_DATA, "%s: empty file", path);
    *len = n;
    return GP_OK;
}

bool gp_image_folder_is_bad(const gp_image_folder *f, int64_t i)
{
    return atomic_load(&((gp_image_folder *)f)->bad[i]) != 0;
}

bool gp_image_folder_mark_bad(gp_image_folder *f, int64_t i)
{
    if (atomic_exchange(&f->bad[i], 1)) return false;
    atomic_fetch_add(&f->n_bad, 1);
    return true;
}

gp_status gp_folder_sample(const gp_image_folder *f, gp_folder_worker *w, int64_t i, bool train,
                           uint64_t seed, int64_t epoch, int64_t pos, bool normalize,
                           const float *mean, const float *std, float *x, float *y)
{
    const folder_file *ff = &f->files[i];
    char path[2200];
    snprintf(path, sizeof path, "%s/%s", f->dir, ff->rel);
    size_t len;
    GP_TRY(read_file(w, path, &len));
    int iw, ih;
    GP_TRY(gp_image_probe(w->codec, w->buf, len, path, &iw, &ih));
    int oh = f->out_h, ow = f->out_w;
    gp_box box;
    bool flip = false;
    if (train && f->rrc) {
        gp_image_rrc_draw(seed, epoch, pos, iw, ih, f->scale, f->ratio, f->hflip, &box, &flip);
    } else {
        gp_image_eval_box(iw, ih, f->resize, oh, ow, &box);
        if (train && f->hflip) {
            gp_box unused;
            gp_image_rrc_draw(seed, epoch, pos, iw, ih, f->scale, f->ratio, true, &unused, &flip);
        }
    }
    int denom = gp_image_pick_denom(&box, oh, ow);
    /* a random crop decodes its region only; evaluation the whole image
     * (its filter may reach past the box) */
    bool region = train && f->rrc;
    int ox = 0, oy = 0, fw, fh;
    if (region) {
        GP_TRY(gp_image_decode_region(w->codec, w->buf, len, path, denom, (int)box.x,
                                      (int)box.y, (int)box.w, (int)box.h, &w->img, &ox, &oy,
                                      &fw, &fh));
    } else {
        GP_TRY(gp_image_decode(w->codec, w->buf, len, path, 3, denom, &w->img));
        fw = w->img.w;
        fh = w->img.h;
    }
    size_t need = (size_t)oh * (size_t)ow * 3;
    if (need > w->out_cap) {
        uint8_t *a = realloc(w->out, need), *b = a ? realloc(w->mout, need) : NULL;
        if (a) w->out = a;
        if (b) w->mout = b;
        if (!a || !b) return gp_error_set(GP_ERR_OOM, "out of host memory");
        w->out_cap = need;
    }
    /* the box in the decoded pixels: a DCT-scaled decode covers the same
     * picture with fewer of them, a region starts at (ox, oy) */
    double sx = (double)fw / iw, sy = (double)fh / ih;
    gp_box sb = {box.x * sx - ox, box.y * sy - oy, box.w * sx, box.h * sy};
    /* the filter stays inside the crop for a random crop (torchvision crops,
     * then resizes), inside the image for evaluation */
    int cx0 = 0, cy0 = 0, cx1 = w->img.w, cy1 = w->img.h;
    if (region) {
        cx0 = (int)floor(sb.x);
        cy0 = (int)floor(sb.y);
        cx1 = (int)ceil(sb.x + sb.w);
        cy1 = (int)ceil(sb.y + sb.h);
    }
    GP_TRY(gp_image_resample(w->img.px, w->img.w, w->img.h, 3, &sb, cx0, cy0, cx1, cy1, w->out,
                             ow, oh, &w->tmp));
    /* (h, w, 3) bytes to normalised (3, h, w) floats, mirrored if drawn:
     * one pass through a table per channel (a byte has 256 values) */
    float lut[3][256];
    for (int c = 0; c < 3; c++) {
        float a, b;
        gp_data_norm_affine(normalize, mean, std, c, &a, &b);
        for (int v = 0; v < 256; v++) lut[c][v] = (float)v * a + b;
    }
    int64_t hw = (int64_t)oh * ow;
    for (int yy = 0; yy < oh; yy++) {
        const uint8_t *src = w->out + (size_t)yy * (size_t)ow * 3;
        float *d0 = x + (int64_t)yy * ow, *d1 = d0 + hw, *d2 = d1 + hw;
        for (int xx = 0; xx < ow; xx++) {
            int o = flip ? ow - 1 - xx : xx;
            d0[o] = lut[0][src[3 * xx]];
            d1[o] = lut[1][src[3 * xx + 1]];
            d2[o] = lut[2][src[3 * xx + 2]];
        }
    }
    if (!f->segmentation) {
        y[0] = (float)ff->label;
        return GP_OK;
    }
    /* the mask: same box, nearest pixel, same flip */
    snprintf(path, sizeof path, "%s/%s", f->dir, ff->mask_rel);
    GP_TRY(read_file(w, path, &len));
    int mw, mh;
    GP_TRY(gp_image_probe(w->codec, w->buf, len, path, &mw, &mh));
    if (mw != iw || mh != ih)
        return gp_error_set(GP_ERR_DATA, "%s: mask of %d x %d pixels for an image of %d x %d "
                            "(%s/%s)", path, mw, mh, iw, ih, f->dir, ff->rel);
    GP_TRY(gp_image_decode(w->codec, w->buf, len, path, 1, 1, &w->mask));
    gp_image_resample_nearest(w->mask.px, mw, mh, 1, &box, w->mout, ow, oh);
    /* binary: any value but 0 is 1, except in a JPEG mask, whose lossy
     * compression leaves faint values around every edge: there 1 is 128
     * or more (a 0/255 mask's half-way) */
    int one = gp_image_is_jpeg(w->buf, len) ? 128 : 1;
    for (int yy = 0; yy < oh; yy++)
        for (int xx = 0; xx < ow; xx++) {
            uint8_t v = w->mout[(size_t)yy * (size_t)ow + (size_t)xx];
            float t = f->masks_binary ? (v >= one) : (float)v;
            y[(int64_t)yy * ow + (flip ? ow - 1 - xx : xx)] = t;
        }
    return GP_OK;
}
