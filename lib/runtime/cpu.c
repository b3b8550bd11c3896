/* runtime/cpu.c - the CPU reference backend ("cpu"): float32, host memory.
 *
 * Matrix products go to the packed SGEMM of runtime/cpu_gemm.c where the CPU
 * runs one of its kernels (AVX-512, AVX2+FMA), each weight packed once at
 * its first use; else to OpenBLAS's cblas_sgemm when the library can be
 * loaded (dlopen at backend open, so commands that never run a model do not
 * pay for loading it; it is loaded with the packed SGEMM too, for its
 * thread count), else to the plain-C loops below.
 *
 * Accumulation order of the plain-C path (documented in ckpt-verify(1)):
 * every output element of linear and conv2d is a float32 sum over the
 * reduction index in ascending order (input feature; input channel, kernel
 * row, kernel column), starting from 0, with the bias added last;
 * conv_transpose2d sums the products over input channels in ascending
 * order, then the kernel taps that reach each output pixel in ascending
 * (row, column) order, then adds the bias.
 * softmax sums exp(x - max) in ascending order in float32, l2norm the squares
 * over channels in ascending order, adaptive_avg_pool2d each bin row by row
 * (then divides by its size); batch_norm is x * scale + shift per channel,
 * as torch's CPU kernel.  The packed SGEMM's order is cpu_gemm.h's; with
 * OpenBLAS the products are summed in OpenBLAS's blocked order.
 *
 * The transformer ops: reduce sums each output in double and rounds once
 * (the mean after its division), in ascending order, or over the last dim
 * in eight interleaved running sums added pairwise (row_sum), as
 * layer_norm and rms_norm take a row's sums, rounding each output once;
 * matmul's products go where linear's go; attention's two products per
 * head go to the packed SGEMM, else to the plain loops (never to
 * OpenBLAS), its softmax sums as softmax does; exp, tanh, silu, both GELUs
 * and attention's softmax take exp_vec's exponential (below), which
 * vectorizes.
 */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3") /* the plain-C loops rely on vectorization */
#endif
#include "core/core.h"
#include "runtime/backends.h"
#include "runtime/cpu_gemm.h"

