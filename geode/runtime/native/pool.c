/* geode native runtime: a thread pool for JIT-compiled kernels.

   One job at a time holds the pool (g_busy). The caller splits [0, nchunks) into one
   contiguous range per participant (itself = participant 0, workers 1..parts-1); each range
   lives in a cache-line slot as one 64-bit word packing the front (low 32 bits) and back
   (high 32 bits) offsets. The owner takes chunks from the front (fetch_add), idle
   participants steal from the back of other slots (compare-and-swap), so a chunk is claimed
   exactly once. Slots never refill during a job, so a participant that finds every slot
   empty is done.

   Publishing a job: write g_job and the slots, store the job's generation in g_open, then in
   g_gen (the word workers wait on), and wake the workers with a futex if any sleep. A worker
   joins by incrementing g_active and then checking that g_open still holds the generation it
   saw; the caller, once every chunk is claimed, closes the job (g_open = 0) and waits until
   g_active is 0. A late worker therefore never delays the caller by more than its join check,
   and never reads job fields that are being rewritten. Workers spin for spin_us after a job
   (catching back-to-back launches), then sleep on the futex: an idle pool uses no CPU.

   A stepped job (geode_parallel_steps) runs nsteps rounds of the same chunks in one launch.
   Its slot words pack the step they belong to (high 32 bits), the back (bits 16..31) and
   the front (bits 0..15); a claim is a compare-and-swap that also checks the step, so a
   participant that lags behind can never take a chunk of a step it has not reached. Every
   finished chunk increments g_steps_done (cumulative over the job); whoever finishes the
   last chunk of step s refills the slots for step s + 1 and publishes s + 1 in g_step (the
   futex word of the barrier). Nobody waits for a particular thread: a participant that is
   descheduled between chunks holds nothing back (the others take its chunks); one that is
   descheduled inside a chunk makes the others spin for at most GEODE_BARRIER_SPIN_US, then
   sleep on g_step until the step's last chunk is done. When the job ends every participant
   returns to the usual wait for the next job (spin_us, then sleep). */

#define _GNU_SOURCE
#include "pool.h"

#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#define GEODE_HAVE_MXCSR 1
#define MXCSR_STATUS_BITS 0x3Fu /* exception flags; everything else is control */
#endif

#define CACHE_LINE 64
#define DEFAULT_MAX_SLOT_CHUNKS ((int64_t)1 << 31) /* front/back must stay below 2^32 */

typedef struct {
    _Alignas(CACHE_LINE) _Atomic uint64_t range; /* front | back << 32, offsets from base */
    int64_t base;                                /* first chunk of this slot's range */
} slot_t;

typedef struct {
    geode_chunk_fn fn;
    void *ctx;
    int64_t nchunks; /* passed to fn (all rounds) */
    int64_t parts;   /* participants: slots 0..parts-1 */
    slot_t *slots;
    unsigned mxcsr;
    geode_step_fn step_fn; /* a stepped job: step_fn over nsteps steps (fn unused) */
    int64_t nsteps;        /* 0: a plain job */
    int64_t first_step;    /* step_fn's step of this job's step 0 */
} job_t;

/* Hot words, each on its own cache line. */
static _Alignas(CACHE_LINE) atomic_uint g_gen;      /* bumped per job and on quit; futex word */
static _Alignas(CACHE_LINE) atomic_uint g_open;     /* generation of the open job, 0: closed */
static _Alignas(CACHE_LINE) atomic_uint g_active;   /* workers inside a join; futex word */
static _Alignas(CACHE_LINE) atomic_int g_sleepers;  /* workers in (or entering) futex_wait */
static _Alignas(CACHE_LINE) atomic_int g_master_waiting;
static _Alignas(CACHE_LINE) atomic_int g_busy;      /* a job (or a resize) holds the pool */

static job_t g_job;             /* written by the pool holder while the job is closed */
static atomic_int g_quit;       /* workers exit on the next generation */
static atomic_llong g_pool_size; /* 0: not configured yet */
static atomic_llong g_spin_us = -1;
static atomic_llong g_max_slot_chunks = DEFAULT_MAX_SLOT_CHUNKS;
static atomic_ullong g_launches;
static atomic_ullong g_inline_runs;
static atomic_llong g_nworkers; /* running worker threads */
static atomic_ullong g_stepped_launches;
static atomic_ullong g_barrier_sleeps;

