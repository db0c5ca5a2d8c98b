/*
 * test_config_keys.c — the keys' table (src/config/config_keys.c) is what
 * the parser does.  Every typed getter checks its call against the table's
 * row and aborts where they differ (a default, a range, a type, enum names,
 * or a key with no row), so this test parses what reaches every getter:
 * every config in configs/ and bench/, each layer type bare, each built-in
 * model with its defaults and with its maps given, the optimizers,
 * schedules, snapshots, devices as maps and the image folder's keys.  An
 * abort fails it.  Then: every option a layer type takes has its row and
 * every layer-option row a type that takes it; the table's keys are unique
 * and each sits under a section that is a row; and, in a child process, the
 * check itself aborts on a drifted default, range and a missing row.
 * (tests/test_config_doc.py holds docs/config.md to the table.)
 */
#include "config/config_impl.h"
#include "test.h"

#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

/* Parses text (whatever the outcome: a getter's check aborts, an error
 * does not); whether it loaded. */
static bool parse(const char *text, const char *const *sets, int n)
{
    gp_config c;
    gp_status s = gp_config_parse("keys.yaml", text, strlen(text), sets, n, &c);
    if (s == GP_OK) gp_config_free(&c);
    return s == GP_OK;
}

static void test_shipped_configs(void)
{
    const char *dirs[] = {GPIPE_SOURCE_DIR "/configs", GPIPE_SOURCE_DIR "/bench"};
    int loaded = 0;
    for (int d = 0; d < 2; d++) {
        DIR *dir = opendir(dirs[d]);
        CHECK_MSG(dir != NULL, "%s", dirs[d]);
        if (!dir) continue;
        struct dirent *e;
        while ((e = readdir(dir))) {
            size_t n = strlen(e->d_name);
            if (n < 6 || strcmp(e->d_name + n - 5, ".yaml")) continue;
            char path[1024];
            snprintf(path, sizeof path, "%s/%s", dirs[d], e->d_name);
            gp_config c;
            gp_status s = gp_config_load(path, NULL, 0, &c);
            CHECK_MSG(s == GP_OK, "%s: %s", path, gp_last_error());
            if (s == GP_OK) gp_config_free(&c), loaded++;
        }
        closedir(dir);
    }
    CHECK_MSG(loaded >= 10, "%d configs loaded", loaded);
}

/* Each layer type bare, as the one layer of a model: every option getter
 * of its type runs with its default (a type that needs an option fails to
 * load, after its getters ran). */
static void test_layer_types(void)
{
    for (int t = 0; t < GP_LAYER_TYPE_COUNT; t++) {
        char text[256];
        snprintf(text, sizeof text, "model: {input: [4, 8, 8], layers: [%s]}\n",
                 gp_layer_type_name((gp_layer_type)t));
        parse(text, NULL, 0);
        const char *keys[16];
        int nk = gp_cfg_layer_keys((gp_layer_type)t, keys);
        for (int i = 0; i < nk; i++) {
            char row[96];
            snprintf(row, sizeof row, "model.layers.#.%s", keys[i]);
            CHECK_MSG(gp_cfg_key_find(row) != NULL, "%s takes %s, which has no row",
                      gp_layer_type_name((gp_layer_type)t), keys[i]);
        }
    }
    CHECK(parse("model: {input: [3, 8, 8], layers: [{conv2d: {out: 4, kernel: 3}}, "
                "{maxpool2d: {kernel: 2}}, {avgpool2d: {kernel: [2, 2], stride: 2}}, flatten, "
                "{linear: {out: 2}}]}\n", NULL, 0));
    CHECK(parse("model: {input: [8], layers: [{embedding: {vocab: 16, dim: 8, positions: 8}}, "
                "{linear: {out: 24}}, {rope: {heads: 2, scaling: llama3}}, "
                "{attention: {heads: 2}}, {linear: {out: 16}}]}\n", NULL, 0));
    /* every layer-option row is taken by some type */
    int n;
    const gp_cfg_key *k = gp_cfg_keys(&n);
    for (int i = 0; i < n; i++) {
        if (strncmp(k[i].key, "model.layers.#.", 15)) continue;
        bool taken = false;
        for (int t = 0; t < GP_LAYER_TYPE_COUNT && !taken; t++) {
            const char *keys[16];
            int nk = gp_cfg_layer_keys((gp_layer_type)t, keys);
            for (int j = 0; j < nk; j++) taken = taken || !strcmp(keys[j], k[i].key + 15);
        }
        CHECK_MSG(taken, "%s: no layer type takes it", k[i].key);
    }
}