#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The wheel's manylinux tag follows the newest glibc symbol version its
 * libraries need: glibc 2.29 gave pow a new version (the same results,
 * without SVID's error handling), which alone would lift the wheel from
 * manylinux_2_28 to manylinux_2_31.  Bind x86-64's first version. */
#if defined(__GLIBC__) && defined(__x86_64__)
__asm__(".symver pow,pow@GLIBC_2.2.5");
#endif

/* cblas_sgemm's enums, as every CBLAS defines them */
enum { CBLAS_ROW_MAJOR = 101, CBLAS_NO_TRANS = 111, CBLAS_TRANS = 112 };
typedef void (*sgemm_fn)(int order, int ta, int tb, int m, int n, int k, float alpha,
                         const float *a, int lda, const float *b, int ldb, float beta, float *c,
                         int ldc);

#define WT_CACHE 64
#define POOL_SLOTS 64
#define POOL_MAX_BYTES ((size_t)1536 << 20)
#define MAX_THREADS 16
/* The least values a thread's chunk takes (a simple pass over them): waking
 * a worker costs tens of microseconds, more on a busy machine */
#define PAR_GRAIN 32768

/*
 * Every op, not only the matrix products, runs on as many threads as
 * OpenBLAS's products do: at batch 1 the loops around the products were a
 * quarter of ResNet-50's time on 2 threads while single-threaded, and any
 * op left on one thread caps what more cores give.  A job is [0, n) cut
 * into chunks; the caller takes chunks too, and a worker that wakes late
 * finds none left, so a busy machine costs little waiting.  Every output element is
 * computed by the same code whichever thread runs its chunk: results do not
 * depend on the thread count.  With the own SGEMM (the products are jobs
 * too) a worker looks for the next job for a moment before it sleeps; with
 * OpenBLAS it sleeps at once: OpenBLAS's threads need the cores then.
 */
typedef void (*par_fn)(void *arg, int64_t lo, int64_t hi);

/* A group's next chunk, (job number << 32) | chunk: a claim for an older
 * job fails.  One cache line each: the threads claim from their own. */
typedef struct chunk_counter {
    _Alignas(64) _Atomic uint64_t next;
} chunk_counter;

/* The running thread's number in its backend's pool (0: the caller) */
static _Thread_local int thread_self;

struct cpu_threads;
typedef struct worker_arg {
    struct cpu_threads *t;
    int self; /* 1.. (the caller is 0) */
} worker_arg;

/* Whether a slot is taken: a cache line each, so that a thread taking
 * and giving back its own slot writes a line no other core reads (one
 * word for all slots moved between the cores at every chunk: a twentieth
 * of the MNIST MLP's forward on 2 threads) */
typedef struct slot_flag {
    _Alignas(64) _Atomic unsigned taken;
} slot_flag;

typedef struct cpu_threads {
    int n;                  /* threads, the caller included; 1: no workers */
    int inited;             /* mu and cv made */
    int started;            /* workers running */
    pthread_t th[MAX_THREADS];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int quit;
    /* The job, written under mu and inside a sequence lock (seq odd while
     * it is written): a spinning worker reads it without taking mu.  On 16
     * cores, 15 workers taking mu for every job queued up on it, and the
     * caller behind them for the next job: the MNIST MLP's forward at batch
     * 256 took 0.74 ms on 16 threads against 0.32 ms on 2.  One cache line
     * with pub: a spinning worker that sees pub has the job with it */
    _Alignas(64) _Atomic unsigned gen; /* job number, written under mu */
    /* gen again, written once mu is released: a spinning worker that saw
     * gen while the caller still held mu would sleep on the mutex */
    _Atomic unsigned pub;
    _Atomic unsigned seq;
    int spin; /* look for the next job before sleeping */
    _Atomic(par_fn) fn;
    void *_Atomic arg;
    _Atomic int64_t n_items, nchunks;
    _Alignas(64) worker_arg wa[MAX_THREADS];
    /* A job's chunks cut into as many contiguous groups as threads, group
     * i first taken by thread i, then by any thread that has finished its
     * own: consecutive ops give a thread the same part of the batch (what
     * it wrote stays in its core's cache: on 2 cores, thread-hopping data
     * made the autoencoder's loops several times slower), while a thread
     * that is slow or descheduled has its chunks taken by the others.  A
     * counter of an earlier job stands for its group's first chunk (the
     * caller does not write them: each stays in its thread's cache) */
    chunk_counter grp[MAX_THREADS];
    _Alignas(64) _Atomic int64_t done; /* chunks finished */
} cpu_threads;

/* A weight packed for the own kernel: W's buffer, which side and how it
 * was read (element (r, p) at w[r * rs + p * cs]). */
typedef struct packed_weight {
    const float *w;
    int side;
    int64_t rows, depth, rs, cs;
    float *p;
} packed_weight;

typedef struct cpu_impl {
    void *blas;           /* dlopen handle */
    int blas_shared;      /* OpenBLAS was loaded before the backend */
    sgemm_fn sgemm;
    /* the own packed SGEMM (runtime/cpu_gemm.c), used before OpenBLAS */
    const cpu_gemm_kernel *gk;
    packed_weight *packs; /* weights packed at first use, until released */
    size_t npacks, packs_cap;
    /* the ranges whose last write was upload() (parameters, constants,
     * inputs), until released or uploaded to again: matmul keeps a packed
     * copy of an operand inside one, as linear does of its weight */
    struct upload_range {
        const float *p;
        size_t n;
    } *ups;
    size_t nups, ups_cap;
    /* a scratch buffer per running task (slot s taken: gbusy[s].taken) */
    float *gscratch[MAX_THREADS];
    slot_flag gbusy[MAX_THREADS];
    /* per slot too: a whole image's packed B, when images run side by side */
    float *cbuf[MAX_THREADS];
    size_t cbuf_n[MAX_THREADS];
    /* per slot: a small batch's A, packed once per chunk (gemm_part) */
    float *abuf[MAX_THREADS];
    size_t abuf_n[MAX_THREADS];
    cpu_threads thr;
    /* 0, or (tests) every loop cut into chunks of this many items and every
     * product shared, so that small inputs take the paths big ones do */
    int64_t grain;
    /* linear's weights transposed for the plain-C loop, by weight buffer */
    struct {
        const float *w;
        int64_t in, out;
        float *wt;
    } wt[WT_CACHE];
    size_t wt_next;
    /* released buffers kept for the next run (same sizes every forward):
     * fresh pages cost more than the small layers' arithmetic */
    struct {
        float *p;
        size_t n;
    } pool[POOL_SLOTS];
    size_t pool_bytes;
    /* im2col / col2im columns, kept between calls: the big layers' buffers
     * (hundreds of MB for SSD300) cost more in page faults than in work */
    float *cols;
    size_t cols_n;
    /* a product's unpacked operands, packed once for all its tasks (by
     * side: matmul's may both be) */
    float *opack[2];
    size_t opack_n[2];
    /* the depth blocks' sums of a product cut along its depth */
    float *kparts;
    size_t kparts_n;
    /* the last product's job as the workers read it (job_kept) */
    _Alignas(64) unsigned char kept[256];
} cpu_impl;

static void buf_free(float *p);
static int cpu_relu(ckpt_backend *b, const float *x, float *y, size_t n);
static void par_for(cpu_impl *c, int64_t n, int64_t grain, par_fn fn, void *arg);
static void par_chunks(cpu_impl *c, int64_t n, int64_t nchunks, par_fn fn, void *arg);

/* relu and sigmoid of one value, for their ops and for the ops that end
 * with them (the same bits) */
static inline float relu1(float v)
{
    return v < 0.0f ? 0.0f : v; /* as torch: NaN and -0.0 pass through */
}

static inline float sigmoid1(float v)
{
    return 1.0f / (1.0f + expf(-v));
}

static int nomem(ckpt_backend *b)
{
    return ckpt_backend_fail(b, CKPT_ERR_NOMEM, "out of memory");
}

/* Takes the chunks of job GEN while any is left; chunk K is
 * [n * k / nchunks, n * (k + 1) / nchunks). */
static void run_chunks(cpu_threads *t, int self, unsigned gen, par_fn fn, void *arg, int64_t n,
                       int64_t nchunks)
{
    int ng = t->n;
    int64_t ran = 0;
    for (int d = 0; d < ng; d++) {
        int g = (self + d) % ng; /* its own group first */
        int64_t end = nchunks * (g + 1) / ng;
        for (;;) {
            uint64_t v = atomic_load(&t->grp[g].next);
            unsigned vg = (unsigned)(v >> 32);
            /* (a later job's: this thread is late, its chunks were taken) */
            if (vg != gen && (int)(vg - gen) > 0)
                break;
            int64_t k = vg == gen ? (int64_t)(v & 0xffffffffu) : nchunks * g / ng;
            if (k >= end)
                break;
            if (!atomic_compare_exchange_weak(&t->grp[g].next, &v,
                                              (uint64_t)gen << 32 | (uint64_t)(k + 1)))
                continue;
            fn(arg, n * k / nchunks, n * (k + 1) / nchunks);
            ran++;
        }
    }
    /* (counted once: done's line went between the cores after every chunk) */
    if (ran)
        atomic_fetch_add(&t->done, ran);
}

/* Jobs come back to back while a model runs (a product, the pass after
 * it, the next layer's im2col): a worker looks for the next one for up to
 * SPIN_NS before it sleeps, a wake-up costing tens of microseconds. */
#define SPIN_NS 100000
#define WAIT_NS 20000

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void spin_for_job(cpu_threads *t, unsigned seen)
{
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    /* (pub may still be one behind the job this worker took under mu) */
    for (unsigned i = 1; (int)(atomic_load_explicit(&t->pub, memory_order_acquire) - seen) <= 0;
         i++) {
        cpu_relax();
        if (i % 64 == 0) {
            clock_gettime(CLOCK_MONOTONIC, &now);
            if ((now.tv_sec - t0.tv_sec) * 1000000000L + (now.tv_nsec - t0.tv_nsec) > SPIN_NS)
                return;
        }
    }
}

/* The job as published, read without mu: 1 when the copy is whole (the
 * sequence was even and the same before and after), else 0 (the caller is
 * writing the next one: take mu). */
static int job_read(cpu_threads *t, unsigned *gen, par_fn *fn, void **arg, int64_t *n,
                    int64_t *nchunks)
{
    unsigned s1 = atomic_load_explicit(&t->seq, memory_order_acquire);
    if (s1 & 1)
        return 0;
    *gen = atomic_load_explicit(&t->gen, memory_order_relaxed);
    *fn = atomic_load_explicit(&t->fn, memory_order_relaxed);
    *arg = atomic_load_explicit(&t->arg, memory_order_relaxed);
    *n = atomic_load_explicit(&t->n_items, memory_order_relaxed);
    *nchunks = atomic_load_explicit(&t->nchunks, memory_order_relaxed);
    atomic_thread_fence(memory_order_acquire);
    return atomic_load_explicit(&t->seq, memory_order_relaxed) == s1;
}

static void *worker_main(void *p)
{
    const worker_arg *w = p;
    cpu_threads *t = w->t;
    unsigned seen = 0, gen;
    par_fn fn;
    void *arg;
    int64_t n, nchunks;
    thread_self = w->self;
    for (;;) {
        if (t->spin) {
            spin_for_job(t, seen);
            if (job_read(t, &gen, &fn, &arg, &n, &nchunks) && gen != seen) {
                seen = gen; /* a stale job's chunks are gone: run_chunks takes none */
                run_chunks(t, w->self, seen, fn, arg, n, nchunks);
                continue;
            }
        }
        pthread_mutex_lock(&t->mu);
        while (atomic_load_explicit(&t->gen, memory_order_relaxed) == seen && !t->quit)
            pthread_cond_wait(&t->cv, &t->mu);
        if (t->quit) {
            pthread_mutex_unlock(&t->mu);
            break;
        }
        seen = atomic_load_explicit(&t->gen, memory_order_relaxed);
        fn = atomic_load_explicit(&t->fn, memory_order_relaxed);
        arg = atomic_load_explicit(&t->arg, memory_order_relaxed);
        n = atomic_load_explicit(&t->n_items, memory_order_relaxed);
        nchunks = atomic_load_explicit(&t->nchunks, memory_order_relaxed);
        pthread_mutex_unlock(&t->mu);
        run_chunks(t, w->self, seen, fn, arg, n, nchunks);
    }
    return NULL;
}

static void threads_init(cpu_threads *t, int n)
{
    t->n = n < 1 ? 1 : n > MAX_THREADS ? MAX_THREADS : n;
    if (t->n > 1 && pthread_mutex_init(&t->mu, NULL))
        t->n = 1;
    else if (t->n > 1 && pthread_cond_init(&t->cv, NULL)) {
        pthread_mutex_destroy(&t->mu);
        t->n = 1;
    }
    t->inited = t->n > 1;
}

/* The workers, at the first job (a backend that runs nothing starts none);
 * any that cannot be started leave their share to the others. */
static void threads_start(cpu_threads *t)
{
    int k = 0;
    for (; k < t->n - 1; k++) {
        t->wa[k] = (worker_arg){.t = t, .self = k + 1};
        if (pthread_create(&t->th[k], NULL, worker_main, &t->wa[k]))
            break;
    }
    t->started = k;
    t->n = k + 1;
}

static void threads_stop(cpu_threads *t)
{
    if (!t->inited)
        return;
    pthread_mutex_lock(&t->mu);
    t->quit = 1;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
    for (int k = 0; k < t->started; k++)
        pthread_join(t->th[k], NULL);
    pthread_cond_destroy(&t->cv);
    pthread_mutex_destroy(&t->mu);
}

/* fn(arg, lo, hi) over [0, N) in chunks of GRAIN items or more, on the
 * backend's threads; returns when all are done. */
static void par_for(cpu_impl *c, int64_t n, int64_t grain, par_fn fn, void *arg)
{
    cpu_threads *t = &c->thr;
    if (n <= 0)
        return;
    /* a spinning worker takes a job within a microsecond, not tens of
     * them: chunks of a quarter of the grain pay */
    if (t->spin)
        grain = (grain + 3) / 4;
    if (c->grain)
        grain = c->grain;
    int64_t nchunks = grain > 0 ? n / grain : n;
    if (nchunks > 4 * (int64_t)t->n)
        nchunks = 4 * (int64_t)t->n; /* a few per thread: one slow thread is caught up */
    par_chunks(c, n, nchunks, fn, arg);
}

/* fn over [0, N) in NCHUNKS chunks (at most N), on the backend's threads */
static void par_chunks(cpu_impl *c, int64_t n, int64_t nchunks, par_fn fn, void *arg)
{
    cpu_threads *t = &c->thr;
    if (nchunks > n)
        nchunks = n;
    if (t->n <= 1 || nchunks < 2) {
        fn(arg, 0, n);
        return;
    }
    if (!t->started)
        threads_start(t);
    pthread_mutex_lock(&t->mu);
    unsigned seq = atomic_load_explicit(&t->seq, memory_order_relaxed);
    atomic_store_explicit(&t->seq, seq + 1, memory_order_relaxed); /* odd: being written */
    atomic_thread_fence(memory_order_release);
    unsigned gen = atomic_load_explicit(&t->gen, memory_order_relaxed) + 1;
    atomic_store_explicit(&t->gen, gen, memory_order_relaxed);
    atomic_store_explicit(&t->fn, fn, memory_order_relaxed);
    atomic_store_explicit(&t->arg, arg, memory_order_relaxed);
    atomic_store_explicit(&t->n_items, n, memory_order_relaxed);
    atomic_store_explicit(&t->nchunks, nchunks, memory_order_relaxed);
    atomic_store(&t->done, 0);
    atomic_store_explicit(&t->seq, seq + 2, memory_order_release);
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
    atomic_store_explicit(&t->pub, gen, memory_order_release);
    run_chunks(t, 0, gen, fn, arg, n, nchunks);
    /* the chunks that workers took are under way: wait for them, looking
     * without a system call for WAIT_NS (a worker's last chunk ends within
     * microseconds; a sched_yield each time cost the next op as much),
     * then yielding the core to whoever needs it */
    struct timespec t0, now;
    int timed = 0;
    for (unsigned spin = 1; atomic_load_explicit(&t->done, memory_order_acquire) < nchunks;
         spin++) {
        if (timed > 1) {
            sched_yield();
            continue;
        }
        cpu_relax();
        if (spin % 64)
            continue;
        clock_gettime(CLOCK_MONOTONIC, timed ? &now : &t0);
        if (!timed)
            timed = 1;
        else if ((now.tv_sec - t0.tv_sec) * 1000000000L + (now.tv_nsec - t0.tv_nsec) > WAIT_NS)
            timed = 2;
    }
}

static void cpu_destroy(ckpt_backend *b)
{
    cpu_impl *c = b->impl;
    if (c) {
        threads_stop(&c->thr);
        for (size_t i = 0; i < WT_CACHE; i++)
            free(c->wt[i].wt);
        for (size_t i = 0; i < POOL_SLOTS; i++)
            buf_free(c->pool[i].p);
        free(c->cols);
        free(c->opack[0]);
        free(c->opack[1]);
        free(c->kparts);
        for (size_t i = 0; i < c->npacks; i++)
            free(c->packs[i].p);
        free(c->packs);
        free(c->ups);
        for (size_t i = 0; i < MAX_THREADS; i++)
            free(c->gscratch[i]);
        for (size_t i = 0; i < MAX_THREADS; i++) {
            free(c->cbuf[i]);
            free(c->abuf[i]);
        }
        if (c->blas)
            dlclose(c->blas);
        free(c);
    }
    free(b);
}

/* Each buffer carries its size in a header, for the pool. */
#define BUF_HEADER 64

static float *buf_new(size_t n)
{
    unsigned char *raw = malloc(BUF_HEADER + (n ? n * sizeof(float) : sizeof(float)));
    if (!raw)
        return NULL;
    memcpy(raw, &n, sizeof n);
    return (float *)(void *)(raw + BUF_HEADER);
}

static size_t buf_size(const float *p)
{
    size_t n;
    memcpy(&n, (const unsigned char *)p - BUF_HEADER, sizeof n);
    return n;
}

static void buf_free(float *p)
{
    if (p)
        free((unsigned char *)p - BUF_HEADER);
}

static int cpu_alloc(ckpt_backend *b, size_t n, float **out)
{
    cpu_impl *c = b->impl;
    if (n > SIZE_MAX / sizeof(float) / 2)
        return nomem(b);
    for (size_t i = 0; i < POOL_SLOTS; i++)
        if (c->pool[i].p && c->pool[i].n == n) {
            *out = c->pool[i].p;
            c->pool[i].p = NULL;
            c->pool_bytes -= n * sizeof(float);
            return CKPT_OK;
        }
    *out = buf_new(n);
    return *out ? CKPT_OK : nomem(b);
}

/* The entries of the transposed weights' cache ever filled (in order,
 * from 0): the own kernel fills none, and scanning all 64 at every buffer
 * released took 0.6% of the MNIST MLP's forward at batch 8 (perf; 0.15%
 * since), on the thread that runs alone between the products */
static size_t wt_used(const cpu_impl *c)
{
    return c->wt_next < WT_CACHE ? c->wt_next : WT_CACHE;
}

/* Forget the transposed and packed copies made of buffer P's N floats: it
 * is being released or written. */
static void forget_copies(cpu_impl *c, const float *p, size_t n)
{
    uintptr_t lo = (uintptr_t)p, hi = lo + n * sizeof(float);
    for (size_t i = 0; i < wt_used(c); i++)
        if (c->wt[i].w && (uintptr_t)c->wt[i].w >= lo && (uintptr_t)c->wt[i].w < hi) {
            free(c->wt[i].wt);
            c->wt[i].wt = NULL;
            c->wt[i].w = NULL;
        }
    for (size_t i = 0; i < c->npacks;)
        if ((uintptr_t)c->packs[i].w >= lo && (uintptr_t)c->packs[i].w < hi) {
            free(c->packs[i].p);
            c->packs[i] = c->packs[--c->npacks];
        } else
            i++;
    for (size_t i = 0; i < c->nups;)
        if ((uintptr_t)c->ups[i].p < hi && (uintptr_t)(c->ups[i].p + c->ups[i].n) > lo)
            c->ups[i] = c->ups[--c->nups];
        else
            i++;
}

/* Whether N floats at P lie in one range last written by upload(). */
static int uploaded(const cpu_impl *c, const float *p, size_t n)
{
    for (size_t i = 0; i < c->nups; i++)
        if (p >= c->ups[i].p && n <= c->ups[i].n && (size_t)(p - c->ups[i].p) <= c->ups[i].n - n)
            return 1;
    return 0;
}

static void cpu_release(ckpt_backend *b, float *p)
{
    cpu_impl *c = b->impl;
    if (!p)
        return;
    size_t n = buf_size(p);
    forget_copies(c, p, n ? n : 1);
    if (c->pool_bytes + n * sizeof(float) <= POOL_MAX_BYTES)
        for (size_t i = 0; i < POOL_SLOTS; i++)
            if (!c->pool[i].p) {
                c->pool[i].p = p;
                c->pool[i].n = n;
                c->pool_bytes += n * sizeof(float);
                return;
            }
    buf_free(p);
}

typedef struct copy_job {
    float *dst;
    const float *src;
} copy_job;

static void copy_part(void *arg, int64_t lo, int64_t hi)
{
    const copy_job *j = arg;
    memcpy(j->dst + lo, j->src + lo, (size_t)(hi - lo) * sizeof(float));
}

/* A batch's input and outputs (MB at batch 256): copied by every thread,
 * one memory stream each */
static int cpu_copy(ckpt_backend *b, float *dst, const float *src, size_t n)
{
    copy_job j = {.dst = dst, .src = src};
    par_for(b->impl, (int64_t)n, PAR_GRAIN, copy_part, &j);
    return CKPT_OK;
}

/* Weights are packed once, keyed by their buffer: new contents drop that */
static int cpu_upload(ckpt_backend *b, float *dst, const float *src, size_t n)
{
    cpu_impl *c = b->impl;
    forget_copies(c, dst, n);
    /* (without room to remember it, the range is only not packed once) */
    if (n && CKPT_GROW(c->ups, c->ups_cap, c->nups + 1) == 0)
        c->ups[c->nups++] = (struct upload_range){.p = dst, .n = n};
    return cpu_copy(b, dst, src, n);
}

/* C[m, n] (ldc) = sum_k A(i, k) * B[k, n] (row-major B, ldb), A(i, k) being
 * A[i * lda + k] or, transposed, A[k * lda + i].  Ascending k, float32. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && \
    !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
/* AVX2 where the CPU has it (no FMA: the same roundings as the SSE2 build) */
__attribute__((target_clones("avx2", "default")))
#endif
static void gemm_plain(int trans_a, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                       const float *bm, int64_t ldb, float *c, int64_t ldc)
{
    for (int64_t i = 0; i < m; i++) {
        float *restrict ci = c + i * ldc;
        for (int64_t j = 0; j < n; j++)
            ci[j] = 0.0f;
        for (int64_t p = 0; p < k; p++) {
            float av = trans_a ? a[p * lda + i] : a[i * lda + p];
            const float *restrict bp = bm + p * ldb;
            for (int64_t j = 0; j < n; j++)
                ci[j] += av * bp[j];
        }
    }
}

typedef struct opack_job {
    const cpu_gemm_kernel *gk;
    int side;
    const cpu_gemm_operand *o;
    int64_t rows, depth, t, slices;
    float *dst;
} opack_job;

/* Steps of the depth in one item of the packing: a small batch's operand
 * is one panel deep in K, cut so that every thread packs a share */
#define OPACK_SLICE 128

/* items LO..HI: panel q's steps s * OPACK_SLICE .. (item q * slices + s) */
static void opack_part(void *arg, int64_t lo, int64_t hi)
{
    const opack_job *j = arg;
    for (int64_t it = lo; it < hi; it++) {
        int64_t q = it / j->slices, p0 = it % j->slices * OPACK_SLICE;
        int64_t r0 = q * j->t, w = j->rows - r0 < j->t ? j->rows - r0 : j->t;
        int64_t kl = j->depth - p0 < OPACK_SLICE ? j->depth - p0 : OPACK_SLICE;
        /* one panel at a time: its steps p0.. where the whole-depth
         * layout puts them (panel q at r0 * depth, step p at + p * t) */
        cpu_gemm_pack(j->gk, j->side, j->o->raw + r0 * j->o->rs + p0 * j->o->cs, j->o->rs,
                      j->o->cs, w, kl, j->dst + r0 * j->depth + p0 * j->t);
    }
}

/* ROWS x DEPTH of operand O (raw) packed for SIDE into DST, on the threads */
static void pack_on_threads(cpu_impl *c, int side, const cpu_gemm_operand *o, int64_t rows,
                            int64_t depth, float *dst)
{
    int64_t t = side == CPU_GEMM_A ? cpu_gemm_panel_rows(c->gk) : cpu_gemm_panel_cols(c->gk);
    opack_job j = {.gk = c->gk, .side = side, .o = o, .rows = rows, .depth = depth, .t = t,
                   .slices = (depth + OPACK_SLICE - 1) / OPACK_SLICE, .dst = dst};
    int64_t per = t * OPACK_SLICE;
    par_for(c, (rows + t - 1) / t * j.slices, (PAR_GRAIN + per - 1) / per, opack_part, &j);
}

typedef struct plain_job {
    int trans_a;
    int64_t n, k, lda, ldb, ldc;
    const float *a, *bm;
    float *c;
} plain_job;

/* rows LO..HI of gemm_plain's product: each row is computed alone */
static void plain_part(void *arg, int64_t lo, int64_t hi)
{
    const plain_job *j = arg;
    gemm_plain(j->trans_a, hi - lo, j->n, j->k, j->trans_a ? j->a + lo : j->a + lo * j->lda,
               j->lda, j->bm, j->ldb, j->c + lo * j->ldc, j->ldc);
}

/* gemm_plain on the threads, cut by output rows */
static void gemm_plain_par(cpu_impl *c, int trans_a, int64_t m, int64_t n, int64_t k,
                           const float *a, int64_t lda, const float *bm, int64_t ldb, float *cm,
                           int64_t ldc)
{
    plain_job j = {.trans_a = trans_a, .n = n, .k = k, .lda = lda, .ldb = ldb, .ldc = ldc,
                   .a = a, .bm = bm, .c = cm};
    double per = (double)n * (double)(k > 0 ? k : 1);
    par_for(c, m, per >= PAR_GRAIN ? 1 : (int64_t)(PAR_GRAIN / per) + 1, plain_part, &j);
}

/* W's copy packed for SIDE of the own kernel, made at its first use and
 * kept until W's buffer is released or uploaded to (the executor's weights
 * are parameters: written once).  NULL: out of memory. */
static const float *weight_packed(cpu_impl *c, const float *w, int side, int64_t rows,
                                  int64_t depth, int64_t rs, int64_t cs)
{
    for (size_t i = 0; i < c->npacks; i++) {
        const packed_weight *q = &c->packs[i];
        if (q->w == w && q->side == side && q->rows == rows && q->depth == depth &&
            q->rs == rs && q->cs == cs)
            return q->p;
    }
    if (CKPT_GROW(c->packs, c->packs_cap, c->npacks + 1) < 0)
        return NULL;
    size_t bytes = cpu_gemm_packed_floats(c->gk, side, rows, depth) * sizeof(float);
    float *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p)
        return NULL;
    cpu_gemm_operand o = {.raw = w, .rs = rs, .cs = cs};
    pack_on_threads(c, side, &o, rows, depth, p); /* the first forward packs them all */
    c->packs[c->npacks++] = (packed_weight){.w = w, .side = side, .rows = rows, .depth = depth,
                                            .rs = rs, .cs = cs, .p = p};
    return p;
}

typedef struct gemm_job {
    cpu_impl *c;
    cpu_gemm_call call;
    int own_a; /* each chunk packs the (raw) A into its slot's abuf */
} gemm_job;

/* A slot of per-thread buffers no other running chunk holds (at most
 * thr.n chunks run at once, and there are as many slots). */
static unsigned slot_take(cpu_impl *c)
{
    /* the thread's own slot first (always free: each thread runs one chunk
     * at a time): a slot's buffers stay in one core's cache; taken by
     * whichever thread came first, the scratch (hundreds of KB) moved
     * between cores from one job to the next */
    for (unsigned s = (unsigned)thread_self % (unsigned)c->thr.n;; s = (s + 1) % (unsigned)c->thr.n)
        if (!atomic_load_explicit(&c->gbusy[s].taken, memory_order_relaxed) &&
            !atomic_exchange_explicit(&c->gbusy[s].taken, 1, memory_order_acquire))
            return s;
}

static void slot_give(cpu_impl *c, unsigned s)
{
    atomic_store_explicit(&c->gbusy[s].taken, 0, memory_order_release);
}

/* Each slot's GEMM scratch, made before a job that needs it. */
static int gemm_scratch_ready(ckpt_backend *b)
{
    cpu_impl *c = b->impl;
    size_t bytes = (cpu_gemm_scratch_floats(c->gk) * sizeof(float) + 63) / 64 * 64;
    for (int s = 0; s < c->thr.n; s++)
        if (!c->gscratch[s] && !(c->gscratch[s] = aligned_alloc(64, bytes)))
            return nomem(b);
    return CKPT_OK;
}

/* Grows each thread slot's buffer BUFS[s] (HAVE[s] floats) to at least N
 * floats, 64-byte aligned (the packed products read them by cache line). */
static int slot_grow(ckpt_backend *b, float **bufs, size_t *have, size_t n)
{
    cpu_impl *c = b->impl;
    size_t bytes = ((n ? n : 1) * sizeof(float) + 63) / 64 * 64;
    for (int s = 0; s < c->thr.n; s++)
        if (have[s] < n) {
            free(bufs[s]);
            have[s] = 0;
            if (!(bufs[s] = aligned_alloc(64, bytes)))
                return nomem(b);
            have[s] = n;
        }
    return CKPT_OK;
}