/* A stepped job's barrier: the step open for claims (futex word), its sleepers, and the
   chunks finished since the job began. */
static _Alignas(CACHE_LINE) atomic_uint g_step;
static _Alignas(CACHE_LINE) atomic_int g_step_sleepers;
static _Alignas(CACHE_LINE) atomic_llong g_steps_done;

#define STEP_MAX_SLOT_CHUNKS 0xFFFF /* a stepped slot's front and back are 16 bits */
#define STEP_MAX_STEPS ((int64_t)1 << 30) /* steps per stepped job (longer runs: several) */

/* Owned by the pool holder (g_busy). */
static int g_started;
static pthread_t *g_threads;
static slot_t *g_slots;
static int64_t g_slot_cap;
static unsigned g_start_gen;
static uint64_t g_spin_ns;

static _Thread_local int t_in_job; /* workers: always; the caller: during its job */

/* ---- small platform helpers ------------------------------------------------------------ */

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static inline uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

#ifdef __linux__
static void word_wait(atomic_uint *word, unsigned expected)
{
    syscall(SYS_futex, (unsigned *)word, FUTEX_WAIT_PRIVATE, expected, NULL, NULL, 0);
}

static void word_wake_all(atomic_uint *word)
{
    syscall(SYS_futex, (unsigned *)word, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}
#else
/* Portable fallback: one condition variable for both words. */
static pthread_mutex_t g_wait_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_wait_cond = PTHREAD_COND_INITIALIZER;

static void word_wait(atomic_uint *word, unsigned expected)
{
    pthread_mutex_lock(&g_wait_lock);
    if (atomic_load(word) == expected)
        pthread_cond_wait(&g_wait_cond, &g_wait_lock);
    pthread_mutex_unlock(&g_wait_lock);
}

static void word_wake_all(atomic_uint *word)
{
    (void)word;
    pthread_mutex_lock(&g_wait_lock);
    pthread_cond_broadcast(&g_wait_cond);
    pthread_mutex_unlock(&g_wait_lock);
}
#endif

static int64_t cpu_count(void)
{
#ifdef __linux__
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0)
            return n;
    }
#endif
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int64_t)n : 1;
}

/* A non-negative integer from the environment, or -1 when unset or malformed. */
static int64_t env_int(const char *name)
{
    const char *s = getenv(name);
    if (s == NULL || *s == '\0')
        return -1;
    char *end = NULL;
    long long v = strtoll(s, &end, 10);
    while (end && (*end == ' ' || *end == '\t' || *end == '\n'))
        end++;
    if (end == NULL || *end != '\0' || v < 0)
        return -1;
    return (int64_t)v;
}

static void ensure_config(void)
{
    if (atomic_load_explicit(&g_pool_size, memory_order_acquire) == 0) {
        int64_t n = env_int("GEODE_NUM_THREADS");
        if (n <= 0)
            n = cpu_count();
        if (n > GEODE_MAX_THREADS)
            n = GEODE_MAX_THREADS;
        long long zero = 0;
        atomic_compare_exchange_strong(&g_pool_size, &zero, (long long)n);
    }
    if (atomic_load_explicit(&g_spin_us, memory_order_acquire) < 0) {
        int64_t us = env_int("GEODE_SPIN_US");
        if (us < 0)
            us = GEODE_DEFAULT_SPIN_US;
        if (us > 1000000)
            us = 1000000;
        long long unset = -1;
        atomic_compare_exchange_strong(&g_spin_us, &unset, (long long)us);
    }
}

/* ---- the work loop ----------------------------------------------------------------------- */