static void test_sections(void)
{
    const char *mlp = "model: {input: [4], layers: [flatten, {linear: {out: 2}}]}\n";
    char text[2048];
    const char *bodies[] = {
        "model: {input: [3, 32, 32], resnet: {}}\n",
        "model: {input: [3, 32, 32], amoebanet: {layers: 3, filters: 16, classes: 10}}\n",
        "model: {input: [3, 64, 64], unet: {depth: 2, num_convs: 1, base: 4}}\n",
        "model: {input: [16], gpt: {layers: 1, heads: 2, width: 16, vocab: 32}}\n",
        "model: {input: [16], llama: {layers: 1, heads: 2, width: 16, intermediate: 32, "
        "vocab: 32, rope_scaling: {}}}\n",
        "model: {input: [16], llama: {layers: 1, heads: 2, width: 16, intermediate: 32, "
        "vocab: 32}}\n",
    };
    for (int i = 0; i < GP_COUNT(bodies); i++) CHECK_MSG(parse(bodies[i], NULL, 0), "%s: %s",
                                                         bodies[i], gp_last_error());
    snprintf(text, sizeof text, "%s"
             "pipeline: {devices: [{name: cpu:0, memory: 1GiB, threads: 1}, cpu:1], chunks: 2,"
             " schedule: 1f1b, memory: 2GiB}\n"
             "data: {dataset: synthetic, augment: {crop_padding: 1, random_resized_crop: "
             "{scale: [0.5, 1]}}, synthetic: {train: 8, test: 8, classes: 2}}\n"
             "train: {batch_size: 4, optimizer: {type: adamw, betas: [0.9, 0.95]}, "
             "schedule: {type: step}, snapshot: {every_steps: 1}}\n", mlp);
    CHECK_MSG(parse(text, NULL, 0), "%s", gp_last_error());
    snprintf(text, sizeof text, "%sdata: {dataset: image_folder, path: /nonexistent}\n"
             "train: {optimizer: sgd, schedule: cosine, lr_scaling: linear}\n", mlp);
    parse(text, NULL, 0);
    const char *sets[] = {"pipeline.devices=[[cpu:0], [cpu:1]]",
                          "data.augment.random_resized_crop=false"};
    snprintf(text, sizeof text, "%sdata: {dataset: synthetic}\n", mlp);
    CHECK_MSG(parse(text, sets, 2), "%s", gp_last_error());
}

/* The table's own shape: unique keys, each under a row of its section,
 * enums with their names. */
static void test_table(void)
{
    int n;
    const gp_cfg_key *k = gp_cfg_keys(&n);
    CHECK(n > 100);
    for (int i = 0; i < n; i++) {
        bool twice = false;
        for (int j = 0; j < i; j++) twice = twice || !strcmp(k[i].key, k[j].key);
        CHECK_MSG(!twice, "%s twice", k[i].key);
        CHECK_MSG(k[i].meaning && k[i].meaning[0], "%s has no meaning", k[i].key);
        CHECK_MSG(k[i].type != GP_CFG_ENUM || (k[i].form && k[i].def), "%s", k[i].key);
        CHECK_MSG(k[i].type != GP_CFG_OTHER || k[i].form, "%s", k[i].key);
        const char *dot = strrchr(k[i].key, '.');
        if (!dot) continue;
        char parent[128];
        snprintf(parent, sizeof parent, "%.*s", (int)(dot - k[i].key), k[i].key);
        if (parent[strlen(parent) - 1] == '#') parent[strlen(parent) - 2] = '\0';
        CHECK_MSG(gp_cfg_key_find(parent) != NULL, "%s: no row %s", k[i].key, parent);
    }
}

/* The check itself: each call aborts (a child process each). */
static bool aborts(int which)
{
    pid_t pid = fork();
    if (pid == 0) {
        fclose(stderr); /* (its message is expected) */
        if (which == 0) /* train.steps's default is 0 */
            gp_cfg_key_agrees("train.steps", GP_CFG_INT, 5, NULL, 0, 9223372036854775807.0, 0,
                              NULL, 0);
        if (which == 1) /* its range starts at 0 */
            gp_cfg_key_agrees("train.steps", GP_CFG_INT, 0, NULL, 1, 9223372036854775807.0, 0,
                              NULL, 0);
        if (which == 2) gp_cfg_key_agrees("train.no_such_key", GP_CFG_BOOL, 0, "false", 0, 0, 0,
                                          NULL, 0);
        if (which == 3) {
            const char *names[] = {"sgd", "adam"};
            gp_cfg_key_agrees("train.optimizer.type", GP_CFG_ENUM, 0, "sgd", 0, 0, 0, names, 2);
        }
        if (which == 4) /* momentum's 0.9 as a float is not 0.8 */
            gp_cfg_key_agrees("train.optimizer.momentum", GP_CFG_NUM, 0.8, NULL, 0, 1,
                              GP_CFG_HI_OPEN, NULL, 0);
        if (which == 5) /* the agreeing call, which must not abort */
            gp_cfg_key_agrees("model.layers.12.momentum", GP_CFG_NUM, 0.1f, NULL, 0, 1, 0, NULL,
                              0);
        _exit(0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT;
}

static void test_check_fails(void)
{
    for (int i = 0; i < 5; i++) CHECK_MSG(aborts(i), "drift %d was not caught", i);
    CHECK_MSG(!aborts(5), "an agreeing call aborted");
}

int main(void)
{
    gp_log_set_level(GP_LOG_ERROR);
    test_table();
    test_shipped_configs();
    test_layer_types();
    test_sections();
    test_check_fails();
    return gpt_finish("test_config_keys");
}