/* Each slot's buffer of at least N floats (conv2d's and conv_transpose2d's
 * images run side by side in them) */
static int slot_bufs_ready(ckpt_backend *b, size_t n)
{
    cpu_impl *c = b->impl;
    return slot_grow(b, c->cbuf, c->cbuf_n, n);
}

static void gemm_part(void *arg, int64_t lo, int64_t hi)
{
    gemm_job *j = arg;
    cpu_impl *c = j->c;
    unsigned s = slot_take(c);
    const cpu_gemm_call *call = &j->call;
    cpu_gemm_call own;
    if (j->own_a && hi - lo > 1) { /* (one task packs its blocks as it goes) */
        own = j->call;
        cpu_gemm_pack(c->gk, CPU_GEMM_A, own.a.raw, own.a.rs, own.a.cs, own.m, own.k,
                      c->abuf[s]);
        own.a = (cpu_gemm_operand){.packed = c->abuf[s]};
        call = &own;
    }
    for (int64_t t = lo; t < hi; t++)
        cpu_gemm_task(c->gk, call, t, c->gscratch[s]);
    slot_give(c, s);
}

/* Whether CALL (planned) is shared out by rows, each thread all columns
 * of its rows: a small batch (A read in place) whose rows the plan cut
 * into a multiple of the threads, and whose rows in and out outweigh
 * reading all of B on each thread (8 x their floats, B's floats once).
 * The threads' rows are then the images the per-image ops around it give
 * them (thread i the i-th part of the batch: par_for's groups), and the
 * activations stay in each core's cache.  Cut by columns, the
 * autoencoder's 32 -> 3136 at batch 8 had each thread write half of every
 * image, and the next op's threads read the other half from the other
 * core: 0.159 ms a forward against 0.153 on 2 threads with the VM's cores
 * ~100 ns apart, 0.185 against 0.168 with them ~440 ns apart (alternated
 * child processes, bench/bench_pingpong beside them).  The tasks are the
 * same: the same bits. */
static int by_rows(const cpu_impl *c, const cpu_gemm_call *call)
{
    return call->a_in_place && c->thr.n > 1 && call->tiles_m % c->thr.n == 0 &&
           8.0 * (double)call->m * (double)(call->n + call->k) >=
               (double)call->n * (double)call->k;
}

/* row parts LO..HI of a product, each with all its column parts */
static void gemm_rows_part(void *arg, int64_t lo, int64_t hi)
{
    gemm_job *j = arg;
    cpu_impl *c = j->c;
    unsigned s = slot_take(c);
    for (int64_t r = lo; r < hi; r++)
        for (int64_t cp = 0; cp < j->call.tiles_n; cp++)
            cpu_gemm_task(c->gk, &j->call, cp * j->call.tiles_m + r, c->gscratch[s]);
    slot_give(c, s);
}

/* Each slot's buffer for all of a product's A (gemm_part) */
static int slot_abufs_ready(ckpt_backend *b, size_t n)
{
    cpu_impl *c = b->impl;
    return slot_grow(b, c->abuf, c->abuf_n, n);
}

/* A product this small (multiply-adds) runs on the calling thread: waking
 * the others would cost more. */
#define GEMM_ALONE (1 << 18)

/* Operand SIDE of CALL (raw, ROWS x its depth), packed once on the threads
 * into the backend's buffer: else every task along the other side packs
 * the same block again, and more tasks (more threads) pack it more often.
 * Packing copies: the product's bits are the same. */
static int operand_packed(ckpt_backend *b, cpu_gemm_call *call, int side, int64_t rows)
{
    cpu_impl *c = b->impl;
    cpu_gemm_operand *o = side == CPU_GEMM_A ? &call->a : &call->b;
    size_t n = cpu_gemm_packed_floats(c->gk, side, rows, call->k);
    if (n > c->opack_n[side]) {
        free(c->opack[side]);
        c->opack_n[side] = 0;
        if (!(c->opack[side] = aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64)))
            return nomem(b);
        c->opack_n[side] = n;
    }
    pack_on_threads(c, side, o, rows, call->k, c->opack[side]);
    *o = (cpu_gemm_operand){.packed = c->opack[side]};
    return CKPT_OK;
}

/* Floats of the blocks' sums a product cut along its depth may take */
#define KPARTS_MAX (1 << 20)

typedef struct kblock_job {
    gemm_job *g;
    int64_t tasks;
    float *parts;
    int64_t stride, nblk;
} kblock_job;

/* items LO..HI: task it % tasks, depth block it / tasks */
static void kblock_part(void *arg, int64_t lo, int64_t hi)
{
    const kblock_job *k = arg;
    cpu_impl *c = k->g->c;
    unsigned s = slot_take(c);
    for (int64_t it = lo; it < hi; it++)
        cpu_gemm_task_block(c->gk, &k->g->call, it % k->tasks, it / k->tasks,
                            k->parts + it / k->tasks * k->stride, k->g->call.n, c->gscratch[s]);
    slot_give(c, s);
}

static void kcombine_part(void *arg, int64_t lo, int64_t hi)
{
    const kblock_job *k = arg;
    cpu_gemm_combine(&k->g->call, k->parts, k->nblk, k->stride, k->g->call.n, lo, hi);
}

/* A product of fewer tasks than threads (a small batch's product with a
 * long reduction: the autoencoder's 3136 -> 32 at batch 8), cut along its
 * depth: each block's sums on any thread, then added in ascending order
 * (cpu_gemm.h: the same bits as the whole task). */
static int gemm_run_blocks(ckpt_backend *b, gemm_job *j, int64_t tasks, int64_t nblk)
{
    cpu_impl *c = b->impl;
    size_t n = (size_t)(nblk * j->call.m * j->call.n);
    if (n > c->kparts_n) {
        free(c->kparts);
        c->kparts_n = 0;
        if (!(c->kparts = malloc(n * sizeof(float))))
            return nomem(b);
        c->kparts_n = n;
    }
    kblock_job k = {.g = j, .tasks = tasks, .parts = c->kparts,
                    .stride = j->call.m * j->call.n, .nblk = nblk};
    par_for(c, tasks * nblk, 1, kblock_part, &k);
    int64_t per = nblk * j->call.n;
    par_for(c, j->call.m, per ? (PAR_GRAIN + per - 1) / per : 1, kcombine_part, &k);
    return CKPT_OK;
}

/* JOB's SIZE bytes where the workers are to read them: the backend's copy,
 * written only when they differ from the last job's.  A model's forward
 * runs the same products every time, and a job written afresh on the
 * caller's stack had each worker fetch its lines from the caller's core
 * before its first task: the MNIST MLP's forward at batch 8 on 2 threads,
 * alternated in one binary, 0.1-0.25 us faster with the job kept. */
static void *job_kept(cpu_impl *c, const void *job, size_t size)
{
    if (size > sizeof c->kept)
        return (void *)job;
    if (memcmp(c->kept, job, size))
        memcpy(c->kept, job, size);
    return c->kept;
}

/* CALL on the own kernel, on the backend's threads. */
static int gemm_run(ckpt_backend *b, const cpu_gemm_call *call)
{
    cpu_impl *c = b->impl;
    int rc = gemm_scratch_ready(b);
    if (rc != CKPT_OK)
        return rc;
    gemm_job j;
    memset(&j, 0, sizeof j); /* (padding too: job_kept compares the bytes) */
    j.c = c;
    j.call = *call;
    int alone = !c->grain && (double)call->m * (double)call->n * (double)call->k < GEMM_ALONE;
    int64_t tasks = cpu_gemm_plan(c->gk, &j.call, alone ? 1 : c->thr.n);
    /* (one side is raw, the other a weight or an image's B; or both, in
     * matmul) */
    int64_t chunks = 0;
    int in_place = j.call.a_in_place; /* (a few rows, read where they are) */
    if (!alone && tasks >= c->thr.n && tasks <= 2 * (int64_t)c->thr.n && j.call.k > 0 &&
        j.call.a.raw && !j.call.a.packed && j.call.tiles_m == 1 && j.call.tiles_n > 1 &&
        (double)j.call.m * (double)j.call.k <= (double)cpu_gemm_scratch_floats(c->gk)) {
        /* A small batch's input (one block of rows, a few cache pages), A
         * of every task: read in place, or packed by each thread for its
         * chunk of tasks; one chunk a thread, so that a thread reads the
         * same weight panels every forward (in its core's cache).  Packed
         * once for all threads it was a job of its own, too small to share
         * (the MNIST MLP at batch 8: it ran on the calling thread alone),
         * and the other threads' tasks then read the lines another core had
         * just written.  Only for a few tasks a thread: with more (the
         * autoencoder's 32 -> 3136 at batch 8), one chunk a thread left no
         * chunk to take from a slow thread: about half the processes ran
         * the model 1.5x slower. */
        if (!in_place &&
            (rc = slot_abufs_ready(b, cpu_gemm_packed_floats(c->gk, CPU_GEMM_A, j.call.m,
                                                             j.call.k))) != CKPT_OK)
            return rc;
        j.own_a = !in_place;
        chunks = c->thr.n;
    } else if (!in_place && j.call.k > 0 && j.call.a.raw && !j.call.a.packed && j.call.tiles_n > 1)
        rc = operand_packed(b, &j.call, CPU_GEMM_A, j.call.m);
    if (rc == CKPT_OK && j.call.k > 0 && j.call.b.raw && !j.call.b.packed && j.call.tiles_m > 1)
        rc = operand_packed(b, &j.call, CPU_GEMM_B, j.call.n);
    if (rc != CKPT_OK)
        return rc;
    int64_t nblk = cpu_gemm_depth_blocks(c->gk, &j.call);
    /* (the blocks' sums take nblk times the output: a few MB at most) */
    if (!alone && c->thr.n > 1 && tasks < c->thr.n && nblk > 1 &&
        (double)nblk * (double)j.call.m * (double)j.call.n <= KPARTS_MAX)
        return gemm_run_blocks(b, &j, tasks, nblk);
    if (alone)
        gemm_part(&j, 0, tasks);
    else if (by_rows(c, &j.call))
        par_chunks(c, j.call.tiles_m, c->thr.n, gemm_rows_part, job_kept(c, &j, sizeof j));
    else if (chunks)
        par_chunks(c, tasks, chunks, gemm_part, job_kept(c, &j, sizeof j));
    else
        par_for(c, tasks, 1, gemm_part, job_kept(c, &j, sizeof j));
    return CKPT_OK;
}

/* C = op(W) * B with op(W) [m, k] a weight (W[i * ldw + p], or transposed
 * W[p * ldw + i]), B [k, n], all row-major, beta 0: on the own kernel (the
 * weight packed once), else OpenBLAS, else the plain loop.  (conv2d on the
 * own kernel goes to conv2d_packed, which also does its epilogue.) */
static int gemm_w(ckpt_backend *b, int trans_w, int64_t m, int64_t n, int64_t k, const float *w,
                  int64_t ldw, const float *bm, int64_t ldb, float *cm, int64_t ldc)
{
    cpu_impl *c = b->impl;
    if (c->gk) {
        const float *wp = trans_w ? weight_packed(c, w, CPU_GEMM_A, m, k, 1, ldw)
                                  : weight_packed(c, w, CPU_GEMM_A, m, k, ldw, 1);
        if (!wp)
            return nomem(b);
        cpu_gemm_call call = {.m = m, .n = n, .k = k, .a = {.packed = wp},
                              .b = {.raw = bm, .rs = 1, .cs = ldb}, .c = cm, .ldc = ldc};
        return gemm_run(b, &call);
    }
    if (c->sgemm && m <= INT32_MAX && n <= INT32_MAX && k <= INT32_MAX && k > 0)
        c->sgemm(CBLAS_ROW_MAJOR, trans_w ? CBLAS_TRANS : CBLAS_NO_TRANS, CBLAS_NO_TRANS,
                 (int)m, (int)n, (int)k, 1.0f, w, (int)ldw, bm, (int)ldb, 0.0f, cm, (int)ldc);
    else
        gemm_plain_par(c, trans_w, m, n, k, w, ldw, bm, ldb, cm, ldc);
    return CKPT_OK;
}

static const float *transposed_weight(ckpt_backend *b, const float *w, int64_t in, int64_t out)
{
    cpu_impl *c = b->impl;
    for (size_t i = 0; i < wt_used(c); i++)
        if (c->wt[i].w == w && c->wt[i].in == in && c->wt[i].out == out && c->wt[i].wt)
            return c->wt[i].wt;
    float *wt = malloc((size_t)(in * out > 0 ? in * out : 1) * sizeof(float));
    if (!wt)
        return NULL;
    for (int64_t o = 0; o < out; o++)
        for (int64_t i = 0; i < in; i++)
            wt[i * out + o] = w[o * in + i];
    size_t slot = c->wt_next++ % WT_CACHE;
    free(c->wt[slot].wt);
    c->wt[slot].w = w;
    c->wt[slot].in = in;
    c->wt[slot].out = out;
    c->wt[slot].wt = wt;
    return wt;
}

typedef struct bias_job {
    float *y;
    const float *bias;
    int64_t out;
} bias_job;

/* y[r, o] += bias[o] for rows LO..HI */
static void bias_rows_part(void *arg, int64_t lo, int64_t hi)
{
    const bias_job *j = arg;
    for (int64_t r = lo; r < hi; r++) {
        float *restrict yr = j->y + r * j->out;
        const float *restrict bv = j->bias;
        for (int64_t o = 0; o < j->out; o++)
            yr[o] += bv[o];
    }
}

static int linear_then(ckpt_backend *b, const float *x, const float *w, const float *bias,
                       float *y, int64_t rows, int64_t in, int64_t out, int relu)
{
    cpu_impl *c = b->impl;
    /* a row or two: the plain loop over the transposed weight (a GEMV)
     * costs less than any blocked product's set-up */
    if (c->gk && rows > 2) { /* x as A, the weight packed as B: y's rows are x's */
        const float *wp = weight_packed(c, w, CPU_GEMM_B, out, in, in, 1);
        if (!wp)
            return nomem(b);
        cpu_gemm_call call = {.m = rows, .n = out, .k = in, .a = {.raw = x, .rs = in, .cs = 1},
                              .b = {.packed = wp}, .c = y, .ldc = out, .bias = bias,
                              .bias_cols = 1, .relu = relu};
        return gemm_run(b, &call);
    }
    /* a row or two: OpenBLAS's set-up costs more than the plain loop */
    if (c->sgemm && rows > 2 && rows <= INT32_MAX && in <= INT32_MAX && out <= INT32_MAX &&
        in > 0) {
        c->sgemm(CBLAS_ROW_MAJOR, CBLAS_NO_TRANS, CBLAS_TRANS, (int)rows, (int)out, (int)in,
                 1.0f, x, (int)in, w, (int)in, 0.0f, y, (int)out);
    } else {
        const float *wt = transposed_weight(b, w, in, out);
        if (!wt)
            return nomem(b);
        gemm_plain_par(c, 0, rows, out, in, x, in, wt, out, y, out);
    }
    if (bias) {
        bias_job j = {.y = y, .bias = bias, .out = out};
        par_for(c, rows, out ? (PAR_GRAIN + out - 1) / out : 1, bias_rows_part, &j);
    }
    return relu ? cpu_relu(b, y, y, (size_t)(rows * out)) : CKPT_OK;
}

static int cpu_linear(ckpt_backend *b, const float *x, const float *w, const float *bias,
                      float *y, int64_t rows, int64_t in, int64_t out)
{
    return linear_then(b, x, w, bias, y, rows, in, out, 0);
}

/* On the own kernel the ReLU is in the product's store (no pass of its
 * own over y: on 2 threads it read the half of y the other core had just
 * written); on OpenBLAS and the plain loop it is a second pass. */