static void participate(const job_t *job, int64_t me)
{
    slot_t *slots = job->slots;
    const int64_t parts = job->parts, n = job->nchunks;
    const geode_chunk_fn fn = job->fn;
    void *const ctx = job->ctx;

    slot_t *own = &slots[me];
    const int64_t base = own->base;
    for (;;) { /* own range, from the front */
        uint64_t old = atomic_fetch_add_explicit(&own->range, 1, memory_order_relaxed);
        uint32_t f = (uint32_t)old, b = (uint32_t)(old >> 32);
        if (f >= b)
            break;
        fn(ctx, base + f, n);
    }
    for (int64_t k = 1; k < parts; k++) { /* steal from the back of the others */
        slot_t *v = &slots[(me + k) % parts];
        const int64_t vbase = v->base;
        uint64_t cur = atomic_load_explicit(&v->range, memory_order_relaxed);
        for (;;) {
            uint32_t f = (uint32_t)cur, b = (uint32_t)(cur >> 32);
            if (f >= b)
                break;
            uint64_t next = ((uint64_t)(b - 1) << 32) | f;
            if (atomic_compare_exchange_weak_explicit(&v->range, &cur, next, memory_order_relaxed,
                                                      memory_order_relaxed)) {
                fn(ctx, vbase + (int64_t)(b - 1), n);
                cur = atomic_load_explicit(&v->range, memory_order_relaxed);
            }
        }
    }
}

static void participate_steps(const job_t *job, int64_t me);

static void run_part(const job_t *job, int64_t me)
{
    if (job->nsteps > 0)
        participate_steps(job, me);
    else
        participate(job, me);
}

static void join_job(int64_t id, unsigned gen)
{
    atomic_fetch_add(&g_active, 1);
    if (atomic_load(&g_open) == gen) {
        job_t job = g_job; /* stable: the caller waits for g_active == 0 before rewriting */
        if (id < job.parts) {
#ifdef GEODE_HAVE_MXCSR
            unsigned mine = _mm_getcsr();
            unsigned want = (job.mxcsr & ~MXCSR_STATUS_BITS) | (mine & MXCSR_STATUS_BITS);
            if (want != mine)
                _mm_setcsr(want);
            run_part(&job, id);
            if (want != mine)
                _mm_setcsr(mine);
#else
            run_part(&job, id);
#endif
        }
    }
    if (atomic_fetch_sub(&g_active, 1) == 1 && atomic_load(&g_master_waiting))
        word_wake_all(&g_active);
}

/* Waits until g_gen differs from seen: spins for spin_ns, then sleeps on the futex. */
static unsigned wait_new_gen(unsigned seen)
{
    unsigned g;
    if (g_spin_ns > 0) {
        uint64_t deadline = now_ns() + g_spin_ns;
        do {
            for (int i = 0; i < 64; i++) {
                g = atomic_load_explicit(&g_gen, memory_order_acquire);
                if (g != seen)
                    return g;
                cpu_relax();
            }
        } while (now_ns() < deadline);
    }
    for (;;) {
        atomic_fetch_add(&g_sleepers, 1);
        if (atomic_load(&g_gen) == seen)
            word_wait(&g_gen, seen);
        atomic_fetch_sub(&g_sleepers, 1);
        g = atomic_load(&g_gen);
        if (g != seen)
            return g;
    }
}

/* ---- stepped jobs: one launch, a barrier between steps -------------------------------- */

static inline uint64_t step_word(unsigned step, uint32_t back, uint32_t front)
{
    return ((uint64_t)step << 32) | ((uint64_t)back << 16) | (uint64_t)front;
}

/* Refills the slots for `step` and opens it (the previous step's chunks are all done). */
static void open_step(const job_t *job, unsigned step)
{
    const int64_t parts = job->parts;
    for (int64_t p = 0; p < parts; p++) {
        int64_t next = p + 1 < parts ? job->slots[p + 1].base : job->nchunks;
        uint32_t cnt = (uint32_t)(next - job->slots[p].base);
        atomic_store_explicit(&job->slots[p].range, step_word(step, cnt, 0), memory_order_release);
    }
    atomic_store(&g_step, step);
    if (atomic_load(&g_step_sleepers) > 0)
        word_wake_all(&g_step);
}

/* One chunk of `step` is done: the last one of the step opens the next (or ends the job). */
static void step_chunk_done(const job_t *job, unsigned step)
{
    long long done = atomic_fetch_add(&g_steps_done, 1) + 1;
    if (done == (long long)(step + 1) * job->nchunks) {
        if ((int64_t)step + 1 < job->nsteps) {
            open_step(job, step + 1);
        } else {
            atomic_store(&g_step, step + 1);
            if (atomic_load(&g_step_sleepers) > 0)
                word_wake_all(&g_step);
        }
    }
}

