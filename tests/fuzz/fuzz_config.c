/* fuzz_config.c — the YAML config loader (libyaml -> node tree -> the
 * validated walk).  An input with a NUL byte is YAML before it and one
 * --set override after it, so overrides are fuzzed too; a config that
 * loads is written back with its override (gp_config_text_applied) and
 * must load again.  Then the model's shapes (every layer inferred, its
 * parameters counted, nothing allocated) and the --dry-run's balance by
 * FLOPs: sizes whose products overflow and balances that wrap must be
 * errors with messages, not crashes. */
#include "fuzz_util.h"
#include "config/config.h"
#include "train/train.h"

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
        int64_t np = 0;
        if (gp_model_count_params(&cfg, &np) != GP_OK && !gp_last_error()[0]) abort();
        int stages = cfg.pipeline.n_devices * (cfg.pipeline.virtual_stages > 1
                                                   ? cfg.pipeline.virtual_stages : 1);
        int bal[GP_MAX_DEVICES];
        /* a given balance is checked (gp_model_balance); auto, split by FLOPs */
        if (stages > 1 && stages <= GP_MAX_DEVICES && np > 0 &&
            (cfg.pipeline.n_balance > 0 ? gp_model_balance(&cfg, stages, bal, true)
                                        : gp_model_balance_flops(&cfg, stages, bal)) != GP_OK &&
            !gp_last_error()[0])
            abort();
        gp_config_free(&cfg);
    } else if (!gp_last_error()[0]) {
        abort(); /* every error has a message */
    }
    free(ov);
    return 0;
}