static int cpu_linear_relu(ckpt_backend *b, const float *x, const float *w, const float *bias,
                           float *y, int64_t rows, int64_t in, int64_t out)
{
    return linear_then(b, x, w, bias, y, rows, in, out, 1);
}

static float *scratch(cpu_impl *c, size_t n)
{
    if (n > c->cols_n) {
        free(c->cols);
        c->cols_n = 0;
        if (!(c->cols = malloc((n ? n : 1) * sizeof(float))))
            return NULL;
        c->cols_n = n;
    }
    return c->cols;
}

/* cols[(ci * kh + i) * kw + j, oh * out_w + ow] = x[ci, ih, iw] or 0 in the
 * padding, for input channels CI0 <= ci < CI1 */
static void im2col(const float *x, const ckpt_conv_geom *g, float *cols, int64_t ci0,
                   int64_t ci1)
{
    int64_t hw = g->out_h * g->out_w;
    for (int64_t ci = ci0; ci < ci1; ci++)
        for (int64_t i = 0; i < g->k_h; i++)
            for (int64_t j = 0; j < g->k_w; j++) {
                float *row = cols + ((ci * g->k_h + i) * g->k_w + j) * hw;
                const float *plane = x + ci * g->in_h * g->in_w;
                int64_t shift = j * g->dil_w - g->pad_w, lo, hi;
                cpu_conv_cols(shift, g->stride_w, g->in_w, g->out_w, &lo, &hi);
                for (int64_t oh = 0; oh < g->out_h; oh++) {
                    int64_t ih = oh * g->stride_h - g->pad_h + i * g->dil_h;
                    float *restrict dst = row + oh * g->out_w;
                    if (ih < 0 || ih >= g->in_h) {
                        for (int64_t ow = 0; ow < g->out_w; ow++)
                            dst[ow] = 0.0f;
                        continue;
                    }
                    /* plain loops, not memcpy: the rows are short (7 to 56) */
                    const float *restrict src = plane + ih * g->in_w + shift;
                    for (int64_t ow = 0; ow < lo; ow++)
                        dst[ow] = 0.0f;
                    if (g->stride_w == 1)
                        for (int64_t ow = lo; ow < hi; ow++)
                            dst[ow] = src[ow];
                    else if (g->stride_w == 2)
                        for (int64_t ow = lo; ow < hi; ow++)
                            dst[ow] = src[2 * ow];
                    else
                        for (int64_t ow = lo; ow < hi; ow++)
                            dst[ow] = src[ow * g->stride_w];
                    for (int64_t ow = hi; ow < g->out_w; ow++)
                        dst[ow] = 0.0f;
                }
            }
}

typedef struct conv_job {
    const float *x, *bias, *res;
    float *y, *cols;
    const ckpt_conv_geom *g;
    int relu;
} conv_job;

static void im2col_part(void *arg, int64_t lo, int64_t hi)
{
    const conv_job *j = arg;
    im2col(j->x, j->g, j->cols, lo, hi);
}

/* y[oc, p] = relu(y[oc, p] + bias[oc] + res[oc, p]) over channels LO..HI,
 * each step only when asked for: the values of conv2d's bias, then add,
 * then relu (adding no bias keeps a -0.0 the products gave, as conv2d
 * without a bias does). */
static void epilogue_part(void *arg, int64_t lo, int64_t hi)
{
    const conv_job *j = arg;
    int64_t hw = j->g->out_h * j->g->out_w;
    for (int64_t oc = lo; oc < hi; oc++) {
        float *restrict yp = j->y + oc * hw;
        const float *restrict rp = j->res ? j->res + oc * hw : NULL;
        if (j->bias) {
            float bv = j->bias[oc];
            for (int64_t p = 0; p < hw; p++)
                yp[p] += bv;
        }
        if (rp)
            for (int64_t p = 0; p < hw; p++)
                yp[p] += rp[p];
        if (j->relu)
            for (int64_t p = 0; p < hw; p++)
                yp[p] = yp[p] < 0.0f ? 0.0f : yp[p];
    }
}

typedef struct pack_job {
    const cpu_gemm_kernel *gk;
    const float *x;
    const ckpt_conv_geom *g;
    float *dst;
    int direct;
} pack_job;

/* B's panels LO..HI of one image: the input itself for a 1x1 stride-1
 * conv, else what im2col would have made, packed as it is read. */
static void pack_part(void *arg, int64_t lo, int64_t hi)
{
    const pack_job *j = arg;
    const ckpt_conv_geom *g = j->g;
    int64_t hw = g->out_h * g->out_w, nr = cpu_gemm_panel_cols(j->gk);
    if (!j->direct) {
        cpu_gemm_pack_conv(j->gk, j->x, g, lo, hi, j->dst);
        return;
    }
    int64_t c0 = lo * nr, c1 = hi * nr < hw ? hi * nr : hw;
    cpu_gemm_pack(j->gk, CPU_GEMM_B, j->x + c0, 1, hw, c1 - c0, g->in_c,
                  j->dst + c0 * g->in_c);
}

/* Images of a batch side by side, one thread an image: for convs too
 * small to share between threads (the MNIST autoencoder's). */
typedef struct conv_img_job {
    cpu_impl *c;
    const float *x, *wp, *bias, *res;
    float *y;
    const ckpt_conv_geom *g;
    int relu, direct;
} conv_img_job;

static cpu_gemm_call conv_call(const conv_img_job *j, int64_t n, const float *bp)
{
    const ckpt_conv_geom *g = j->g;
    int64_t hw = g->out_h * g->out_w;
    return (cpu_gemm_call){.m = g->out_c, .n = hw, .k = g->in_c * g->k_h * g->k_w,
                           .a = {.packed = j->wp}, .b = {.packed = bp},
                           .c = j->y + n * g->out_c * hw, .ldc = hw, .bias = j->bias,
                           .res = j->res ? j->res + n * g->out_c * hw : NULL, .ldr = hw,
                           .relu = j->relu};
}

static void conv_img_part(void *arg, int64_t lo, int64_t hi)
{
    const conv_img_job *j = arg;
    cpu_impl *c = j->c;
    const ckpt_conv_geom *g = j->g;
    int64_t hw = g->out_h * g->out_w, nr = cpu_gemm_panel_cols(c->gk);
    unsigned s = slot_take(c);
    for (int64_t n = lo; n < hi; n++) {
        pack_job pj = {.gk = c->gk, .x = j->x + n * g->in_c * g->in_h * g->in_w, .g = g,
                       .dst = c->cbuf[s], .direct = j->direct};
        pack_part(&pj, 0, (hw + nr - 1) / nr);
        cpu_gemm_call call = conv_call(j, n, c->cbuf[s]);
        int64_t tasks = cpu_gemm_plan(c->gk, &call, 1);
        for (int64_t t = 0; t < tasks; t++)
            cpu_gemm_task(c->gk, &call, t, c->gscratch[s]);
    }
    slot_give(c, s);
}

/* An image's product this small (multiply-adds) is left whole to one
 * thread when the batch has several. */
#define CONV_ALONE (1 << 22)

/* A bigger one too, when the batch divides among the threads and their
 * images' packed inputs take at most this many floats together (each
 * slot keeps its own: SSD300's 300 x 300 layers, 52M floats an image,
 * stay shared).  Each thread then has whole images from one layer to the
 * next, as the per-image ops between give them, and no activation moves
 * between the cores: shared out tile by tile, each layer read what the
 * other core had written of every image.  2 threads, the same binary,
 * the VM's cores ~100 ns apart / ~420 ns apart: ResNet-50 at batch 8
 * 472 / 523 ms -> 455 / 456, the CRNN at 8 242 ms (far) -> 210, ResNet-50
 * at 32 2019 -> 1826 (far), SSD300 at 8 3573 -> 3444 (far, +197 MiB peak
 * RSS).  A product's bits do not depend on its tiles (cpu_gemm.h). */
#define CONV_IMG_FLOATS (64.0 * 1024 * 1024)

/* conv2d on the own kernel: per image, B packed once (in parallel, from
 * the input), then the product with the weight packed at its first use,
 * the bias, residual and ReLU done in the stores; image by image on the
 * threads when small (CONV_ALONE) or when the batch divides among them
 * (CONV_IMG_FLOATS). */
static int conv2d_packed(ckpt_backend *b, const float *x, const float *w, const float *bias,
                         const float *res, int relu, float *y, const ckpt_conv_geom *g)
{
    cpu_impl *c = b->impl;
    int64_t hw = g->out_h * g->out_w, ckk = g->in_c * g->k_h * g->k_w;
    int64_t nr = cpu_gemm_panel_cols(c->gk), panels = (hw + nr - 1) / nr;
    size_t bn = cpu_gemm_packed_floats(c->gk, CPU_GEMM_B, hw, ckk);
    conv_img_job j = {.c = c, .x = x, .wp = weight_packed(c, w, CPU_GEMM_A, g->out_c, ckk, ckk, 1),
                      .bias = bias, .res = res, .y = y, .g = g, .relu = relu,
                      .direct = g->k_h == 1 && g->k_w == 1 && g->stride_h == 1 &&
                                g->stride_w == 1 && g->pad_h == 0 && g->pad_w == 0};
    int rc = gemm_scratch_ready(b);
    if (rc != CKPT_OK || !j.wp)
        return rc != CKPT_OK ? rc : nomem(b);
    if (g->batch > 1 && c->thr.n > 1 &&
        ((double)g->out_c * (double)hw * (double)ckk < CONV_ALONE ||
         (g->batch % c->thr.n == 0 && (double)bn * (double)c->thr.n <= CONV_IMG_FLOATS))) {
        if ((rc = slot_bufs_ready(b, bn)) != CKPT_OK)
            return rc;
        par_for(c, g->batch, 1, conv_img_part, &j);
        return CKPT_OK;
    }
    float *bp = scratch(c, bn);
    if (!bp)
        return nomem(b);
    int64_t per_panel = ckk * nr, grain = (PAR_GRAIN + per_panel - 1) / per_panel;
    for (int64_t n = 0; n < g->batch; n++) {
        pack_job pj = {.gk = c->gk, .x = x + n * g->in_c * g->in_h * g->in_w, .g = g, .dst = bp,
                       .direct = j.direct};
        par_for(c, panels, grain, pack_part, &pj);
        cpu_gemm_call call = conv_call(&j, n, bp);
        if ((rc = gemm_run(b, &call)) != CKPT_OK)
            return rc;
    }
    return CKPT_OK;
}

static int cpu_conv2d_fused(ckpt_backend *b, const float *x, const float *w, const float *bias,
                            const float *res, int relu, float *y, const ckpt_conv_geom *g)
{
    cpu_impl *c = b->impl;
    if (c->gk)
        return conv2d_packed(b, x, w, bias, res, relu, y, g);
    int64_t hw = g->out_h * g->out_w, ckk = g->in_c * g->k_h * g->k_w;
    int direct = g->k_h == 1 && g->k_w == 1 && g->stride_h == 1 && g->stride_w == 1 &&
                 g->pad_h == 0 && g->pad_w == 0;
    float *cols = NULL;
    if (!direct && !(cols = scratch(c, (size_t)(ckk * hw))))
        return nomem(b);
    /* a thread's share of im2col or of the pass over y: 32K values or more */
    int64_t rows = g->k_h * g->k_w * hw, grain = rows ? (PAR_GRAIN + rows - 1) / rows : 1;
    int64_t epi_grain = hw ? (PAR_GRAIN + hw - 1) / hw : 1;
    for (int64_t n = 0; n < g->batch; n++) {
        conv_job j = {.x = x + n * g->in_c * g->in_h * g->in_w, .bias = bias,
                      .res = res ? res + n * g->out_c * hw : NULL, .y = y + n * g->out_c * hw,
                      .cols = cols, .g = g, .relu = relu};
        if (!direct)
            par_for(c, g->in_c, grain, im2col_part, &j);
        int rc = gemm_w(b, 0, g->out_c, hw, ckk, w, ckk, direct ? j.x : cols, hw, j.y, hw);
        if (rc != CKPT_OK)
            return rc;
        if (bias || res || relu)
            par_for(c, g->out_c, epi_grain, epilogue_part, &j);
    }
    return CKPT_OK;
}

static int cpu_conv2d(ckpt_backend *b, const float *x, const float *w, const float *bias,
                      float *y, const ckpt_conv_geom *g)
{
    return cpu_conv2d_fused(b, x, w, bias, NULL, 0, y, g);
}

typedef struct convt_job {
    cpu_impl *c;
    const float *x, *w, *wp, *bias;
    float *y, *cols;
    const ckpt_conv_geom *g;
    int act; /* ckpt_act_kind, after the bias */
} convt_job;

/* col2im of one image's COLS into Y's channels LO..HI: each output pixel
 * gets its kernel taps in ascending (row, column) order -- one tap per
 * (i, j) at most -- then the bias, then the activation (relu1, sigmoid1:
 * relu's and sigmoid's own) */
static void col2im(const convt_job *j, const float *cols, float *y, int64_t lo, int64_t hi)
{
    const ckpt_conv_geom *g = j->g;
    int64_t hw_in = g->in_h * g->in_w, kk = g->k_h * g->k_w, ohw = g->out_h * g->out_w;
    for (int64_t oc = lo; oc < hi; oc++) {
        float *yc = y + oc * ohw;
        memset(yc, 0, sizeof(float) * (size_t)ohw);
        for (int64_t i = 0; i < g->k_h; i++)
            for (int64_t jj = 0; jj < g->k_w; jj++) {
                const float *col = cols + (oc * kk + i * g->k_w + jj) * hw_in;
                for (int64_t ih = 0; ih < g->in_h; ih++) {
                    int64_t oh = ih * g->stride_h - g->pad_h + i * g->dil_h;
                    if (oh < 0 || oh >= g->out_h)
                        continue;
                    for (int64_t iw = 0; iw < g->in_w; iw++) {
                        int64_t ow = iw * g->stride_w - g->pad_w + jj * g->dil_w;
                        if (ow >= 0 && ow < g->out_w)
                            yc[oh * g->out_w + ow] += col[ih * g->in_w + iw];
                    }
                }
            }
        if (j->bias)
            for (int64_t p = 0; p < ohw; p++)
                yc[p] += j->bias[oc];
        /* (here, the channel still in cache: on 2 threads the MNIST
         * autoencoder's relu as a job of its own took longer than on 1) */
        if (j->act == CKPT_ACT_RELU)
            for (int64_t p = 0; p < ohw; p++)
                yc[p] = relu1(yc[p]);
        else if (j->act == CKPT_ACT_SIGMOID)
            for (int64_t p = 0; p < ohw; p++)
                yc[p] = sigmoid1(yc[p]);
    }
}

/* channels LO..HI of the image whose columns are in j->cols */
static void col2im_part(void *arg, int64_t lo, int64_t hi)
{
    const convt_job *j = arg;
    col2im(j, j->cols, j->y, lo, hi);
}

/* Images LO..HI whole on one thread, in its slot's buffers: the product
 * on one thread (the same bits: cpu_gemm.h), then col2im */
static void convt_img_part(void *arg, int64_t lo, int64_t hi)
{
    const convt_job *j = arg;
    cpu_impl *c = j->c;
    const ckpt_conv_geom *g = j->g;
    int64_t hw_in = g->in_h * g->in_w, okk = g->out_c * g->k_h * g->k_w;
    unsigned s = slot_take(c);
    for (int64_t n = lo; n < hi; n++) {
        const float *xn = j->x + n * g->in_c * hw_in;
        if (j->wp) {
            cpu_gemm_call call = {.m = okk, .n = hw_in, .k = g->in_c, .a = {.packed = j->wp},
                                  .b = {.raw = xn, .rs = 1, .cs = hw_in}, .c = c->cbuf[s],
                                  .ldc = hw_in};
            int64_t tasks = cpu_gemm_plan(c->gk, &call, 1);
            for (int64_t t = 0; t < tasks; t++)
                cpu_gemm_task(c->gk, &call, t, c->gscratch[s]);
        } else
            gemm_plain(1, okk, hw_in, g->in_c, j->w, okk, xn, hw_in, c->cbuf[s], hw_in);
        col2im(j, c->cbuf[s], j->y + n * g->out_c * g->out_h * g->out_w, 0, g->out_c);
    }
    slot_give(c, s);
}