/* Claims the chunks of `step` it can: its own range from the front, then others' from the
   back (each claim checks the word's step). */
static void run_step_chunks(const job_t *job, int64_t me, unsigned step)
{
    const int64_t parts = job->parts, n = job->nchunks;
    const geode_step_fn fn = job->step_fn;
    void *const ctx = job->ctx;
    for (int64_t k = 0; k < parts; k++) {
        slot_t *v = &job->slots[(me + k) % parts];
        const int64_t vbase = v->base;
        uint64_t cur = atomic_load_explicit(&v->range, memory_order_acquire);
        for (;;) {
            uint32_t f = (uint32_t)cur & 0xFFFF, b = (uint32_t)(cur >> 16) & 0xFFFF;
            if ((unsigned)(cur >> 32) != step || f >= b)
                break;
            int own = k == 0;
            uint64_t next = own ? step_word(step, b, f + 1) : step_word(step, b - 1, f);
            if (atomic_compare_exchange_weak_explicit(&v->range, &cur, next, memory_order_acq_rel,
                                                      memory_order_acquire)) {
                fn(ctx, job->first_step + (int64_t)step, vbase + (int64_t)(own ? f : b - 1), n);
                step_chunk_done(job, step);
                cur = atomic_load_explicit(&v->range, memory_order_acquire);
            }
        }
    }
}

/* Waits until g_step differs from `step` (the step's chunks are all done): spins for at
   most GEODE_BARRIER_SPIN_US (never longer than the pool's spin_us: GEODE_SPIN_US=0 means
   no spinning), then sleeps on the futex. Returns the new step. */
static unsigned wait_step(unsigned step)
{
    unsigned g = atomic_load_explicit(&g_step, memory_order_acquire);
    if (g != step)
        return g; /* the usual case for the thread that finished the step */
    uint64_t spin = (uint64_t)GEODE_BARRIER_SPIN_US * 1000u;
    uint64_t deadline = now_ns() + (g_spin_ns < spin ? g_spin_ns : spin);
    do {
        for (int i = 0; i < 64; i++) {
            g = atomic_load_explicit(&g_step, memory_order_acquire);
            if (g != step)
                return g;
            cpu_relax();
        }
    } while (now_ns() < deadline);
    atomic_fetch_add_explicit(&g_barrier_sleeps, 1, memory_order_relaxed);
    for (;;) {
        atomic_fetch_add(&g_step_sleepers, 1);
        if (atomic_load(&g_step) == step)
            word_wait(&g_step, step);
        atomic_fetch_sub(&g_step_sleepers, 1);
        g = atomic_load(&g_step);
        if (g != step)
            return g;
    }
}

static void participate_steps(const job_t *job, int64_t me)
{
    unsigned step = atomic_load_explicit(&g_step, memory_order_acquire);
    while ((int64_t)step < job->nsteps) {
        run_step_chunks(job, me, step);
        step = wait_step(step);
    }
}

/* Adapts one step of a stepped job to geode_parallel_for (the fallback for huge chunk
   counts). */
typedef struct {
    geode_step_fn fn;
    void *ctx;
    int64_t step;
} one_step_t;

static void one_step_chunk(void *ctx, int64_t chunk, int64_t nchunks)
{
    const one_step_t *one = ctx;
    one->fn(one->ctx, one->step, chunk, nchunks);
}

static void *worker_main(void *arg)
{
    int64_t id = (int64_t)(intptr_t)arg;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, NULL); /* already inherited; kept for clarity */
    t_in_job = 1; /* anything a worker runs is inside a job: nested launches run inline */
    unsigned seen = g_start_gen;
    for (;;) {
        seen = wait_new_gen(seen);
        if (atomic_load(&g_quit))
            break;
        join_job(id, seen);
    }
    return NULL;
}

/* ---- pool lifetime (the caller holds g_busy) --------------------------------------------- */

static int try_acquire(void)
{
    int zero = 0;
    return atomic_load_explicit(&g_busy, memory_order_relaxed) == 0 &&
           atomic_compare_exchange_strong(&g_busy, &zero, 1);
}

