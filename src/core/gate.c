/*
 * gate.c — gp_gate (core.h): a closed/open flag with a mutex and a
 * condition variable, so that the waits it orders are pthreads' own and
 * ThreadSanitizer sees them.
 */
#include "core/core.h"

#include <stdlib.h>

struct gp_gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool closed;
};

gp_gate *gp_gate_new(void)
{
    gp_gate *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    return g;
}

void gp_gate_free(gp_gate *g)
{
    if (!g) return;
    gp_gate_wait(g);
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

void gp_gate_close(gp_gate *g)
{
    pthread_mutex_lock(&g->mu);
    g->closed = true;
    pthread_mutex_unlock(&g->mu);
}

void gp_gate_open(gp_gate *g)
{
    pthread_mutex_lock(&g->mu);
    g->closed = false;
    pthread_cond_broadcast(&g->cv); /* (under the mutex: see core.h) */
    pthread_mutex_unlock(&g->mu);
}

bool gp_gate_wait(gp_gate *g)
{
    if (!g) return false;
    pthread_mutex_lock(&g->mu);
    bool was = g->closed;
    while (g->closed) pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
    return was;
}