static int cpu_conv_transpose2d_act(ckpt_backend *b, const float *x, const float *w,
                                    const float *bias, int act, float *y,
                                    const ckpt_conv_geom *g)
{
    cpu_impl *c = b->impl;
    int64_t hw_in = g->in_h * g->in_w, kk = g->k_h * g->k_w, okk = g->out_c * kk;
    int64_t ohw = g->out_h * g->out_w;
    if (act != CKPT_ACT_NONE && act != CKPT_ACT_RELU && act != CKPT_ACT_SIGMOID)
        return ckpt_backend_fail(b, CKPT_ERR_USAGE, "unknown activation %d", act);
    convt_job j = {.c = c, .x = x, .w = w, .bias = bias, .y = y, .g = g, .act = act};
    /* small images (the MNIST autoencoder's 7 x 7 and 14 x 14) one a
     * thread: their products are too small to share.  Not with OpenBLAS,
     * whose own threads would then compete with them */
    if (g->batch > 1 && c->thr.n > 1 && (c->gk || !c->sgemm) &&
        (double)okk * (double)hw_in * (double)g->in_c < CONV_ALONE) {
        int rc = c->gk ? gemm_scratch_ready(b) : CKPT_OK;
        if (rc == CKPT_OK)
            rc = slot_bufs_ready(b, (size_t)(okk * hw_in));
        if (rc != CKPT_OK)
            return rc;
        if (c->gk && !(j.wp = weight_packed(c, w, CPU_GEMM_A, okk, g->in_c, 1, okk)))
            return nomem(b);
        par_for(c, g->batch, 1, convt_img_part, &j);
        return CKPT_OK;
    }
    float *cols = scratch(c, (size_t)(okk * hw_in));
    if (!cols)
        return nomem(b);
    j.cols = cols;
    int64_t per = kk * hw_in + ohw, grain = per ? (PAR_GRAIN + per - 1) / per : 1;
    for (int64_t n = 0; n < g->batch; n++) {
        const float *xn = x + n * g->in_c * hw_in;
        /* cols[oc * kk + (i, j), input pixel] = sum_ci w[ci, oc, i, j] * x[ci, pixel] */
        int rc = gemm_w(b, 1, okk, hw_in, g->in_c, w, okk, xn, hw_in, cols, hw_in);
        if (rc != CKPT_OK)
            return rc;
        convt_job ji = j;
        ji.y = y + n * g->out_c * ohw;
        par_for(c, g->out_c, grain, col2im_part, &ji);
    }
    return CKPT_OK;
}

static int cpu_conv_transpose2d(ckpt_backend *b, const float *x, const float *w,
                                const float *bias, float *y, const ckpt_conv_geom *g)
{
    return cpu_conv_transpose2d_act(b, x, w, bias, CKPT_ACT_NONE, y, g);
}

typedef struct pool_job {
    const float *x;
    float *y;
    const ckpt_pool_geom *g;
} pool_job;

/* Planes LO..HI.  Each output row keeps a running maximum per column and
 * takes the window's taps in (row, column) order, a tap over a whole row
 * at a time (torch's order per output element, in loops that vectorize):
 * v replaces the maximum when greater or NaN, so a NaN stays (torch: a NaN
 * wins).  Taps in the padding are skipped: -infinity is never chosen. */
static void max_pool_part(void *arg, int64_t lo, int64_t hi)
{
    const pool_job *pj = arg;
    const ckpt_pool_geom *g = pj->g;
    for (int64_t p = lo; p < hi; p++) {
        const float *xp = pj->x + p * g->in_h * g->in_w;
        float *yp = pj->y + p * g->out_h * g->out_w;
        for (int64_t oh = 0; oh < g->out_h; oh++) {
            float *restrict best = yp + oh * g->out_w;
            for (int64_t ow = 0; ow < g->out_w; ow++)
                best[ow] = -INFINITY;
            for (int64_t i = 0; i < g->k_h; i++) {
                int64_t ih = oh * g->stride_h - g->pad_h + i * g->dil_h;
                if (ih < 0 || ih >= g->in_h)
                    continue;
                for (int64_t j = 0; j < g->k_w; j++) {
                    int64_t shift = j * g->dil_w - g->pad_w, l, h;
                    cpu_conv_cols(shift, g->stride_w, g->in_w, g->out_w, &l, &h);
                    const float *restrict src = xp + ih * g->in_w + shift;
                    if (g->stride_w == 1)
                        for (int64_t ow = l; ow < h; ow++) {
                            float v = src[ow], m = best[ow];
                            best[ow] = v > m || v != v ? v : m;
                        }
                    else if (g->stride_w == 2)
                        for (int64_t ow = l; ow < h; ow++) {
                            float v = src[2 * ow], m = best[ow];
                            best[ow] = v > m || v != v ? v : m;
                        }
                    else
                        for (int64_t ow = l; ow < h; ow++) {
                            float v = src[ow * g->stride_w], m = best[ow];
                            best[ow] = v > m || v != v ? v : m;
                        }
                }
            }
        }
    }
}

static int cpu_max_pool2d(ckpt_backend *b, const float *x, float *y, const ckpt_pool_geom *g)
{
    pool_job pj = {.x = x, .y = y, .g = g};
    int64_t per = g->out_h * g->out_w * g->k_h * g->k_w;
    par_for(b->impl, g->planes, per ? (PAR_GRAIN + per - 1) / per : 1, max_pool_part, &pj);
    return CKPT_OK;
}

typedef struct l2_job {
    const float *x, *w;
    float *y;
    int64_t c, hw, blocks;
    float eps;
} l2_job;

/* Pixels of a block: their norms kept on the stack */
#define L2_BLOCK 256

/* Blocks LO..HI (image n's block q: n * blocks + q) of L2_BLOCK pixels */
static void l2norm_part(void *arg, int64_t lo, int64_t hi)
{
    const l2_job *j = arg;
    float norm[L2_BLOCK];
    for (int64_t k = lo; k < hi; k++) {
        int64_t n = k / j->blocks, p0 = k % j->blocks * L2_BLOCK;
        int64_t len = j->hw - p0 < L2_BLOCK ? j->hw - p0 : L2_BLOCK;
        const float *xi = j->x + n * j->c * j->hw + p0;
        float *yi = j->y + n * j->c * j->hw + p0;
        /* sum of squares per pixel, channels in ascending order */
        for (int64_t p = 0; p < len; p++)
            norm[p] = 0.0f;
        for (int64_t ch = 0; ch < j->c; ch++)
            for (int64_t p = 0; p < len; p++)
                norm[p] += xi[ch * j->hw + p] * xi[ch * j->hw + p];
        for (int64_t p = 0; p < len; p++)
            norm[p] = sqrtf(norm[p]) + j->eps;
        /* as torch: x / norm, then times the weight */
        for (int64_t ch = 0; ch < j->c; ch++)
            for (int64_t p = 0; p < len; p++)
                yi[ch * j->hw + p] = j->w[ch] * (xi[ch * j->hw + p] / norm[p]);
    }
}

static int cpu_l2norm(ckpt_backend *b, const float *x, const float *w, float *y, int64_t n,
                      int64_t c, int64_t hw, float eps)
{
    l2_job j = {.x = x, .w = w, .y = y, .c = c, .hw = hw, .eps = eps,
                .blocks = (hw + L2_BLOCK - 1) / L2_BLOCK};
    int64_t per = 2 * c * L2_BLOCK;
    par_for(b->impl, n * j.blocks, (PAR_GRAIN + per - 1) / per, l2norm_part, &j);
    return CKPT_OK;
}

typedef struct ew_job {
    const float *a, *x;
    float *y;
} ew_job;

static void relu_part(void *arg, int64_t lo, int64_t hi)
{
    const ew_job *e = arg;
    const float *restrict x = e->x;
    float *restrict y = e->y;
    for (int64_t i = lo; i < hi; i++)
        y[i] = relu1(x[i]);
}

static int cpu_relu(ckpt_backend *b, const float *x, float *y, size_t n)
{
    ew_job e = {.x = x, .y = y};
    par_for(b->impl, (int64_t)n, 2 * PAR_GRAIN, relu_part, &e);
    return CKPT_OK;
}

typedef struct bn_job {
    const float *x, *scale, *shift;
    float *y;
    int64_t c, inner;
} bn_job;

/* rows LO..HI of [outer * c, inner] */
static void batch_norm_part(void *arg, int64_t lo, int64_t hi)
{
    const bn_job *j = arg;
    for (int64_t r = lo; r < hi; r++) {
        const float *restrict xp = j->x + r * j->inner;
        float *restrict yp = j->y + r * j->inner;
        float a = j->scale[r % j->c], s = j->shift[r % j->c];
        for (int64_t i = 0; i < j->inner; i++)
            yp[i] = xp[i] * a + s;
    }
}

static int cpu_batch_norm(ckpt_backend *b, const float *x, const float *mean, const float *var,
                          const float *w, const float *bias, float *y, int64_t outer, int64_t c,
                          int64_t inner, float eps)
{
    float *scale = malloc((size_t)(c > 0 ? 2 * c : 2) * sizeof(float));
    if (!scale)
        return nomem(b);
    float *shift = scale + c;
    /* torch's batch_norm_cpu_collect_linear_and_constant_terms, in float32 */
    for (int64_t ch = 0; ch < c; ch++) {
        float invstd = 1.0f / sqrtf(var[ch] + eps);
        scale[ch] = invstd * (w ? w[ch] : 1.0f);
        shift[ch] = (bias ? bias[ch] : 0.0f) - mean[ch] * scale[ch];
    }
    bn_job j = {.x = x, .scale = scale, .shift = shift, .y = y, .c = c, .inner = inner};
    par_for(b->impl, outer * c, inner ? (2 * PAR_GRAIN + inner - 1) / inner : 1,
            batch_norm_part, &j);
    free(scale);
    return CKPT_OK;
}

static void add_part(void *arg, int64_t lo, int64_t hi)
{
    const ew_job *e = arg;
    const float *restrict a = e->a, *restrict x = e->x;
    float *restrict y = e->y;
    for (int64_t i = lo; i < hi; i++)
        y[i] = a[i] + x[i];
}

static int cpu_add(ckpt_backend *b, const float *a, const float *x, float *y, size_t n)
{
    ew_job e = {.a = a, .x = x, .y = y};
    par_for(b->impl, (int64_t)n, 2 * PAR_GRAIN, add_part, &e);
    return CKPT_OK;
}

/* planes LO..HI */
static void avg_pool_part(void *arg, int64_t lo, int64_t hi)
{
    const pool_job *pj = arg;
    const ckpt_pool_geom *g = pj->g;
    for (int64_t p = lo; p < hi; p++) {
        const float *xp = pj->x + p * g->in_h * g->in_w;
        float *yp = pj->y + p * g->out_h * g->out_w;
        for (int64_t oh = 0; oh < g->out_h; oh++) {
            /* torch's bins: floor(i * in / out) .. ceil((i + 1) * in / out) */
            int64_t h0 = oh * g->in_h / g->out_h;
            int64_t h1 = ((oh + 1) * g->in_h + g->out_h - 1) / g->out_h;
            for (int64_t ow = 0; ow < g->out_w; ow++) {
                int64_t w0 = ow * g->in_w / g->out_w;
                int64_t w1 = ((ow + 1) * g->in_w + g->out_w - 1) / g->out_w;
                float sum = 0.0f;
                for (int64_t ih = h0; ih < h1; ih++)
                    for (int64_t iw = w0; iw < w1; iw++)
                        sum += xp[ih * g->in_w + iw];
                yp[oh * g->out_w + ow] = sum / (float)((h1 - h0) * (w1 - w0));
            }
        }
    }
}

static int cpu_adaptive_avg_pool2d(ckpt_backend *b, const float *x, float *y,
                                   const ckpt_pool_geom *g)
{
    pool_job pj = {.x = x, .y = y, .g = g};
    int64_t per = g->in_h * g->in_w + g->out_h * g->out_w;
    par_for(b->impl, g->planes, per ? (PAR_GRAIN + per - 1) / per : 1, avg_pool_part, &pj);
    return CKPT_OK;
}

static void sigmoid_part(void *arg, int64_t lo, int64_t hi)
{
    const ew_job *e = arg;
    for (int64_t i = lo; i < hi; i++)
        e->y[i] = sigmoid1(e->x[i]);
}

static int cpu_sigmoid(ckpt_backend *b, const float *x, float *y, size_t n)
{
    ew_job e = {.x = x, .y = y};
    /* expf: some ten times relu's cost per value */
    par_for(b->impl, (int64_t)n, PAR_GRAIN / 16, sigmoid_part, &e);
    return CKPT_OK;
}

typedef struct softmax_job {
    const float *x;
    float *y;
    int64_t dim, inner;
} softmax_job;

/* rows LO..HI, row q = o * inner + i: x[o, :, i] */
static void softmax_part(void *arg, int64_t lo, int64_t hi)
{
    const softmax_job *j = arg;
    int64_t dim = j->dim, inner = j->inner;
    for (int64_t q = lo; q < hi; q++) {
        int64_t o = q / inner, i = q % inner;
        const float *xp = j->x + o * dim * inner + i;
        float *yp = j->y + o * dim * inner + i;
        float mx = -INFINITY;
        for (int64_t d = 0; d < dim; d++)
            if (xp[d * inner] > mx || isnan(xp[d * inner]))
                mx = xp[d * inner];
        float sum = 0.0f;
        for (int64_t d = 0; d < dim; d++) {
            float e = expf(xp[d * inner] - mx);
            yp[d * inner] = e;
            sum += e;
        }
        for (int64_t d = 0; d < dim; d++)
            yp[d * inner] /= sum;
    }
}

static int cpu_softmax(ckpt_backend *b, const float *x, float *y, int64_t outer, int64_t dim,
                       int64_t inner)
{
    softmax_job j = {.x = x, .y = y, .dim = dim, .inner = inner};
    int64_t per = 8 * dim; /* an expf and a division a value, three passes */
    par_for(b->impl, outer * inner, per ? (PAR_GRAIN + per - 1) / per : 1, softmax_part, &j);
    return CKPT_OK;
}

typedef struct permute_job {
    const float *x;
    float *y;
    int ndim;
    int64_t oshape[CKPT_RT_MAX_DIMS], ostride[CKPT_RT_MAX_DIMS];
} permute_job;

/* output elements LO..HI, walked as an odometer from LO's index */
static void permute_part(void *arg, int64_t lo, int64_t hi)
{
    const permute_job *j = arg;
    int ndim = j->ndim;
    int64_t idx[CKPT_RT_MAX_DIMS] = {0}, src = 0, rest = lo;
    for (int i = ndim - 1; i >= 0; i--) {
        idx[i] = rest % j->oshape[i];
        rest /= j->oshape[i];
        src += idx[i] * j->ostride[i];
    }
    for (int64_t k = lo; k < hi; k++) {
        j->y[k] = j->x[src];
        for (int i = ndim - 1; i >= 0; i--) {
            if (++idx[i] < j->oshape[i]) {
                src += j->ostride[i];
                break;
            }
            src -= j->ostride[i] * (j->oshape[i] - 1);
            idx[i] = 0;
        }
    }
}

static int cpu_permute(ckpt_backend *b, const float *x, float *y, int ndim,
                       const int64_t *shape, const int *perm)
{
    permute_job j = {.x = x, .y = y, .ndim = ndim};
    int64_t xstride[CKPT_RT_MAX_DIMS];
    int64_t total = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        xstride[i] = total;
        total *= shape[i];
    }
    for (int i = 0; i < ndim; i++) {
        j.oshape[i] = shape[perm[i]];
        j.ostride[i] = xstride[perm[i]]; /* input stride of output axis i */
    }
    par_for(b->impl, total, PAR_GRAIN, permute_part, &j);
    return CKPT_OK;
}

typedef struct rows_job {
    const float *x;
    float *y;
    int64_t x_stride, y_stride, len;
} rows_job;