static void release(void)
{
    atomic_store(&g_busy, 0);
}

static unsigned next_gen(void)
{
    unsigned g = atomic_load(&g_gen) + 1;
    return g == 0 ? 1 : g; /* 0 means "closed" in g_open */
}

static void start_workers(void)
{
    int64_t size = atomic_load(&g_pool_size);
    g_started = 1;
    g_spin_ns = (uint64_t)atomic_load(&g_spin_us) * 1000u;
    if (g_slot_cap < size) {
        void *mem = NULL;
        if (posix_memalign(&mem, CACHE_LINE, (size_t)size * sizeof(slot_t)) != 0)
            return; /* no slots: jobs run inline */
        free(g_slots);
        g_slots = mem;
        g_slot_cap = size;
    }
    g_threads = calloc((size_t)size, sizeof(pthread_t));
    if (g_threads == NULL)
        return;
    g_start_gen = atomic_load(&g_gen);

    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old); /* workers inherit a fully blocked mask */
    int64_t made = 0;
    for (int64_t id = 1; id < size; id++) {
        if (pthread_create(&g_threads[made], NULL, worker_main, (void *)(intptr_t)id) != 0)
            break;
#ifdef __GLIBC__
        pthread_setname_np(g_threads[made], "geode-worker");
#endif
        made++;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    atomic_store(&g_nworkers, made);
}

static void stop_workers(void)
{
    int64_t n = atomic_load(&g_nworkers);
    if (n > 0) {
        atomic_store(&g_quit, 1);
        atomic_store(&g_gen, next_gen());
        word_wake_all(&g_gen);
        for (int64_t i = 0; i < n; i++)
            pthread_join(g_threads[i], NULL);
        atomic_store(&g_quit, 0);
    }
    free(g_threads);
    g_threads = NULL;
    atomic_store(&g_nworkers, 0);
    g_started = 0;
}

static void wait_workers(void)
{
    if (atomic_load(&g_active) == 0)
        return;
    if (g_spin_ns > 0) {
        uint64_t deadline = now_ns() + g_spin_ns;
        do {
            for (int i = 0; i < 64; i++) {
                if (atomic_load_explicit(&g_active, memory_order_acquire) == 0)
                    return;
                cpu_relax();
            }
        } while (now_ns() < deadline);
    }
    atomic_store(&g_master_waiting, 1);
    unsigned a;
    while ((a = atomic_load(&g_active)) != 0)
        word_wait(&g_active, a);
    atomic_store(&g_master_waiting, 0);
}

/* One job over chunks [start, stop) with `parts` participants; the caller is participant 0. */
static void run_round(job_t *job, int64_t start, int64_t stop)
{
    int64_t len = stop - start, parts = job->parts;
    int64_t q = len / parts, r = len % parts;
    for (int64_t p = 0; p < parts; p++) {
        int64_t lo = start + p * q + (p < r ? p : r);
        int64_t cnt = q + (p < r ? 1 : 0);
        job->slots[p].base = lo;
        atomic_store_explicit(&job->slots[p].range, (uint64_t)cnt << 32, memory_order_relaxed);
    }
    g_job = *job;
    unsigned gen = next_gen();
    atomic_store(&g_open, gen);
    atomic_store(&g_gen, gen);
    if (atomic_load(&g_sleepers) > 0)
        word_wake_all(&g_gen);
    participate(job, 0);
    atomic_store(&g_open, 0); /* every chunk is claimed: no one joins any more */
    wait_workers();           /* ... and the joined ones finish theirs */
}

static void run_inline(geode_chunk_fn fn, void *ctx, int64_t nchunks)
{
    atomic_fetch_add_explicit(&g_inline_runs, 1, memory_order_relaxed);
    for (int64_t c = 0; c < nchunks; c++)
        fn(ctx, c, nchunks);
}

GEODE_EXPORT int64_t geode_num_threads(void)
{
    int64_t n = atomic_load_explicit(&g_pool_size, memory_order_acquire);
    if (n > 0)
        return n;
    ensure_config();
    return atomic_load(&g_pool_size);
}

