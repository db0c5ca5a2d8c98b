/*
 * bench_procs — the cost of one activation crossing between two processes
 * (issue 17): `mpirun -np 2 build/bench_procs [KiB ...]` ping-pongs a
 * tensor of each size (default 64 KiB, then 4 KiB and 1 MiB) between rank
 * 0 and rank 1 through gpipe's transport (procs.h: MPI_Isend + wait on one
 * side, MPI_Probe + MPI_Recv on the other, as the executor does), and
 * prints the median one-way time beside what the same bytes cost as the
 * in-process copy between two CPU devices (a memcpy into a fresh buffer).
 * Rank 0 prints a markdown table with the processor.  Run without mpirun
 * it says how to start it.  Benchmarks print; they never fail a build.
 */
#include "pipeline/procs.h"

#include "bench_util.h"
#include <stdlib.h>
#include <string.h>

enum { REPS = 2001 };

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    if (gp_procs_init() != GP_OK || gp_procs_size() != 2) {
        fprintf(stderr, "bench_procs: start it as mpirun -np 2 bench_procs [KiB ...]%s%s\n",
                gp_procs_size() != 2 ? "" : ": ", gp_procs_size() != 2 ? "" : gp_last_error());
        gp_procs_finalize();
        return 2;
    }
    int rank = gp_procs_rank();
    int sizes[16], ns = 0;
    for (int i = 1; i < argc && ns < 16; i++) sizes[ns++] = atoi(argv[i]);
    if (!ns) {
        sizes[ns++] = 64;
        sizes[ns++] = 4;
        sizes[ns++] = 1024;
    }
    static double rt[REPS], cp[REPS];
    if (rank == 0) {
        char cpu[256];
        gp_bench_cpu_name(cpu, sizeof cpu);
        printf("%s; 2 processes on one machine; median of %d\n\n", cpu, REPS);
        printf("| tensor | one-way, 2 processes | in-process copy | difference |\n"
               "|---|---|---|---|\n");
    }
    for (int q = 0; q < ns; q++) {
        int64_t n = (int64_t)sizes[q] * 1024 / 4;
        float *a = malloc((size_t)n * sizeof *a), *b = malloc((size_t)n * sizeof *b);
        for (int64_t k = 0; k < n; k++) a[k] = (float)k;
        for (int r = 0; r < REPS; r++) {
            double t0 = gp_now();
            gp_procs_req req;
            if (rank == 0) { /* ping, then wait for the pong */
                gp_procs_isend(a, n, 1, r, &req);
                gp_procs_wait(&req);
                gp_procs_probe(1, r);
                gp_procs_recv(b, n, 1, r);
            } else {
                gp_procs_probe(0, r);
                gp_procs_recv(b, n, 0, r);
                gp_procs_isend(b, n, 0, r, &req);
                gp_procs_wait(&req);
            }
            rt[r] = (gp_now() - t0) / 2;
            /* the in-process path: a fresh buffer and a copy */
            double t1 = gp_now();
            float *c = malloc((size_t)n * sizeof *c);
            memcpy(c, a, (size_t)n * sizeof *c);
            cp[r] = gp_now() - t1;
            if (c[n - 1] != a[n - 1]) abort();
            free(c);
        }
        qsort(rt, REPS, sizeof *rt, cmp_d);
        qsort(cp, REPS, sizeof *cp, cmp_d);
        if (rank == 0)
            printf("| %d KiB | %.1f us | %.1f us | +%.1f us |\n", sizes[q], rt[REPS / 2] * 1e6,
                   cp[REPS / 2] * 1e6, (rt[REPS / 2] - cp[REPS / 2]) * 1e6);
        free(a);
        free(b);
    }
    gp_procs_finalize();
    return 0;
}