static void copy_rows_part(void *arg, int64_t lo, int64_t hi)
{
    const rows_job *j = arg;
    for (int64_t r = lo; r < hi; r++)
        memcpy(j->y + r * j->y_stride, j->x + r * j->x_stride, (size_t)j->len * sizeof(float));
}

static int cpu_copy_rows(ckpt_backend *b, const float *x, int64_t x_stride, float *y,
                         int64_t y_stride, int64_t rows, int64_t len)
{
    rows_job j = {.x = x, .y = y, .x_stride = x_stride, .y_stride = y_stride, .len = len};
    par_for(b->impl, rows, len ? (4 * PAR_GRAIN + len - 1) / len : 1, copy_rows_part, &j);
    return CKPT_OK;
}

typedef struct lstm_job {
    const float *gx, *gh, *bias_hh;
    float *c, *h, *y;
    int64_t hidden, y_stride;
} lstm_job;

/* rows LO..HI of the batch */
static void lstm_part(void *arg, int64_t lo, int64_t hi)
{
    const lstm_job *l = arg;
    int64_t hidden = l->hidden;
    for (int64_t r = lo; r < hi; r++) {
        const float *gxr = l->gx + r * 4 * hidden;
        const float *ghr = l->gh ? l->gh + r * 4 * hidden : l->bias_hh;
        float *cr = l->c + r * hidden, *hr = l->h + r * hidden, *yr = l->y + r * l->y_stride;
        for (int64_t j = 0; j < hidden; j++) {
            float g4[4];
            for (int q = 0; q < 4; q++)
                g4[q] = gxr[q * hidden + j] + (ghr ? ghr[q * hidden + j] : 0.0f);
            float i = 1.0f / (1.0f + expf(-g4[0])), f = 1.0f / (1.0f + expf(-g4[1]));
            float g = tanhf(g4[2]), o = 1.0f / (1.0f + expf(-g4[3]));
            float cn = (l->gh ? f * cr[j] : 0.0f) + i * g;
            cr[j] = cn;
            hr[j] = yr[j] = o * tanhf(cn);
        }
    }
}

static int cpu_lstm_cell(ckpt_backend *b, const float *gx, const float *gh,
                         const float *bias_hh, float *c, float *h, float *y, int64_t batch,
                         int64_t hidden, int64_t y_stride)
{
    lstm_job l = {.gx = gx, .gh = gh, .bias_hh = bias_hh, .c = c, .h = h, .y = y,
                  .hidden = hidden, .y_stride = y_stride};
    /* 5 transcendental functions an element (~50 ns): 1/32 of the grain,
     * so that the CRNN's steps at batch 32 (8192 cells) use every thread */
    int64_t grain = hidden ? (PAR_GRAIN / 32 + hidden - 1) / hidden : 1;
    par_for(b->impl, batch, grain, lstm_part, &l);
    return CKPT_OK;
}

/* ---- the transformer ops (ABI 2) ---- */

/* The functions with exp_vec's selects: without trapping math (the flags
 * a NaN compare raises are not looked at) GCC turns them into blends and
 * vectorizes the loop; the values are the same. */
#if defined(__GNUC__) && !defined(__clang__)
#define VEC_MATH __attribute__((optimize("no-trapping-math")))
#else
#define VEC_MATH
#endif

/* exp(x) in float without a call, so that the loops around it vectorize
 * (glibc's expf is a call a value, 5 to 10 times torch's vector exp):
 * Cephes' expf, x = n ln2 + r with |r| <= ln2 / 2, a degree-6 polynomial
 * in r, times 2^n in two steps so that a subnormal result is rounded once;
 * within 2 ulp of exp, NaN and the infinities as expf.  Every value goes
 * through the same float operations, in a vector loop or its scalar tail:
 * the bits depend on the value alone, not on where a thread's chunk
 * starts. */