GEODE_EXPORT void geode_launch(geode_chunk_fn fn, void *ctx, int64_t ext, int64_t threads,
                               bool small)
{
    if (ext < 1)
        return;
    if (!small) {
        int64_t t = threads > 0 ? threads : geode_num_threads();
        int64_t cap = t * GEODE_CHUNKS_PER_THREAD;
        int64_t n = ext < cap ? ext : cap;
        if (n >= 2 && t >= 2) {
            geode_parallel_for(fn, ctx, n, t);
            return;
        }
    }
    fn(ctx, 0, 1);
}

/* The participants of a job of nchunks chunks on at most nthreads threads (0: the pool's
   size), the caller included; starts the workers on first use. */
static int64_t job_parts(int64_t nchunks, int64_t nthreads)
{
    ensure_config();
    if (!g_started)
        start_workers();
    int64_t parts = atomic_load(&g_nworkers) + 1;
    if (nthreads > 0 && nthreads < parts)
        parts = nthreads;
    if (parts > nchunks)
        parts = nchunks;
    return parts;
}

GEODE_EXPORT void geode_parallel_for(geode_chunk_fn fn, void *ctx, int64_t nchunks,
                                     int64_t nthreads)
{
    if (nchunks <= 0)
        return;
    if (t_in_job || nthreads == 1 || nchunks == 1 || geode_num_threads() == 1 || !try_acquire()) {
        run_inline(fn, ctx, nchunks);
        return;
    }
    int64_t parts = job_parts(nchunks, nthreads);
    if (parts <= 1 || g_slots == NULL) {
        release();
        run_inline(fn, ctx, nchunks);
        return;
    }
    atomic_fetch_add_explicit(&g_launches, 1, memory_order_relaxed);
    t_in_job = 1;
    job_t job = {fn, ctx, nchunks, parts, g_slots, 0};
#ifdef GEODE_HAVE_MXCSR
    job.mxcsr = _mm_getcsr();
#endif
    int64_t round = parts * atomic_load(&g_max_slot_chunks);
    for (int64_t start = 0; start < nchunks;) {
        int64_t stop = nchunks - start > round ? start + round : nchunks;
        run_round(&job, start, stop);
        start = stop;
    }
    t_in_job = 0;
    release();
}

/* Runs steps [first, first + nsteps) of fn as one stepped job (the caller holds the pool,
   parts >= 2, at most STEP_MAX_SLOT_CHUNKS chunks per slot). */
static void run_stepped(geode_step_fn fn, void *ctx, int64_t nsteps, int64_t nchunks,
                        int64_t parts, int64_t first)
{
    job_t job = {NULL, ctx, nchunks, parts, g_slots, 0, fn, nsteps, first};
#ifdef GEODE_HAVE_MXCSR
    job.mxcsr = _mm_getcsr();
#endif
    int64_t q = nchunks / parts, r = nchunks % parts;
    for (int64_t p = 0; p < parts; p++)
        job.slots[p].base = p * q + (p < r ? p : r);
    atomic_store(&g_steps_done, 0);
    open_step(&job, 0);
    g_job = job;
    unsigned gen = next_gen();
    atomic_store(&g_open, gen);
    atomic_store(&g_gen, gen);
    if (atomic_load(&g_sleepers) > 0)
        word_wake_all(&g_gen);
    participate_steps(&job, 0);
    atomic_store(&g_open, 0); /* every step is done: no one joins any more */
    wait_workers();           /* ... and the joined ones have seen the end */
}

GEODE_EXPORT void geode_parallel_steps(geode_step_fn fn, void *ctx, int64_t nsteps,
                                       int64_t nchunks, int64_t nthreads)
{
    if (nsteps <= 0 || nchunks <= 0)
        return;
    if (t_in_job || nthreads == 1 || nchunks == 1 || geode_num_threads() == 1 || !try_acquire()) {
        atomic_fetch_add_explicit(&g_inline_runs, 1, memory_order_relaxed);
        for (int64_t s = 0; s < nsteps; s++)
            for (int64_t c = 0; c < nchunks; c++)
                fn(ctx, s, c, nchunks);
        return;
    }
    int64_t parts = job_parts(nchunks, nthreads);
    if (parts <= 1 || g_slots == NULL || (nchunks + parts - 1) / parts > STEP_MAX_SLOT_CHUNKS) {
        release(); /* too many chunks per slot for a stepped word: a launch per step */
        for (int64_t s = 0; s < nsteps; s++) {
            one_step_t one = {fn, ctx, s};
            geode_parallel_for(one_step_chunk, &one, nchunks, nthreads);
        }
        return;
    }
    atomic_fetch_add_explicit(&g_launches, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&g_stepped_launches, 1, memory_order_relaxed);
    t_in_job = 1;
    for (int64_t first = 0; first < nsteps; first += STEP_MAX_STEPS) {
        int64_t count = nsteps - first < STEP_MAX_STEPS ? nsteps - first : STEP_MAX_STEPS;
        run_stepped(fn, ctx, count, nchunks, parts, first);
    }
    t_in_job = 0;
    release();
}

