/*
 * replay_main.c — main() for a fuzz target outside libFuzzer: feed every
 * file of the given directories (or files) through LLVMFuzzerTestOneInput
 * once.  ctest runs it over the committed corpus (tests/fuzz/<target>/,
 * seeds plus every crash input found so far), in the normal build and
 * under ASan/UBSan in CI.
 */
#include "fuzz_util.h"

#include <dirent.h>
#include <sys/stat.h>

static int replay_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", path);
        return 1;
    }
    size_t cap = 1 << 16, n = 0;
    uint8_t *b = malloc(cap);
    for (;;) {
        if (n == cap) b = realloc(b, cap *= 2);
        size_t r = fread(b + n, 1, cap - n, f);
        if (r == 0) break;
        n += r;
    }
    fclose(f);
    /* an exact-size copy, so ASan sees reads past the end */
    uint8_t *d = malloc(n ? n : 1);
    memcpy(d, b, n);
    free(b);
    LLVMFuzzerTestOneInput(d, n);
    free(d);
    return 0;
}

int main(int argc, char **argv)
{
    int files = 0, bad = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            fprintf(stderr, "cannot open %s\n", argv[i]);
            return 1;
        }
        if (!S_ISDIR(st.st_mode)) {
            bad += replay_file(argv[i]);
            files++;
            continue;
        }
        DIR *d = opendir(argv[i]);
        struct dirent *e;
        while (d && (e = readdir(d))) {
            if (e->d_name[0] == '.') continue;
            char p[4096];
            snprintf(p, sizeof p, "%s/%s", argv[i], e->d_name);
            bad += replay_file(p);
            files++;
        }
        if (d) closedir(d);
    }
    printf("%s: %d inputs replayed, %d unreadable\n", argv[0], files, bad);
    return bad || files == 0;
}