VEC_MATH static inline float exp_vec(float x)
{
    int nan = x != x;
    float c = nan ? 0.0f : x > 88.8f ? 88.8f : x < -104.0f ? -104.0f : x;
    /* n = round(c / ln2) (|c / ln2| <= 151: the 1.5 * 2^23 trick) */
    float n = (c * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = c - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    float y = p * r * r + r + 1.0f;
    /* 2^n as 2^(n / 2) 2^(n - n / 2): each a normal float for n in
     * [-151, 128] */
    int32_t k = (int32_t)n, k1 = k / 2, k2 = k - k1;
    union {
        int32_t i;
        float f;
    } s1 = {.i = (k1 + 127) * (1 << 23)}, s2 = {.i = (k2 + 127) * (1 << 23)};
    y = y * s1.f * s2.f;
    return nan ? x : y;
}

/* tanh(x) likewise: Cephes' tanhf, an odd polynomial below |x| = 0.625,
 * else 1 - 2 / (exp(2|x|) + 1) with x's sign; within 2 ulp; -0.0 and NaN
 * kept, +-1 at the infinities. */
VEC_MATH static inline float tanh_vec(float x)
{
    float a = fabsf(x), z = x * x;
    float p = -5.70498872745e-3f;
    p = p * z + 2.06390887954e-2f;
    p = p * z - 5.37397155531e-2f;
    p = p * z + 1.33314422036e-1f;
    p = p * z - 3.33332819422e-1f;
    float small = copysignf(x + x * (z * p), x);
    float big = copysignf(1.0f - 2.0f / (exp_vec(a + a) + 1.0f), x);
    return a < 0.625f ? small : big;
}

/* erf(x) as torch's vectorized CPU kernel computes it for GELU
 * (Abramowitz and Stegun 7.1.26: 1 - (a1 t + .. + a5 t^5) exp(-x^2), t =
 * 1 / (1 + p|x|), within 1.5e-7 of erf), with exp_vec: libm's erff, a
 * call a value, took four times torch's time for GELU. */
VEC_MATH static inline float erf_vec(float x)
{
    float t = 1.0f / (0.3275911f * fabsf(x) + 1.0f);
    float r = (((1.061405429f * t - 1.453152027f) * t + 1.421413741f) * t - 0.284496736f) * t +
              0.254829592f;
    return copysignf(1.0f - r * t * exp_vec(-(x * x)), x);
}

typedef struct unary_job {
    const float *x;
    float *y;
    int kind;
    float s;
} unary_job;

/* Elements LO..HI.  The switch is outside the loops, so that they
 * vectorize (sin and cos stay calls to libm's float functions).  GELU
 * (tanh) is written x / (1 + exp(-2u)), which equals 0.5 x (1 + tanh u)
 * without its cancellation where tanh u nears -1; pow follows torch's CPU
 * kernel: exponents 0 and 1 (fill, copy), 2, 3, -2 as products, 0.5, -0.5
 * and -1 as sqrt, rsqrt and reciprocal, any other through pow in double
 * (torch's std::pow(float, double)). */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && \
    !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
/* AVX2 where the CPU has it (no FMA: the same roundings as the SSE2 build) */
__attribute__((target_clones("avx2", "default")))
#endif
VEC_MATH
static void unary_part(void *arg, int64_t lo, int64_t hi)
{
    const unary_job *u = arg;
    const float *restrict x = u->x;
    float *restrict y = u->y;
    float s = u->s;
    int64_t i;
    switch (u->kind) {
    case CKPT_U_GELU:
        for (i = lo; i < hi; i++)
            y[i] = x[i] * 0.5f * (1.0f + erf_vec(x[i] * 0.70710678118654752f));
        break;
    case CKPT_U_GELU_TANH:
        for (i = lo; i < hi; i++) {
            float v = x[i], t = 0.79788456080286536f * (v + 0.044715f * v * v * v);
            y[i] = v / (1.0f + exp_vec(-2.0f * t));
        }
        break;
    case CKPT_U_SILU:
        for (i = lo; i < hi; i++)
            y[i] = x[i] / (1.0f + exp_vec(-x[i]));
        break;
    case CKPT_U_TANH:
        for (i = lo; i < hi; i++)
            y[i] = tanh_vec(x[i]);
        break;
    case CKPT_U_COS:
        for (i = lo; i < hi; i++)
            y[i] = cosf(x[i]);
        break;
    case CKPT_U_SIN:
        for (i = lo; i < hi; i++)
            y[i] = sinf(x[i]);
        break;
    case CKPT_U_NEG:
        for (i = lo; i < hi; i++)
            y[i] = -x[i];
        break;
    case CKPT_U_EXP:
        for (i = lo; i < hi; i++)
            y[i] = exp_vec(x[i]);
        break;
    case CKPT_U_SQRT:
        for (i = lo; i < hi; i++)
            y[i] = sqrtf(x[i]);
        break;
    case CKPT_U_RSQRT:
        for (i = lo; i < hi; i++)
            y[i] = 1.0f / sqrtf(x[i]);
        break;
    case CKPT_U_POW:
        if (s == 0.0f)
            for (i = lo; i < hi; i++)
                y[i] = 1.0f;
        else if (s == 1.0f)
            for (i = lo; i < hi; i++)
                y[i] = x[i];
        else if (s == 2.0f)
            for (i = lo; i < hi; i++)
                y[i] = x[i] * x[i];
        else if (s == 3.0f)
            for (i = lo; i < hi; i++)
                y[i] = x[i] * x[i] * x[i];
        else if (s == -2.0f)
            for (i = lo; i < hi; i++)
                y[i] = 1.0f / (x[i] * x[i]);
        else if (s == 0.5f)
            for (i = lo; i < hi; i++)
                y[i] = sqrtf(x[i]);
        else if (s == -0.5f)
            for (i = lo; i < hi; i++)
                y[i] = 1.0f / sqrtf(x[i]);
        else if (s == -1.0f)
            for (i = lo; i < hi; i++)
                y[i] = 1.0f / x[i];
        else
            for (i = lo; i < hi; i++)
                y[i] = (float)pow((double)x[i], (double)s);
        break;
    case CKPT_U_ADD:
        for (i = lo; i < hi; i++)
            y[i] = x[i] + s;
        break;
    case CKPT_U_SUB:
        for (i = lo; i < hi; i++)
            y[i] = x[i] - s;
        break;
    case CKPT_U_RSUB:
        for (i = lo; i < hi; i++)
            y[i] = s - x[i];
        break;
    case CKPT_U_MUL:
        for (i = lo; i < hi; i++)
            y[i] = x[i] * s;
        break;
    default: /* CKPT_U_DIV: a division, as torch's (not a product by 1 / s) */
        for (i = lo; i < hi; i++)
            y[i] = x[i] / s;
        break;
    }
}

static int cpu_unary(ckpt_backend *b, int kind, const float *x, float *y, size_t n, float s)
{
    if (kind < 0 || kind >= CKPT_U_COUNT)
        return ckpt_backend_fail(b, CKPT_ERR_USAGE, "unknown element-wise function %d", kind);
    unary_job u = {.x = x, .y = y, .kind = kind, .s = s};
    /* a libm call a value (~10 ns) for sin, cos and pow, a polynomial
     * (~1 ns) for exp_vec's, a pass for the rest */
    int64_t grain = kind == CKPT_U_COS || kind == CKPT_U_SIN || kind == CKPT_U_POW
                        ? PAR_GRAIN / 16
                    : kind <= CKPT_U_TANH || kind == CKPT_U_EXP ? PAR_GRAIN / 4
                                                                : 2 * PAR_GRAIN;
    par_for(b->impl, (int64_t)n, grain, unary_part, &u);
    return CKPT_OK;
}

/* SHAPE and up to two operands' STRIDES with dims of size 1 dropped and
 * each dim merged into the next where both operands step over it as one
 * (a contiguous or wholly broadcast run): most broadcasts become one or two
 * dims, whose inner loops vectorize.  Returns the dims left (at least 1);
 * *NUMEL the elements (0: nothing to do). */
static int nd_simplify(int ndim, const int64_t *shape, const int64_t *s1, const int64_t *s2,
                       int64_t *oshape, int64_t *o1, int64_t *o2, int64_t *numel)
{
    int nd = 0;
    *numel = 1;
    for (int d = 0; d < ndim; d++) {
        *numel *= shape[d];
        if (shape[d] == 1)
            continue;
        if (nd > 0 && o1[nd - 1] == s1[d] * shape[d] && (!s2 || o2[nd - 1] == s2[d] * shape[d])) {
            oshape[nd - 1] *= shape[d];
            o1[nd - 1] = s1[d];
            if (s2)
                o2[nd - 1] = s2[d];
            continue;
        }
        oshape[nd] = shape[d];
        o1[nd] = s1[d];
        o2[nd] = s2 ? s2[d] : 0;
        nd++;
    }
    if (nd == 0) {
        oshape[0] = 1;
        o1[0] = o2[0] = 0;
        nd = 1;
    }
    return nd;
}

typedef struct nd_job {
    const float *a, *x;
    float *y;
    int kind, ndim;
    int64_t shape[CKPT_RT_MAX_DIMS], sa[CKPT_RT_MAX_DIMS], sx[CKPT_RT_MAX_DIMS];
} nd_job;

/* Where row R (an index over every dim but the last) starts in the two
 * operands. */
static void nd_row_start(const nd_job *j, int64_t r, int64_t *idx, int64_t *pa, int64_t *px)
{
    *pa = *px = 0;
    for (int d = j->ndim - 2; d >= 0; d--) {
        idx[d] = r % j->shape[d];
        r /= j->shape[d];
        *pa += idx[d] * j->sa[d];
        *px += idx[d] * j->sx[d];
    }
}

/* The next row's offsets, as an odometer */
static void nd_row_next(const nd_job *j, int64_t *idx, int64_t *pa, int64_t *px)
{
    for (int d = j->ndim - 2; d >= 0; d--) {
        if (++idx[d] < j->shape[d]) {
            *pa += j->sa[d];
            *px += j->sx[d];
            return;
        }
        *pa -= j->sa[d] * (j->shape[d] - 1);
        *px -= j->sx[d] * (j->shape[d] - 1);
        idx[d] = 0;
    }
}

/* y[0 .. n) = a[i * sa] OP x[i * sx], the contiguous and broadcast cases
 * written out so that they vectorize */
#define BIN_ROW(OP)                                                                  \
    do {                                                                             \
        if (sa == 1 && sx == 1)                                                      \
            for (int64_t i = 0; i < n; i++)                                          \
                y[i] = a[i] OP x[i];                                                 \
        else if (sa == 1 && sx == 0) {                                               \
            float xv = x[0];                                                         \
            for (int64_t i = 0; i < n; i++)                                          \
                y[i] = a[i] OP xv;                                                   \
        } else if (sa == 0 && sx == 1) {                                             \
            float av = a[0];                                                         \
            for (int64_t i = 0; i < n; i++)                                          \
                y[i] = av OP x[i];                                                   \
        } else                                                                       \
            for (int64_t i = 0; i < n; i++)                                          \
                y[i] = a[i * sa] OP x[i * sx];                                       \
    } while (0)

static void binary_row(int kind, const float *restrict a, int64_t sa, const float *restrict x,
                       int64_t sx, float *restrict y, int64_t n)
{
    switch (kind) {
    case CKPT_B_ADD:
        BIN_ROW(+);
        break;
    case CKPT_B_SUB:
        BIN_ROW(-);
        break;
    case CKPT_B_MUL:
        BIN_ROW(*);
        break;
    default:
        BIN_ROW(/);
        break;
    }
}

/* rows LO..HI of y (rows of its last dim) */
static void binary_part(void *arg, int64_t lo, int64_t hi)
{
    const nd_job *j = arg;
    int64_t idx[CKPT_RT_MAX_DIMS], pa, px, len = j->shape[j->ndim - 1];
    nd_row_start(j, lo, idx, &pa, &px);
    for (int64_t r = lo; r < hi; r++) {
        binary_row(j->kind, j->a + pa, j->sa[j->ndim - 1], j->x + px, j->sx[j->ndim - 1],
                   j->y + r * len, len);
        nd_row_next(j, idx, &pa, &px);
    }
}

static int cpu_binary(ckpt_backend *b, int kind, const float *a, const float *x, float *y,
                      int ndim, const int64_t *shape, const int64_t *a_strides,
                      const int64_t *x_strides)
{
    if (kind < 0 || kind >= CKPT_B_COUNT)
        return ckpt_backend_fail(b, CKPT_ERR_USAGE, "unknown element-wise operator %d", kind);
    if (ndim < 0 || ndim > CKPT_RT_MAX_DIMS)
        return ckpt_backend_fail(b, CKPT_ERR_USAGE, "%d dims (at most %d)", ndim,
                                 CKPT_RT_MAX_DIMS);
    nd_job j = {.a = a, .x = x, .y = y, .kind = kind};
    int64_t numel;
    j.ndim = nd_simplify(ndim, shape, a_strides, x_strides, j.shape, j.sa, j.sx, &numel);
    if (numel <= 0)
        return CKPT_OK;
    int64_t len = j.shape[j.ndim - 1];
    par_for(b->impl, numel / len, (2 * PAR_GRAIN + len - 1) / len, binary_part, &j);
    return CKPT_OK;
}

/* rows LO..HI of y, read from x at the strides (sa) */
static void strided_part(void *arg, int64_t lo, int64_t hi)
{
    const nd_job *j = arg;
    int64_t idx[CKPT_RT_MAX_DIMS], pa, px, len = j->shape[j->ndim - 1];
    int64_t st = j->sa[j->ndim - 1];
    nd_row_start(j, lo, idx, &pa, &px);
    for (int64_t r = lo; r < hi; r++) {
        const float *restrict src = j->a + pa;
        float *restrict dst = j->y + r * len;
        if (st == 1)
            memcpy(dst, src, (size_t)len * sizeof(float));
        else if (st == 0)
            for (int64_t i = 0; i < len; i++)
                dst[i] = src[0];
        else
            for (int64_t i = 0; i < len; i++)
                dst[i] = src[i * st];
        nd_row_next(j, idx, &pa, &px);
    }
}

static int cpu_strided_copy(ckpt_backend *b, const float *x, int64_t offset, float *y, int ndim,
                            const int64_t *shape, const int64_t *strides)
{
    if (ndim < 0 || ndim > CKPT_RT_MAX_DIMS)
        return ckpt_backend_fail(b, CKPT_ERR_USAGE, "%d dims (at most %d)", ndim,
                                 CKPT_RT_MAX_DIMS);
    nd_job j = {.a = x + offset, .y = y};
    int64_t numel;
    j.ndim = nd_simplify(ndim, shape, strides, NULL, j.shape, j.sa, j.sx, &numel);
    if (numel <= 0)
        return CKPT_OK;
    int64_t len = j.shape[j.ndim - 1];
    par_for(b->impl, numel / len, (PAR_GRAIN + len - 1) / len, strided_part, &j);
    return CKPT_OK;
}

/* Sums in double over N floats: eight running sums (element i in sum i %
 * 8, so that the loop vectorizes), added pairwise, then the tail.  The
 * same order for every row, whatever thread takes it.  SHIFT is taken
 * from each element first, and the squares summed when SQUARES. */
#define SUM_LANES 8
static double row_sum(const float *restrict x, int64_t n, double shift, int squares)
{
    double acc[SUM_LANES] = {0};
    int64_t i = 0;
    if (squares)
        for (; i + SUM_LANES <= n; i += SUM_LANES)
            for (int l = 0; l < SUM_LANES; l++) {
                double v = (double)x[i + l] - shift;
                acc[l] += v * v;
            }
    else
        for (; i + SUM_LANES <= n; i += SUM_LANES)
            for (int l = 0; l < SUM_LANES; l++)
                acc[l] += (double)x[i + l] - shift;
    for (int w = SUM_LANES / 2; w >= 1; w /= 2)
        for (int l = 0; l < w; l++)
            acc[l] += acc[l + w];
    double s = acc[0];
    for (; i < n; i++) {
        double v = (double)x[i] - shift;
        s += squares ? v * v : v;
    }
    return s;
}

/* Sums of up to this many adjacent output elements are kept on the stack */
#define RED_BLOCK 256

typedef struct reduce_job {
    const float *x;
    float *y;
    int64_t dim, inner, blocks;
    int mean;
} reduce_job;

/* Blocks LO..HI (row o's block q: o * blocks + q) of up to RED_BLOCK
 * outputs: each a double sum over the reduced axis in ascending order (as
 * exact as torch's float cascade, whatever the length; row_sum's order
 * over the last dim), rounded once (the mean after the division) */
static void reduce_part(void *arg, int64_t lo, int64_t hi)
{
    const reduce_job *j = arg;
    double acc[RED_BLOCK];
    if (j->inner == 1) { /* over the last dim: row_sum's order */
        for (int64_t k = lo; k < hi; k++) {
            double sum = row_sum(j->x + k * j->dim, j->dim, 0.0, 0);
            j->y[k] = (float)(j->mean ? sum / (double)j->dim : sum);
        }
        return;
    }
    for (int64_t k = lo; k < hi; k++) {
        int64_t o = k / j->blocks, i0 = k % j->blocks * RED_BLOCK;
        int64_t len = j->inner - i0 < RED_BLOCK ? j->inner - i0 : RED_BLOCK;
        const float *xo = j->x + o * j->dim * j->inner + i0;
        for (int64_t i = 0; i < len; i++)
            acc[i] = 0.0;
        for (int64_t d = 0; d < j->dim; d++) {
            const float *restrict xd = xo + d * j->inner;
            for (int64_t i = 0; i < len; i++)
                acc[i] += xd[i];
        }
        float *yo = j->y + o * j->inner + i0;
        for (int64_t i = 0; i < len; i++)
            yo[i] = (float)(j->mean ? acc[i] / (double)j->dim : acc[i]);
    }
}

static int cpu_reduce(ckpt_backend *b, int kind, const float *x, float *y, int64_t outer,
                      int64_t dim, int64_t inner)
{
    if (kind < 0 || kind >= CKPT_R_COUNT)
        return ckpt_backend_fail(b, CKPT_ERR_USAGE, "unknown reduction %d", kind);
    reduce_job j = {.x = x, .y = y, .dim = dim, .inner = inner, .mean = kind == CKPT_R_MEAN,
                    .blocks = (inner + RED_BLOCK - 1) / RED_BLOCK};
    int64_t per = dim * (inner < RED_BLOCK ? inner : RED_BLOCK);
    par_for(b->impl, outer * j.blocks, per > 0 ? (PAR_GRAIN + per - 1) / per : 1, reduce_part,
            &j);
    return CKPT_OK;
}

typedef struct norm_job {
    const float *x, *w, *bias;
    float *y;
    int64_t d;
    float eps;
} norm_job;

/* rows LO..HI: the mean, then the variance about it (two passes, in
 * double: no cancellation), y = (x - mean) * rstd * w + bias rounded once */
static void layer_norm_part(void *arg, int64_t lo, int64_t hi)
{
    const norm_job *j = arg;
    int64_t d = j->d;
    for (int64_t r = lo; r < hi; r++) {
        const float *restrict xr = j->x + r * d;
        float *restrict yr = j->y + r * d;
        double mean = row_sum(xr, d, 0.0, 0) / (double)d;
        double var = row_sum(xr, d, mean, 1) / (double)d;
        double rstd = 1.0 / sqrt(var + (double)j->eps);
        if (j->w && j->bias)
            for (int64_t i = 0; i < d; i++)
                yr[i] = (float)(((double)xr[i] - mean) * rstd * j->w[i] + j->bias[i]);
        else if (j->w)
            for (int64_t i = 0; i < d; i++)
                yr[i] = (float)(((double)xr[i] - mean) * rstd * j->w[i]);
        else if (j->bias)
            for (int64_t i = 0; i < d; i++)
                yr[i] = (float)(((double)xr[i] - mean) * rstd + j->bias[i]);
        else
            for (int64_t i = 0; i < d; i++)
                yr[i] = (float)(((double)xr[i] - mean) * rstd);
    }
}

static int cpu_layer_norm(ckpt_backend *b, const float *x, const float *w, const float *bias,
                          float *y, int64_t rows, int64_t d, float eps)
{
    norm_job j = {.x = x, .w = w, .bias = bias, .y = y, .d = d, .eps = eps};
    int64_t per = 4 * d;
    par_for(b->impl, rows, per > 0 ? (PAR_GRAIN + per - 1) / per : 1, layer_norm_part, &j);
    return CKPT_OK;
}

/* rows LO..HI: y = x / sqrt(mean(x^2) + eps) * w, in double, rounded once */
static void rms_norm_part(void *arg, int64_t lo, int64_t hi)
{
    const norm_job *j = arg;
    int64_t d = j->d;
    for (int64_t r = lo; r < hi; r++) {
        const float *restrict xr = j->x + r * d;
        float *restrict yr = j->y + r * d;
        double rstd = 1.0 / sqrt(row_sum(xr, d, 0.0, 1) / (double)d + (double)j->eps);
        if (j->w)
            for (int64_t i = 0; i < d; i++)
                yr[i] = (float)((double)xr[i] * rstd * j->w[i]);
        else
            for (int64_t i = 0; i < d; i++)
                yr[i] = (float)((double)xr[i] * rstd);
    }
}

static int cpu_rms_norm(ckpt_backend *b, const float *x, const float *w, float *y, int64_t rows,
                        int64_t d, float eps)
{
    norm_job j = {.x = x, .w = w, .y = y, .d = d, .eps = eps};
    int64_t per = 3 * d;
    par_for(b->impl, rows, per > 0 ? (PAR_GRAIN + per - 1) / per : 1, rms_norm_part, &j);
    return CKPT_OK;
}

typedef struct embed_job {
    const float *ids, *w;
    float *y;
    int64_t d;
} embed_job;

static void embedding_part(void *arg, int64_t lo, int64_t hi)
{
    const embed_job *j = arg;
    for (int64_t i = lo; i < hi; i++)
        memcpy(j->y + i * j->d, j->w + (int64_t)j->ids[i] * j->d, (size_t)j->d * sizeof(float));
}

static int cpu_embedding(ckpt_backend *b, const float *ids, const float *w, float *y, int64_t n,
                         int64_t vocab, int64_t d)
{
    /* every id checked before any row is written (NaN fails the first test) */
    for (int64_t i = 0; i < n; i++) {
        float v = ids[i];
        if (!(v >= 0.0f) || (double)v >= (double)vocab || v != floorf(v))
            return ckpt_backend_fail(b, CKPT_ERR_USAGE,
                                     "token id %.9g is out of range for an embedding of %lld rows",
                                     (double)v, (long long)vocab);
    }
    embed_job j = {.ids = ids, .w = w, .y = y, .d = d};
    par_for(b->impl, n, d > 0 ? (4 * PAR_GRAIN + d - 1) / d : 1, embedding_part, &j);
    return CKPT_OK;
}

/* One product C [m, n] (ldc) = A B of raw operands (cpu_gemm_operand) on
 * the calling thread, in slot S's scratch: the own kernel's tasks in turn
 * (the same bits as on many threads: cpu_gemm.h) or the plain loop, B
 * then being row-major [k, n] at BM (ldb). */
static void product_alone(cpu_impl *c, unsigned s, int64_t m, int64_t n, int64_t k,
                          cpu_gemm_operand a, cpu_gemm_operand bo, const float *bm, int64_t ldb,
                          float *cm, int64_t ldc)
{
    if (c->gk) {
        cpu_gemm_call call = {.m = m, .n = n, .k = k, .a = a, .b = bo, .c = cm, .ldc = ldc};
        int64_t tasks = cpu_gemm_plan(c->gk, &call, 1);
        for (int64_t t = 0; t < tasks; t++)
            cpu_gemm_task(c->gk, &call, t, c->gscratch[s]);
    } else
        gemm_plain(0, m, n, k, a.raw, a.rs, bm, ldb, cm, ldc);
}

typedef struct matmul_job {
    cpu_impl *c;
    const float *a, *x;
    float *y;
    int64_t m, k, n, a_stride, x_stride;
} matmul_job;

/* products LO..HI, each whole on this thread */
static void matmul_part(void *arg, int64_t lo, int64_t hi)
{
    const matmul_job *j = arg;
    unsigned s = slot_take(j->c);
    for (int64_t t = lo; t < hi; t++) {
        const float *at = j->a + t * j->a_stride, *xt = j->x + t * j->x_stride;
        product_alone(j->c, s, j->m, j->n, j->k, (cpu_gemm_operand){.raw = at, .rs = j->k, .cs = 1},
                      (cpu_gemm_operand){.raw = xt, .rs = 1, .cs = j->n}, xt, j->n,
                      j->y + t * j->m * j->n, j->n);
    }
    slot_give(j->c, s);
}

/* A batch of products on the path linear takes (the own kernel, else
 * OpenBLAS, else the plain loops).  An operand is kept packed only when it
 * lies in a range last written by upload(): any other may be an op's
 * output, whose contents change without an upload.  A batch of small
 * products runs one product a thread. */
static int cpu_matmul(ckpt_backend *b, const float *a, const float *x, float *y, int64_t batch,
                      int64_t m, int64_t k, int64_t n, int64_t a_stride, int64_t x_stride)
{
    cpu_impl *c = b->impl;
    if (batch <= 0 || m <= 0 || n <= 0)
        return CKPT_OK;
    /* the same X for every product of a contiguous A: one product of batch
     * * m rows (every path computes an element alone from its row and
     * column, so the same values) */
    if (batch > 1 && x_stride == 0 && a_stride == m * k) {
        m *= batch;
        batch = 1;
    }
    double madds = (double)m * (double)n * (double)k;
    int rc;
    if (batch > 1 && c->thr.n > 1 && (c->gk || !c->sgemm) && (c->grain || madds < GEMM_ALONE)) {
        if (c->gk && (rc = gemm_scratch_ready(b)) != CKPT_OK)
            return rc;
        matmul_job j = {.c = c, .a = a, .x = x, .y = y, .m = m, .k = k, .n = n,
                        .a_stride = a_stride, .x_stride = x_stride};
        par_for(c, batch, madds >= PAR_GRAIN ? 1 : (int64_t)(PAR_GRAIN / (madds + 1)) + 1,
                matmul_part, &j);
        return CKPT_OK;
    }
    /* an operand that is one matrix in a range last written by upload() (a
     * parameter: GPT-2's Conv1D weight) packed once, kept as linear's are */
    const float *ap = NULL, *xp = NULL;
    if (c->gk && (batch == 1 || a_stride == 0) && uploaded(c, a, (size_t)(m * k)) &&
        !(ap = weight_packed(c, a, CPU_GEMM_A, m, k, k, 1)))
        return nomem(b);
    if (c->gk && (batch == 1 || x_stride == 0) && uploaded(c, x, (size_t)(k * n)) &&
        !(xp = weight_packed(c, x, CPU_GEMM_B, n, k, 1, n)))
        return nomem(b);
    for (int64_t t = 0; t < batch; t++) {
        const float *at = a + t * a_stride, *xt = x + t * x_stride;
        float *yt = y + t * m * n;
        if (c->gk) {
            cpu_gemm_call call = {.m = m, .n = n, .k = k, .a = {.raw = at, .rs = k, .cs = 1},
                                  .b = {.raw = xt, .rs = 1, .cs = n}, .c = yt, .ldc = n};
            if (ap)
                call.a = (cpu_gemm_operand){.packed = ap};
            if (xp)
                call.b = (cpu_gemm_operand){.packed = xp};
            if ((rc = gemm_run(b, &call)) != CKPT_OK)
                return rc;
        } else if (c->sgemm && m <= INT32_MAX && n <= INT32_MAX && k <= INT32_MAX && k > 0)
            c->sgemm(CBLAS_ROW_MAJOR, CBLAS_NO_TRANS, CBLAS_NO_TRANS, (int)m, (int)n, (int)k,
                     1.0f, at, (int)k, xt, (int)n, 0.0f, yt, (int)n);
        else
            gemm_plain_par(c, 0, m, n, k, at, k, xt, n, yt, n);
    }
    return CKPT_OK;
}

/* Query rows of one attention task: its scores, ATT_QBLK x kv_len, stay in
 * the thread's buffer */
#define ATT_QBLK 64

typedef struct attn_job {
    cpu_impl *c;
    const float *q, *k, *v, *mask;
    float *y;
    const float *kt; /* the plain loops' K transposed, [batch * kv_heads][head_dim][kv_len] */
    const ckpt_attn_geom *g;
    int64_t qblocks;
} attn_job;

/* Row I's scores SC (LEN of them, key J0 first) made probabilities in
 * place: scaled, masked (MASK's row, stride MS), causal keys past I at
 * -infinity, then torch's softmax (max subtracted, float sum in ascending
 * order, each divided by it).  A row whose every key is masked gives zeros:
 * torch 2.15's CPU kernel does (F.scaled_dot_product_attention with a row
 * of -inf, a float or a bool mask, on every path), not NaN. */
VEC_MATH
static void attn_softmax_row(float *restrict sc, int64_t len, float scale, const float *mrow,
                             int64_t ms, int causal, int64_t i)
{
    float mx = -INFINITY;
    for (int64_t j = 0; j < len; j++) {
        float s = sc[j] * scale;
        if (mrow)
            s += mrow[j * ms];
        if (causal && j > i)
            s = -INFINITY;
        sc[j] = s;
        if (s > mx || isnan(s))
            mx = s;
    }
    if (mx == -INFINITY) {
        for (int64_t j = 0; j < len; j++)
            sc[j] = 0.0f;
        return;
    }
    for (int64_t j = 0; j < len; j++) /* (apart from the sum: it vectorizes) */
        sc[j] = exp_vec(sc[j] - mx);
    float sum = 0.0f;
    for (int64_t j = 0; j < len; j++)
        sum += sc[j];
    for (int64_t j = 0; j < len; j++)
        sc[j] /= sum;
}

/* Tasks LO..HI: task it is query block it % qblocks of (batch, head) it /
 * qblocks.  Scores q k^T and then p v as products on this thread; with
 * CAUSAL, keys past the block's last row are left out of both (their
 * probabilities are 0: the sums are the same). */
static void attention_part(void *arg, int64_t lo, int64_t hi)
{
    const attn_job *j = arg;
    const ckpt_attn_geom *g = j->g;
    cpu_impl *c = j->c;
    int64_t e = g->head_dim, dv = g->v_dim, kv = g->kv_len, group = g->heads / g->kv_heads;
    unsigned s = slot_take(c);
    float *sc = c->cbuf[s];
    for (int64_t it = lo; it < hi; it++) {
        int64_t bh = it / j->qblocks, r0 = it % j->qblocks * ATT_QBLK;
        int64_t n = bh / g->heads, h = bh % g->heads, kvh = n * g->kv_heads + h / group;
        int64_t rows = g->q_len - r0 < ATT_QBLK ? g->q_len - r0 : ATT_QBLK;
        int64_t len = g->causal && r0 + rows < kv ? r0 + rows : kv;
        const float *qp = j->q + (bh * g->q_len + r0) * e, *kp = j->k + kvh * kv * e;
        const float *vp = j->v + kvh * kv * dv;
        float *yp = j->y + (bh * g->q_len + r0) * dv;
        if (len == 0) { /* no keys: nothing is seen */
            memset(yp, 0, (size_t)(rows * dv) * sizeof(float));
            continue;
        }
        product_alone(c, s, rows, len, e, (cpu_gemm_operand){.raw = qp, .rs = e, .cs = 1},
                      (cpu_gemm_operand){.raw = kp, .rs = e, .cs = 1},
                      j->kt ? j->kt + kvh * e * kv : NULL, kv, sc, len);
        for (int64_t r = 0; r < rows; r++) {
            int64_t i = r0 + r;
            const float *mrow = j->mask ? j->mask + n * g->mask_strides[0] +
                                              h * g->mask_strides[1] + i * g->mask_strides[2]
                                        : NULL;
            attn_softmax_row(sc + r * len, len, (float)g->scale, mrow, g->mask_strides[3],
                             g->causal, i);
        }
        product_alone(c, s, rows, dv, len, (cpu_gemm_operand){.raw = sc, .rs = len, .cs = 1},
                      (cpu_gemm_operand){.raw = vp, .rs = 1, .cs = dv}, vp, dv, yp, dv);
    }
    slot_give(c, s);
}

typedef struct kt_job {
    const float *k;
    float *kt;
    int64_t kv, e;
} kt_job;

/* K's heads LO..HI transposed, [kv_len, head_dim] -> [head_dim, kv_len] */
static void kt_part(void *arg, int64_t lo, int64_t hi)
{
    const kt_job *j = arg;
    for (int64_t hh = lo; hh < hi; hh++) {
        const float *src = j->k + hh * j->kv * j->e;
        float *dst = j->kt + hh * j->kv * j->e;
        for (int64_t r = 0; r < j->kv; r++)
            for (int64_t p = 0; p < j->e; p++)
                dst[p * j->kv + r] = src[r * j->e + p];
    }
}

/* The products on the own kernel when the backend uses it, else on the
 * plain loops (K transposed once for them): OpenBLAS is not called from the
 * pool's threads, and its own threads would each take a product far too
 * small to share (tens of thousands of multiply-adds). */
static int cpu_attention(ckpt_backend *b, const float *q, const float *k, const float *v,
                         const float *mask, float *y, const ckpt_attn_geom *g)
{
    cpu_impl *c = b->impl;
    if (g->kv_heads <= 0 || g->heads % g->kv_heads)
        return ckpt_backend_fail(b, CKPT_ERR_USAGE,
                                 "%lld query heads cannot share %lld key-value heads",
                                 (long long)g->heads, (long long)g->kv_heads);
    if (g->batch <= 0 || g->heads <= 0 || g->q_len <= 0 || g->v_dim <= 0)
        return CKPT_OK;
    int rc = c->gk ? gemm_scratch_ready(b) : CKPT_OK;
    if (rc == CKPT_OK)
        rc = slot_bufs_ready(b, (size_t)(ATT_QBLK * (g->kv_len > 0 ? g->kv_len : 1)));
    if (rc != CKPT_OK)
        return rc;
    attn_job j = {.c = c, .q = q, .k = k, .v = v, .mask = mask, .y = y, .g = g,
                  .qblocks = (g->q_len + ATT_QBLK - 1) / ATT_QBLK};
    if (!c->gk) {
        int64_t nh = g->batch * g->kv_heads;
        float *kt = scratch(c, (size_t)(nh * g->kv_len * g->head_dim));
        if (!kt)
            return nomem(b);
        kt_job t = {.k = k, .kt = kt, .kv = g->kv_len, .e = g->head_dim};
        int64_t per = g->kv_len * g->head_dim;
        par_for(c, nh, per > 0 ? (PAR_GRAIN + per - 1) / per : 1, kt_part, &t);
        j.kt = kt;
    }
    double per = (double)ATT_QBLK * (double)g->kv_len * (double)(g->head_dim + g->v_dim + 8);
    int64_t grain = per >= PAR_GRAIN ? 1 : (int64_t)(PAR_GRAIN / per) + 1;
    par_for(c, g->batch * g->heads * j.qblocks, grain, attention_part, &j);
    return CKPT_OK;
}

static int cpu_synchronize(ckpt_backend *b)
{
    (void)b;
    return CKPT_OK;
}

/* A model's input read where the caller keeps it: its copy (25 KB for the
 * MNIST MLP at batch 8, 17 MB for SSD300 at 16) cost the 2-thread forward
 * of the MLP a sixth of its time, the copied lines last read by the other
 * core.  It is not an uploaded range: nothing packed from it is kept. */
static const float *cpu_borrow(ckpt_backend *b, const float *host, size_t n)
{
    (void)b;
    (void)n;
    return host;
}

static const ckpt_backend_ops CPU_OPS = {
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .release = cpu_release,
    .upload = cpu_upload,
    .download = cpu_copy,
    .linear = cpu_linear,
    .conv2d = cpu_conv2d,
    .conv_transpose2d = cpu_conv_transpose2d,
    .max_pool2d = cpu_max_pool2d,
    .l2norm = cpu_l2norm,
    .relu = cpu_relu,
    .sigmoid = cpu_sigmoid,
    .softmax = cpu_softmax,
    .permute = cpu_permute,
    .copy_rows = cpu_copy_rows,
    .batch_norm = cpu_batch_norm,
    .add = cpu_add,
    .adaptive_avg_pool2d = cpu_adaptive_avg_pool2d,
    .lstm_cell = cpu_lstm_cell,
    .synchronize = cpu_synchronize,
    .conv2d_fused = cpu_conv2d_fused,
    .unary = cpu_unary,
    .binary = cpu_binary,
    .strided_copy = cpu_strided_copy,
    .reduce = cpu_reduce,
    .layer_norm = cpu_layer_norm,
    .rms_norm = cpu_rms_norm,
    .embedding = cpu_embedding,
    .matmul = cpu_matmul,
    .attention = cpu_attention,
    .borrow = cpu_borrow,
    .linear_relu = cpu_linear_relu,
    .conv_transpose2d_act = cpu_conv_transpose2d_act,
};

/* OpenBLAS, when present: found by soname at run time. */
static void load_blas(cpu_impl *c, char *desc, size_t cap)
{
#ifdef CKPT_BLAS_SONAME
    static const char *const names[] = {CKPT_BLAS_SONAME, "libopenblas.so.0", "libopenblas.so"};
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !c->blas; i++)
        if ((c->blas = dlopen(names[i], RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD)))
            c->blas_shared = 1; /* the process had it: others may be calling it */
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !c->blas; i++)
        c->blas = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (c->blas) {
        c->sgemm = (sgemm_fn)(uintptr_t)dlsym(c->blas, "cblas_sgemm");
        if (!c->sgemm) {
            dlclose(c->blas);
            c->blas = NULL;
        }
    }
    if (c->sgemm) {
        typedef char *(*cfg_fn)(void);
        typedef int (*nt_fn)(void);
        cfg_fn cfg = (cfg_fn)(uintptr_t)dlsym(c->blas, "openblas_get_config");
        nt_fn nt = (nt_fn)(uintptr_t)dlsym(c->blas, "openblas_get_num_threads");
        cfg_fn core = (cfg_fn)(uintptr_t)dlsym(c->blas, "openblas_get_corename");
        char name[96] = "OpenBLAS";
        if (cfg) {
            /* "OpenBLAS 0.3.21 DYNAMIC_ARCH ..." : keep the name and version */
            const char *s = cfg();
            const char *sp = s ? strchr(s, ' ') : NULL;
            sp = sp ? strchr(sp + 1, ' ') : NULL;
            snprintf(name, sizeof name, "%.*s", s ? (int)(sp ? sp - s : (long)strlen(s)) : 8,
                     s ? s : "OpenBLAS");
        }
        /* the kernels it runs ("Haswell", "SkylakeX"): the speed depends on them */
        const char *cn = core ? core() : NULL;
        if (cn && *cn && strlen(name) + strlen(cn) + 2 < sizeof name)
            strcat(strcat(name, " "), cn);
        if (nt)
            snprintf(desc, cap, "cpu (float32, %s, %d threads)", name, nt());
        else
            snprintf(desc, cap, "cpu (float32, %s)", name);
        return;
    }
