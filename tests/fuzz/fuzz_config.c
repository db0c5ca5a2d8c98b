/* fuzz_config.c — the YAML config loader (libyaml -> node tree -> the
 * validated walk).  An input with a NUL byte is YAML before it and one
 * --set override after it, so overrides are fuzzed too; a config that
 * loads is written back with its override (gp_config_text_applied) and
 * must load again. */
#include "fuzz_util.h"
#include "config/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    gp_log_set_level(GP_LOG_QUIET);
    const uint8_t *nul = memchr(data, 0, size);
    size_t len = nul ? (size_t)(nul - data) : size;
    char *ov = NULL;
    if (nul) {
        size_t k = size - len - 1;
        ov = malloc(k + 1);
        if (!ov) return 0;
        memcpy(ov, nul + 1, k);
        ov[k] = '\0';
    }
    const char *sets[1] = {ov};
    gp_config cfg;
    if (gp_config_parse("fuzz.yaml", (const char *)data, len, sets, ov ? 1 : 0, &cfg) == GP_OK) {
        /* written back with its override (gpipe-balance --write), it loads */
        char *t = NULL;
        gp_config w;
        if (gp_config_text_applied(&cfg, NULL, &t) != GP_OK ||
            gp_config_parse("written.yaml", t, strlen(t), NULL, 0, &w) != GP_OK)
            abort();
        gp_config_free(&w);
        free(t);
        gp_config_free(&cfg);
    } else if (!gp_last_error()[0]) {
        abort(); /* every error has a message */
    }
    free(ov);
    return 0;
}