/* Runs fn(ctx, c, n) for c in [0, n) on n threads at once (the caller is one), for work whose
   chunks wait on each other (OpenBLAS's level-3 threads do). Waits while another thread's job
   holds the pool. Returns 0, running nothing, when it cannot promise n concurrent threads:
   called from inside a job, or the pool has fewer than n threads. A participant only steals
   a chunk after finishing its own, so every chunk runs on a thread that waits for nothing. */
int geode_pool_run_concurrent(geode_chunk_fn fn, void *ctx, int64_t n)
{
    if (n <= 1) {
        if (n == 1)
            fn(ctx, 0, 1);
        return 1;
    }
    if (t_in_job || n > geode_num_threads())
        return 0;
    while (!try_acquire()) {
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
    }
    ensure_config();
    if (!g_started)
        start_workers();
    if (atomic_load(&g_nworkers) + 1 < n || g_slots == NULL) {
        release();
        return 0;
    }
    atomic_fetch_add_explicit(&g_launches, 1, memory_order_relaxed);
    t_in_job = 1;
    job_t job = {fn, ctx, n, n, g_slots, 0};
#ifdef GEODE_HAVE_MXCSR
    job.mxcsr = _mm_getcsr();
#endif
    run_round(&job, 0, n);
    t_in_job = 0;
    release();
    return 1;
}

/* ---- internal API for the Python module -------------------------------------------------- */

int geode_pool_in_job(void)
{
    return t_in_job;
}

void geode_pool_resize(int64_t n)
{
    while (!try_acquire()) {
        struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
    }
    ensure_config();
    stop_workers();
    atomic_store(&g_pool_size, n); /* workers restart lazily at the next job */
    release();
    geode_blas_follow_pool(n);
}

void geode_pool_get_stats(geode_pool_stats *out)
{
    ensure_config();
    out->threads = atomic_load(&g_pool_size);
    out->spin_us = atomic_load(&g_spin_us);
    out->workers_running = atomic_load(&g_nworkers);
    out->launches = atomic_load(&g_launches);
    out->inline_runs = atomic_load(&g_inline_runs);
    out->stepped_launches = atomic_load(&g_stepped_launches);
    out->barrier_sleeps = atomic_load(&g_barrier_sleeps);
}

int64_t geode_pool_set_max_slot_chunks(int64_t n)
{
    if (n < 1 || n > DEFAULT_MAX_SLOT_CHUNKS)
        n = DEFAULT_MAX_SLOT_CHUNKS;
    return atomic_exchange(&g_max_slot_chunks, n);
}

/* In a forked child only the forking thread exists: forget the workers (their memory is
   abandoned, not freed, as the parent may have been changing it) and start again lazily. */
static void after_fork_child(void)
{
    g_threads = NULL;
    g_slots = NULL;
    g_slot_cap = 0;
    g_started = 0;
    atomic_store(&g_nworkers, 0);
    atomic_store(&g_busy, 0);
    atomic_store(&g_open, 0);
    atomic_store(&g_active, 0);
    atomic_store(&g_sleepers, 0);
    atomic_store(&g_master_waiting, 0);
    atomic_store(&g_quit, 0);
    atomic_store(&g_step_sleepers, 0);
    t_in_job = 0;
}

void geode_pool_init(void)
{
    static int done = 0;
    if (!done) { /* called with the GIL held, from module init */
        done = 1;
        pthread_atfork(NULL, NULL, after_fork_child);
    }
}
