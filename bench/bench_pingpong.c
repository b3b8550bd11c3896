/* bench_pingpong: how far apart two CPUs are, as a thread pool's signals
 * see it: one cache line passed back and forth between a thread on each.
 *
 *     bench/bench_pingpong [MS]
 *
 * Two threads, pinned to the first two CPUs of the process's affinity mask,
 * take turns writing one 64-byte line for about MS milliseconds (default
 * 30) in batches of 1000 round trips; prints one JSON line
 *
 *     {"cpus": [A, B], "round_trip_ns": median, "min_ns": ..., "max_ns": ...,
 *      "batches": N}
 *
 * (the batches' ns per round trip).  bench_threads.py runs it beside each
 * 2-thread child: on the 2-vCPU VM the host moves the vCPUs, and where it
 * put them decides what a 10-microsecond forward can gain from a second
 * thread (a round trip of about 100 ns or of about 440 ns, from one minute
 * to the next).  Exit 77 where there are not two CPUs to pin to. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define TRIPS 1000
#define MAX_BATCHES 100000

static _Alignas(64) _Atomic long ball;
static _Atomic int stop;
static int cpu_of[2];

static void pin(int cpu)
{
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* returns every odd value as the next even one, until told to stop */
static void *partner(void *arg)
{
    (void)arg;
    pin(cpu_of[1]);
    for (long want = 1;; want += 2) {
        while (atomic_load_explicit(&ball, memory_order_acquire) != want)
            if (atomic_load_explicit(&stop, memory_order_relaxed))
                return NULL;
        atomic_store_explicit(&ball, want + 1, memory_order_release);
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    double ms = argc > 1 ? atof(argv[1]) : 30.0;
    if (argc > 2 || !(ms > 0 && ms <= 60000)) {
        fprintf(stderr, "usage: bench_pingpong [MS]  (0 < MS <= 60000)\n");
        return 2;
    }
    cpu_set_t mask;
    int found = 0;
    if (sched_getaffinity(0, sizeof mask, &mask) == 0)
        for (int c = 0; c < CPU_SETSIZE && found < 2; c++)
            if (CPU_ISSET(c, &mask))
                cpu_of[found++] = c;
    if (found < 2) {
        fprintf(stderr, "bench_pingpong: fewer than two CPUs to run on\n");
        return 77;
    }
    static double per[MAX_BATCHES];
    pin(cpu_of[0]);
    pthread_t th;
    if (pthread_create(&th, NULL, partner, NULL)) {
        fprintf(stderr, "bench_pingpong: cannot start a thread\n");
        return 1;
    }
    long next = 1;
    int n = 0;
    double start = now_ns(), end = start + ms * 1e6;
    while (n < MAX_BATCHES) {
        double t0 = now_ns();
        for (int i = 0; i < TRIPS; i++, next += 2) {
            atomic_store_explicit(&ball, next, memory_order_release);
            while (atomic_load_explicit(&ball, memory_order_acquire) != next + 1)
                ;
        }
        double t1 = now_ns();
        per[n++] = (t1 - t0) / TRIPS;
        if (t1 >= end)
            break;
    }
    atomic_store(&stop, 1);
    pthread_join(th, NULL);
    qsort(per, (size_t)n, sizeof *per, cmp_double);
    printf("{\"cpus\": [%d, %d], \"round_trip_ns\": %.1f, \"min_ns\": %.1f, \"max_ns\": %.1f, "
           "\"batches\": %d}\n",
           cpu_of[0], cpu_of[1], n % 2 ? per[n / 2] : (per[n / 2 - 1] + per[n / 2]) / 2, per[0],
           per[n - 1], n);
    return 0;
}