#endif
    snprintf(desc, cap, "cpu (float32, plain C reference loops)");
}

/* As many threads as OpenBLAS runs (OPENBLAS_NUM_THREADS, else the cores);
 * without it, the cores this process may run on. */
static int cpu_threads_wanted(const cpu_impl *c)
{
    if (c->blas) {
        typedef int (*nt_fn)(void);
        nt_fn nt = (nt_fn)(uintptr_t)dlsym(c->blas, "openblas_get_num_threads");
        if (nt)
            return nt();
    }
#ifdef CPU_COUNT
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        return CPU_COUNT(&set);
#endif
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)(n < MAX_THREADS ? n : MAX_THREADS) : 1;
}

/* With the own kernel OpenBLAS is loaded for its thread count only, but
 * its threads, started as it loads, look for work for about 0.1 s (2^28
 * cycles of sched_yield, its THREAD_TIMEOUT) before they sleep: holding
 * the cores the backend's own threads need while a small model's whole
 * benchmark runs (the MNIST MLP's 2000 forwards take 60 ms).  Stop them;
 * OpenBLAS starts them again at its next threaded call (as after a fork). */
static void quiet_blas(cpu_impl *c)
{
    if (!c->blas || c->blas_shared) /* (not while another caller's product runs) */
        return;
    typedef int (*shutdown_fn)(void);
    shutdown_fn sd = (shutdown_fn)(uintptr_t)dlsym(c->blas, "blas_thread_shutdown_");
    if (sd)
        sd();
}

/* PRODUCTS: NULL or "auto" (the own kernel where the CPU runs one, else
 * OpenBLAS, else the plain loops), "plain", "openblas" (else plain),
 * "avx512", "avx2" (that kernel, or CKPT_ERR_UNSUPPORTED). */
static int cpu_open(const char *products, int threads, ckpt_backend **out, char *err,
                    size_t cap)
{
    int plain = products && !strcmp(products, "plain");
    int blas_only = products && !strcmp(products, "openblas");
    const cpu_gemm_kernel *gk = NULL;
    if (!plain && !blas_only && !(gk = cpu_gemm_pick(products)) && products &&
        strcmp(products, "auto")) {
        snprintf(err, cap, "this CPU cannot run the %s kernel", products);
        return CKPT_ERR_UNSUPPORTED;
    }
    ckpt_backend *b = calloc(1, sizeof *b);
    /* aligned as its counters' cache lines are */
    cpu_impl *c = aligned_alloc(64, (sizeof *c + 63) / 64 * 64);
    if (c)
        memset(c, 0, sizeof *c);
    if (!b || !c) {
        free(b);
        free(c);
        snprintf(err, cap, "out of memory");
        return CKPT_ERR_NOMEM;
    }
    b->ops = &CPU_OPS;
    b->impl = c;
    b->refs = 1;
    snprintf(b->device, sizeof b->device, "cpu");
    if (plain)
        snprintf(b->description, sizeof b->description, "cpu (float32, plain C reference loops)");
    else /* with the own kernel too: OpenBLAS's thread count is the user's knob */
        load_blas(c, b->description, sizeof b->description);
    threads_init(&c->thr, threads > 0 ? threads : cpu_threads_wanted(c));
    if (gk) {
        c->gk = gk;
        c->thr.spin = 1;
        quiet_blas(c);
        snprintf(b->description, sizeof b->description, "cpu (float32, packed SGEMM %s, %d %s)",
                 cpu_gemm_name(gk), c->thr.n, c->thr.n == 1 ? "thread" : "threads");
    }
    *out = b;
    return CKPT_OK;
}

static int cpu_probe(char *why, size_t cap)
{
    (void)why;
    (void)cap;
    return 1;
}

/* The one device, "cpu" (index 0). */
static int cpu_open_device(int index, ckpt_backend **out, char *err, size_t cap)
{
    (void)index;
    return cpu_open(NULL, 0, out, err, cap);
}

int ckpt_backend_cpu_plain_open(ckpt_backend **out, char *err, size_t cap)
{
    return cpu_open("plain", 0, out, err, cap);
}

int ckpt_backend_cpu_open_threads(int plain, int threads, ckpt_backend **out, char *err,
                                  size_t cap)
{
    return cpu_open(plain ? "plain" : NULL, threads, out, err, cap);
}

int ckpt_backend_cpu_open_with(const char *products, int threads, ckpt_backend **out, char *err,
                               size_t cap)
{
    return cpu_open(products, threads, out, err, cap);
}

void ckpt_backend_cpu_set_grain(ckpt_backend *b, int64_t items)
{
    cpu_impl *c = b->impl;
    c->grain = items > 0 ? items : 0;
}

const ckpt_backend_desc ckpt_backend_cpu = {
    .name = "cpu",
    .title = "CPU",
    .indexed = 0,
    .fallback = 1,
    .probe = cpu_probe,
    .open = cpu_open_device,
};
