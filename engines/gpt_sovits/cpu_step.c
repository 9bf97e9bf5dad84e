/* The GPT's decode layers for one step on a CPU, fused into one call (see cpu_step.py for why and how it is built).
 *
 * One call runs every transformer layer for B rows: the QKV projection, the new token's K/V written into the static
 * cache, one-query attention over each row's cached positions, the output projection, both post-LN residuals and
 * the ReLU MLP. Matrix-vector products read each weight row once for all B rows (the batch-1 step is bound by the
 * memory read of the weights, so nothing else matters as much). Weights are fp32, or int8 per output channel with a
 * fp32 scale (weight-only: activations stay fp32, so the only rounding is the weights'). The cache is fp32 or bf16.
 *
 * Work is split by output rows between `threads` threads (the caller and threads-1 workers) that meet at a barrier
 * after each product. Waiting threads spin briefly and then yield the core, so a busy neighbour process on the same
 * cores costs a time slice now and then, not every barrier.
 */
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define VB_AVX2 1
#endif

#define VB_MAX_ROWS 16   /* rows (batch) one call decodes */
#define VB_MAX_THREADS 8

enum { W_FP32 = 0, W_INT8 = 1 };
enum { KV_FP32 = 0, KV_BF16 = 1 };

/* Per layer, in this order: qkv, out, ffn1, ffn2 as (weight, scale or NULL, bias); norm1 (g, b); norm2 (g, b);
 * then the layer's cache. 17 pointers per layer. */
enum { P_QKV = 0, P_OUT = 3, P_FF1 = 6, P_FF2 = 9, P_N1 = 12, P_N2 = 14, P_KV = 16, P_PER_LAYER = 17 };

typedef struct {
    const void *w;        /* [out, in] fp32, or int8 with `scale` */
    const float *scale;   /* [out] per output channel (int8), or NULL */
    const float *bias;    /* [out] or NULL */
    int out, in;
    int relu;
    const float *x;       /* [B, in] */
    const int16_t *xq;    /* [B, in] x in 15-bit integers (int8 weights only), see quantize_rows */
    const float *xscale;  /* [B] x = xq * xscale */
    float *y;             /* [B, out] */
} gemv_job;

/* ------------------------------------------------------------------------------------------------ dot products */

#ifdef VB_AVX2
static inline float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline int32_t hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}
#endif

/* Activations for int8 weights: each row of x as 15-bit integers and a scale. With |w| <= 127 and |x| <= 16383 a
 * pair sum of vpmaddwd is below 2^22 and a 2048-long dot below 2^31, so nothing saturates or overflows; the relative
 * rounding of x (3e-5) is far below the weights' own. */
static void quantize_rows(const float *x, int B, int n, int16_t *xq, float *xscale) {
    for (int b = 0; b < B; b++) {
        const float *xr = x + (size_t)b * n;
        float amax = 0;
        for (int k = 0; k < n; k++) amax = fmaxf(amax, fabsf(xr[k]));
        const float sc = amax > 0 ? amax / 16383.0f : 1.0f, inv = 1.0f / sc;
        int k = 0;
#ifdef VB_AVX2
        const __m256 vi = _mm256_set1_ps(inv);
        for (; k + 16 <= n; k += 16) {  /* round to nearest (MXCSR default), pack to int16 in order */
            __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xr + k), vi));
            __m256i c = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xr + k + 8), vi));
            __m256i pk = _mm256_permute4x64_epi64(_mm256_packs_epi32(a, c), 0xD8);
            _mm256_storeu_si256((__m256i *)(xq + (size_t)b * n + k), pk);
        }
#endif
        for (; k < n; k++) xq[(size_t)b * n + k] = (int16_t)lrintf(xr[k] * inv);
        xscale[b] = sc;
    }
}

#ifdef VB_AVX2
/* acc[i] = dot(wr, xq[i]) * xscale[i] for nb (2-4, a constant where inlined) rows of x: each 16 weights are widened
 * to int16 once for all nb rows rather than once per row. Above one row the int8 step is bound by these
 * instructions, not by the memory (see FINDINGS.md#grouped-int8-rows).
 * The integer sums are exact, so a row decoded in a batch equals the row decoded alone. */
static inline __attribute__((always_inline)) void dot_i8_group(const int8_t *wr, const int16_t *xq, int n, int nb,
                                                               const float *xscale, float *acc) {
    __m256i s[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
    for (int k = 0; k < n; k += 16) {
        const __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(wr + k)));
        for (int i = 0; i < nb; i++)
            s[i] = _mm256_add_epi32(s[i], _mm256_madd_epi16(w, _mm256_loadu_si256((const __m256i *)(xq + (size_t)i * n + k))));
    }
    for (int i = 0; i < nb; i++) acc[i] = (float)hsum_epi32(s[i]) * xscale[i];
}
#endif

/* y[b][r] = act(scale[r] * dot(w[r], x[b]) + bias[r]) for rows r in [r0, r1) */
static void gemv_rows(const gemv_job *j, int B, int r0, int r1, int wkind) {
    const int n = j->in;
    for (int r = r0; r < r1; r++) {
        float acc[VB_MAX_ROWS];
        int b = 0;
#ifdef VB_AVX2
        if (wkind == W_INT8 && n % 16 == 0) {
            const int8_t *wr = (const int8_t *)j->w + (size_t)r * n;
            for (; B - b >= 2; b += B - b >= 4 ? 4 : B - b >= 3 ? 3 : 2) {  /* each weight widened once per group */
                const int16_t *xq = j->xq + (size_t)b * n;
                if (B - b >= 4) dot_i8_group(wr, xq, n, 4, j->xscale + b, acc + b);
                else if (B - b == 3) dot_i8_group(wr, xq, n, 3, j->xscale + b, acc + b);
                else dot_i8_group(wr, xq, n, 2, j->xscale + b, acc + b);
            }
            for (; b < B; b++) {
                const int16_t *xq = j->xq + (size_t)b * n;
                __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
                int k = 0;
                for (; k + 32 <= n; k += 32) {
                    __m256i w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(wr + k)));
                    __m256i w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(wr + k + 16)));
                    s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(w0, _mm256_loadu_si256((const __m256i *)(xq + k))));
                    s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(w1, _mm256_loadu_si256((const __m256i *)(xq + k + 16))));
                }
                for (; k < n; k += 16) {
                    __m256i w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(wr + k)));
                    s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(w0, _mm256_loadu_si256((const __m256i *)(xq + k))));
                }
                acc[b] = (float)hsum_epi32(_mm256_add_epi32(s0, s1)) * j->xscale[b];
            }
        } else if (wkind == W_FP32 && n % 16 == 0) {
            const float *wr = (const float *)j->w + (size_t)r * n;
            for (; b + 1 < B; b += 2) {  /* two rows of x per pass over the weight row */
                const float *x0 = j->x + (size_t)b * n, *x1 = x0 + n;
                __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
                __m256 c0 = _mm256_setzero_ps(), c1 = _mm256_setzero_ps();
                for (int k = 0; k < n; k += 16) {
                    __m256 w0 = _mm256_loadu_ps(wr + k), w1 = _mm256_loadu_ps(wr + k + 8);
                    a0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x0 + k), a0);
                    c0 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x0 + k + 8), c0);
                    a1 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x1 + k), a1);
                    c1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x1 + k + 8), c1);
                }
                acc[b] = hsum_ps(_mm256_add_ps(a0, c0));
                acc[b + 1] = hsum_ps(_mm256_add_ps(a1, c1));
            }
            for (; b < B; b++) {
                const float *x0 = j->x + (size_t)b * n;
                __m256 a0 = _mm256_setzero_ps(), c0 = _mm256_setzero_ps();
                for (int k = 0; k < n; k += 16) {
                    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(wr + k), _mm256_loadu_ps(x0 + k), a0);
                    c0 = _mm256_fmadd_ps(_mm256_loadu_ps(wr + k + 8), _mm256_loadu_ps(x0 + k + 8), c0);
                }
                acc[b] = hsum_ps(_mm256_add_ps(a0, c0));
            }
        }
#endif
        for (; b < B; b++) {  /* portable path: any CPU, any width */
            float s = 0;
            if (wkind == W_INT8) {
                const int8_t *wr = (const int8_t *)j->w + (size_t)r * n;
                const int16_t *xq = j->xq + (size_t)b * n;
                int64_t t = 0;
                for (int k = 0; k < n; k++) t += (int32_t)wr[k] * xq[k];
                s = (float)t * j->xscale[b];
            } else {
                const float *wr = (const float *)j->w + (size_t)r * n, *x = j->x + (size_t)b * n;
                for (int k = 0; k < n; k++) s += wr[k] * x[k];
            }
            acc[b] = s;
        }
        const float sc = j->scale ? j->scale[r] : 1.0f, bi = j->bias ? j->bias[r] : 0.0f;
        for (b = 0; b < B; b++) {
            float v = acc[b] * sc + bi;
            j->y[(size_t)b * j->out + r] = (j->relu && v < 0) ? 0.0f : v;
        }
    }
}

/* ------------------------------------------------------------------------------------------- the thread team */

/* A parallel loop over `units` in chunks that the caller and the workers claim from one counter. The caller never
 * waits for a worker that has not claimed anything, so a worker that is asleep or descheduled costs nothing; it
 * waits only for chunks a worker claimed and has not finished. A long wait (a stall: the worker lost its core
 * mid-chunk) costs about one time slice; running solo costs a whole step's second thread (3-4 ms a step at the real
 * size, int8). So the team goes solo for VB_SOLO_STEPS steps only when stalls are frequent, VB_SOLO_STALLS of the
 * last 16 steps: on cores shared for good (a busy process beside us stalls most steps) one thread that keeps its
 * core beats two that wait for each other, while the bot's own short tasks (the event loop taking the tokens every
 * few steps, the Opus encoder) cost only their own waits; a looser rule sent the step solo on the event loop's own
 * wake-ups (see FINDINGS.md#thread-team-solo-rule). */
#ifndef VB_STALL_NS
#define VB_STALL_NS 1500000  /* a wait this long means the worker lost its core (a scheduler time slice) */
#endif
#define VB_SOLO_STEPS 64     /* steps run single-threaded after frequent stalls, then two threads again */
#define VB_SOLO_STALLS 4     /* stalls within the last 16 steps that send the team solo */
#define VB_YIELD_NS 50000    /* a worker with no work for this long yields its core to any thread that wants it */
#define VB_IDLE_NS 2000000   /* a worker with no work for this long naps (100 us) between polls... */
#define VB_SLEEP_NS 50000000 /* ...and after this long sleeps until the next step wakes it (an idle bot costs 0) */

typedef void (*unit_fn)(void *ctx, int u0, int u1);

typedef struct {
    unit_fn fn;
    void *ctx;
    int units, chunk;
} par_job;

typedef struct {
    int threads;
    pthread_t tid[VB_MAX_THREADS];
    _Alignas(64) atomic_int generation;  /* bumped by the caller to publish a job */
    _Alignas(64) atomic_llong ticket;    /* (generation << 32) | next unclaimed unit: claims of a finished job fail */
    _Alignas(64) atomic_int finished;    /* units finished */
    atomic_int quit;
    par_job job;
    int solo_steps;      /* steps left to run single-threaded */
    long steps;          /* steps run with the team */
    unsigned stall_bits; /* bit i: the step i steps ago stalled (the current step is bit 0) */
    long stalls;         /* stalls seen (reported to the caller for the logs) */
    atomic_flag busy;    /* held by the call that uses the team; a concurrent call runs on its own thread */
    atomic_int sleeping; /* workers blocked on `wake` */
    pthread_mutex_t lock;
    pthread_cond_t wake;
} team_t;

static team_t g_team = {.threads = 1, .busy = ATOMIC_FLAG_INIT, .lock = PTHREAD_MUTEX_INITIALIZER,
                         .wake = PTHREAD_COND_INITIALIZER};

static inline uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline void cpu_relax(void) {
#ifdef VB_AVX2
    _mm_pause();
#endif
}

/* Claim and run chunks of job `gen` until none is left; returns the units this thread ran. */
static int run_chunks(const par_job *j, int gen) {
    int ran = 0;
    for (;;) {
        long long t = atomic_load_explicit(&g_team.ticket, memory_order_acquire);
        int u0;
        do {
            if ((int)(t >> 32) != gen || (u0 = (int)(t & 0xFFFFFFFF)) >= j->units) return ran;
        } while (!atomic_compare_exchange_weak_explicit(&g_team.ticket, &t, t + j->chunk, memory_order_acq_rel,
                                                        memory_order_acquire));
        int u1 = u0 + j->chunk < j->units ? u0 + j->chunk : j->units;
        j->fn(j->ctx, u0, u1);
        atomic_fetch_add_explicit(&g_team.finished, u1 - u0, memory_order_release);
        ran += u1 - u0;
    }
}

static void *worker(void *arg) {
    (void)arg;
    int seen = atomic_load(&g_team.generation);
    for (;;) {
        uint64_t idle_from = 0;
        int polls = 0;
        while (atomic_load_explicit(&g_team.generation, memory_order_acquire) == seen) {
            if (atomic_load_explicit(&g_team.quit, memory_order_relaxed)) return NULL;
            cpu_relax();
            if (++polls == 256) {
                polls = 0;
                uint64_t t = now_ns();
                if (!idle_from) idle_from = t;
                else if (t - idle_from > VB_SLEEP_NS) {
                    pthread_mutex_lock(&g_team.lock);
                    atomic_fetch_add(&g_team.sleeping, 1);
                    while (atomic_load(&g_team.generation) == seen && !atomic_load(&g_team.quit))
                        pthread_cond_wait(&g_team.wake, &g_team.lock);
                    atomic_fetch_sub(&g_team.sleeping, 1);
                    pthread_mutex_unlock(&g_team.lock);
                    idle_from = 0;
                } else if (t - idle_from > VB_IDLE_NS) {
                    struct timespec ts = {0, 100000};  /* between utterances: nap, do not burn the core */
                    nanosleep(&ts, NULL);
                } else if (t - idle_from > VB_YIELD_NS) {
                    sched_yield();  /* between steps: let another thread (the vocoder) have the core */
                }
            }
        }
        seen = atomic_load_explicit(&g_team.generation, memory_order_acquire);
        par_job j = g_team.job;
        run_chunks(&j, seen);
    }
}

int vb_set_threads(int threads) {
    if (threads < 1) threads = 1;
    if (threads > VB_MAX_THREADS) threads = VB_MAX_THREADS;
    if (threads == g_team.threads) return threads;
    while (atomic_flag_test_and_set(&g_team.busy)) sched_yield();  /* no step is using the team meanwhile */
    if (g_team.threads > 1) {  /* stop the old team */
        atomic_store(&g_team.quit, 1);
        pthread_mutex_lock(&g_team.lock);
        pthread_cond_broadcast(&g_team.wake);
        pthread_mutex_unlock(&g_team.lock);
        for (int t = 1; t < g_team.threads; t++) pthread_join(g_team.tid[t], NULL);
        atomic_store(&g_team.quit, 0);
    }
    g_team.threads = threads;
    for (int t = 1; t < threads; t++) {
        if (pthread_create(&g_team.tid[t], NULL, worker, NULL) != 0) {
            g_team.threads = t;
            break;
        }
    }
    atomic_flag_clear(&g_team.busy);
    return g_team.threads;
}

long vb_stalls(void) { return g_team.stalls; }

static _Thread_local int tl_team;  /* this call holds the team */

static void parallel(unit_fn fn, void *ctx, int units, int chunk) {
    if (!tl_team || g_team.solo_steps > 0 || units <= chunk) {
        fn(ctx, 0, units);
        return;
    }
    g_team.job = (par_job){fn, ctx, units, chunk};
    const int gen = atomic_load_explicit(&g_team.generation, memory_order_relaxed) + 1;
    atomic_store_explicit(&g_team.finished, 0, memory_order_relaxed);
    atomic_store_explicit(&g_team.ticket, (long long)gen << 32, memory_order_release);
    atomic_store(&g_team.generation, gen);
    if (atomic_load(&g_team.sleeping)) {  /* wake sleepers for the steps to come; this job does not wait for them */
        pthread_mutex_lock(&g_team.lock);
        pthread_cond_broadcast(&g_team.wake);
        pthread_mutex_unlock(&g_team.lock);
    }
    run_chunks(&g_team.job, gen);
    if (atomic_load_explicit(&g_team.finished, memory_order_acquire) == units) return;
    uint64_t t0 = now_ns();
    int polls = 0, stalled = 0;
    while (atomic_load_explicit(&g_team.finished, memory_order_acquire) < units) {
        cpu_relax();
        if (++polls == 64) {
            polls = 0;
            if (now_ns() - t0 > VB_STALL_NS && !stalled) {
                stalled = 1;
                g_team.stalls++;
                g_team.stall_bits |= 1u;
                if (__builtin_popcount(g_team.stall_bits & 0xFFFFu) >= VB_SOLO_STALLS) {
                    g_team.solo_steps = VB_SOLO_STEPS;  /* the core is shared for good: run alone for a while */
                    g_team.stall_bits = 0;
                }
            }
        }
    }
}

typedef struct {
    const gemv_job *j;
    int B, wkind;
} gemv_ctx;

static void gemv_unit(void *ctx, int r0, int r1) {
    const gemv_ctx *c = (const gemv_ctx *)ctx;
    gemv_rows(c->j, c->B, r0, r1, c->wkind);
}

static void gemv(gemv_job *j, int B, int wkind, int16_t *xq, float *xscale) {
    if (wkind == W_INT8) {
        quantize_rows(j->x, B, j->in, xq, xscale);
        j->xq = xq;
        j->xscale = xscale;
    }
    gemv_ctx c = {j, B, wkind};
    /* four chunks per thread: few claims on the shared counter, and a late thread still finds work */
    int chunk = (j->out + 4 * g_team.threads - 1) / (4 * g_team.threads);
    chunk = (chunk + 7) / 8 * 8;
    parallel(gemv_unit, &c, j->out, chunk);
}

/* ---------------------------------------------------------------------------------------------- small pieces */

static inline float kv_at(const void *base, int kvkind, size_t i) {
    if (kvkind == KV_FP32) return ((const float *)base)[i];
    uint32_t u = (uint32_t)((const uint16_t *)base)[i] << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline void kv_put(void *base, int kvkind, size_t i, float v) {
    if (kvkind == KV_FP32) {
        ((float *)base)[i] = v;
        return;
    }
    uint32_t u;
    memcpy(&u, &v, 4);
    u += 0x7FFF + ((u >> 16) & 1);  /* round to nearest even, as torch's fp32 -> bf16 */
    ((uint16_t *)base)[i] = (uint16_t)(u >> 16);
}

/* x <- layer_norm(x + r) over d, in place into x */
static void add_norm(float *x, const float *r, const float *g, const float *b, int d, float eps) {
    double mean = 0, var = 0;
    for (int i = 0; i < d; i++) {
        x[i] += r[i];
        mean += x[i];
    }
    mean /= d;
    for (int i = 0; i < d; i++) var += (x[i] - mean) * (x[i] - mean);
    const float inv = (float)(1.0 / sqrt(var / d + eps)), m = (float)mean;
    for (int i = 0; i < d; i++) x[i] = (x[i] - m) * inv * g[i] + b[i];
}

#ifdef VB_AVX2
/* e^x for x <= 0 (softmax after the max is taken): 2^n * p(r), r = x - n ln2 in [-ln2/2, ln2/2], p of degree 6
 * (relative error about 2e-7); below -87 the result is 0. */
static inline __m256 exp_neg(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145752f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860677e-6f), r);
    __m256 p = _mm256_set1_ps(1.0f / 720);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
#endif

#ifdef VB_AVX2
/* 16 cache values at i as two fp32 vectors. fp32: elements 0-7 and 8-15. bf16: one load, each half widened by
 * interleaving zeros below it, which leaves them in the order of KV16_ORDER (within each 128-bit lane: the lane's
 * low four, then its high four); a dot product with a query laid out the same way (kv16_query) sums the same terms. */
#define KV16_ORDER {0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15}
static inline void kv16(const void *base, int kvkind, size_t i, __m256 *lo, __m256 *hi) {
    if (kvkind == KV_FP32) {
        *lo = _mm256_loadu_ps((const float *)base + i);
        *hi = _mm256_loadu_ps((const float *)base + i + 8);
        return;
    }
    const __m256i v = _mm256_loadu_si256((const __m256i *)((const uint16_t *)base + i)), z = _mm256_setzero_si256();
    *lo = _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, v));
    *hi = _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, v));
}

/* 16 values of x (a query, or an output) in the order kv16 gives the cache's (to == 1), or back (to == 0) */
static inline void kv16_order(const float *x, int kvkind, float *y, int to) {
    static const int order[16] = KV16_ORDER;
    for (int k = 0; k < 16; k++) {
        const int o = kvkind == KV_FP32 ? k : order[k];
        if (to) y[k] = x[o];
        else y[o] = x[k];
    }
}

/* the 8 sums of a[0..7]'s lanes, as one vector */
static inline __m256 hsum8(const __m256 *a) {
    const __m256 h01 = _mm256_hadd_ps(a[0], a[1]), h23 = _mm256_hadd_ps(a[2], a[3]);
    const __m256 h45 = _mm256_hadd_ps(a[4], a[5]), h67 = _mm256_hadd_ps(a[6], a[7]);
    const __m256 lo = _mm256_hadd_ps(h01, h23), hi = _mm256_hadd_ps(h45, h67);
    return _mm256_add_ps(_mm256_permute2f128_ps(lo, hi, 0x20), _mm256_permute2f128_ps(lo, hi, 0x31));
}
#endif

/* One query over positions [0, upto]: out[hd] = softmax(q . K[t] * scale) @ V, K and V rows [T, hd]. The AVX2 path
 * reads each cache row once, in 16-value pieces (kv16), and sums eight positions' scores at once (hsum8): faster
 * than 8-wide loads and a sum per position above one row, the same at one row, where the step reads its weights and
 * cache at about the memory's speed already (see FINDINGS.md#grouped-int8-rows). */
static void attend(const float *q, const void *K, const void *V, int kvkind, int upto, int hd, float scale,
                   float *scores, float *out) {
    const int T = upto + 1;
    float mx = -INFINITY, sum = 0;
#ifdef VB_AVX2
    if (hd % 16 == 0 && hd <= 64) {
        const int nc = hd / 16;
        __m256 qlo[4], qhi[4];
        for (int c = 0; c < nc; c++) {
            float qs[16], qo[16];
            for (int k = 0; k < 16; k++) qs[k] = q[16 * c + k] * scale;
            kv16_order(qs, kvkind, qo, 1);
            qlo[c] = _mm256_loadu_ps(qo);
            qhi[c] = _mm256_loadu_ps(qo + 8);
        }
        int t = 0;
        __m256 vm = _mm256_set1_ps(-INFINITY);
        for (; t + 8 <= T; t += 8) {
            __m256 a[8];
            for (int u = 0; u < 8; u++) {
                __m256 lo, hi;
                kv16(K, kvkind, (size_t)(t + u) * hd, &lo, &hi);
                __m256 acc = _mm256_fmadd_ps(hi, qhi[0], _mm256_mul_ps(lo, qlo[0]));
                for (int c = 1; c < nc; c++) {
                    kv16(K, kvkind, (size_t)(t + u) * hd + 16 * c, &lo, &hi);
                    acc = _mm256_fmadd_ps(hi, qhi[c], _mm256_fmadd_ps(lo, qlo[c], acc));
                }
                a[u] = acc;
            }
            const __m256 sc = hsum8(a);
            _mm256_storeu_ps(scores + t, sc);
            vm = _mm256_max_ps(vm, sc);
        }
        float m8[8];
        _mm256_storeu_ps(m8, vm);
        for (int k = 0; k < 8; k++) mx = fmaxf(mx, m8[k]);
        for (; t < T; t++) {
            __m256 lo, hi, acc = _mm256_setzero_ps();
            for (int c = 0; c < nc; c++) {
                kv16(K, kvkind, (size_t)t * hd + 16 * c, &lo, &hi);
                acc = _mm256_fmadd_ps(hi, qhi[c], _mm256_fmadd_ps(lo, qlo[c], acc));
            }
            scores[t] = hsum_ps(acc);
            mx = fmaxf(mx, scores[t]);
        }
        t = 0;
        __m256 vs = _mm256_setzero_ps();
        vm = _mm256_set1_ps(mx);
        for (; t + 8 <= T; t += 8) {
            __m256 e = exp_neg(_mm256_sub_ps(_mm256_loadu_ps(scores + t), vm));
            _mm256_storeu_ps(scores + t, e);
            vs = _mm256_add_ps(vs, e);
        }
        sum = hsum_ps(vs);
        for (; t < T; t++) sum += (scores[t] = expf(scores[t] - mx));
        __m256 lo_acc[4], hi_acc[4];
        for (int c = 0; c < nc; c++) lo_acc[c] = hi_acc[c] = _mm256_setzero_ps();
        for (int u = 0; u < T; u++) {  /* one pass over V: each row's pieces into their accumulators */
            const __m256 p = _mm256_set1_ps(scores[u]);
            for (int c = 0; c < nc; c++) {
                __m256 lo, hi;
                kv16(V, kvkind, (size_t)u * hd + 16 * c, &lo, &hi);
                lo_acc[c] = _mm256_fmadd_ps(p, lo, lo_acc[c]);
                hi_acc[c] = _mm256_fmadd_ps(p, hi, hi_acc[c]);
            }
        }
        const __m256 inv = _mm256_set1_ps(1.0f / sum);
        for (int c = 0; c < nc; c++) {
            float o[16];
            _mm256_storeu_ps(o, _mm256_mul_ps(lo_acc[c], inv));
            _mm256_storeu_ps(o + 8, _mm256_mul_ps(hi_acc[c], inv));
            kv16_order(o, kvkind, out + 16 * c, 0);
        }
        return;
    }
#endif
    for (int t = 0; t < T; t++) {  /* portable path */
        float s = 0;
        for (int k = 0; k < hd; k++) s += q[k] * kv_at(K, kvkind, (size_t)t * hd + k);
        scores[t] = s * scale;
        mx = fmaxf(mx, scores[t]);
    }
    for (int t = 0; t < T; t++) sum += (scores[t] = expf(scores[t] - mx));
    for (int k = 0; k < hd; k++) {
        float a = 0;
        for (int t = 0; t < T; t++) a += scores[t] * kv_at(V, kvkind, (size_t)t * hd + k);
        out[k] = a / sum;
    }
}

typedef struct {
    const float *qkv;
    char *kv;
    float *att;
    const int64_t *slots, *positions;
    int dim, heads, hd, max_slots, max_len, kvkind;
    float scale;
} attn_ctx;

static _Thread_local float *tl_scores;  /* each thread's attention scores, grown to the longest context seen */
static _Thread_local int tl_capacity;

/* attention of (row, head) units [u0, u1) */
static void attend_unit(void *ctx, int u0, int u1) {
    const attn_ctx *c = (const attn_ctx *)ctx;
    const size_t esz = c->kvkind == KV_FP32 ? 4 : 2;
    if (tl_capacity < c->max_len) {
        float *grown = (float *)realloc(tl_scores, sizeof(float) * (size_t)c->max_len);
        if (!grown) abort();
        tl_scores = grown;
        tl_capacity = c->max_len;
    }
    float *scores = tl_scores;
    for (int u = u0; u < u1; u++) {
        const int b = u / c->heads, hh = u % c->heads;
        /* cache layout per layer: [2, max_slots, heads, max_len, hd] */
        const size_t kbase = (((size_t)0 * c->max_slots + c->slots[b]) * c->heads + hh) * c->max_len * c->hd;
        const size_t vbase = (((size_t)1 * c->max_slots + c->slots[b]) * c->heads + hh) * c->max_len * c->hd;
        attend(c->qkv + (size_t)b * 3 * c->dim + hh * c->hd, c->kv + kbase * esz, c->kv + vbase * esz, c->kvkind,
               (int)c->positions[b], c->hd, c->scale, scores, c->att + (size_t)b * c->dim + hh * c->hd);
    }
}

/* y = x @ W^T (+ bias, ReLU) for the linear whose (weight, scale, bias) pointers start at lin in the table */
static void linear(const int64_t *lin, int out, int in, int relu, const float *x, float *y, int B, int wkind,
                   int16_t *xq, float *xscale) {
    gemv_job j = {(const void *)(intptr_t)lin[0], (const float *)(intptr_t)lin[1], (const float *)(intptr_t)lin[2],
                  out, in, relu, x, NULL, NULL, y};
    gemv(&j, B, wkind, xq, xscale);
}

/* ------------------------------------------------------------------------------------------------- the step */

/* Runs every layer for B rows. h: [B, dim] fp32 residual stream, in and out. slots/positions: [B] cache row and the
 * position the new token is written to (it attends to [0, position]). scratch: at least
 * B * (4 * dim + 2 * ffn) + 16 floats. head: the fp32 output head [vocab, dim] (or NULL), logits [B, vocab] out. Returns 0, or -1 for arguments out of range. */
int vb_decode_layers(const int64_t *params, int layers, int dim, int heads, int ffn, int wkind, int kvkind, int B,
                     float *h, const int64_t *slots, const int64_t *positions, int max_slots, int max_len,
                     float eps, float *scratch, const float *head, int vocab, float *logits) {
    if (B < 1 || B > VB_MAX_ROWS || dim % heads) return -1;
    const int hd = dim / heads;
    const float scale = 1.0f / sqrtf((float)hd);
    float *qkv = scratch;                       /* [B, 3 * dim] */
    float *att = qkv + (size_t)B * 3 * dim;     /* [B, dim] */
    float *f1 = att + (size_t)B * dim;          /* [B, ffn], also the out projection's [B, dim] */
    float *xscale = f1 + (size_t)B * ffn;       /* [B] */
    int16_t *xq = (int16_t *)(xscale + VB_MAX_ROWS);  /* [B, max(dim, ffn)] */
    for (int b = 0; b < B; b++)
        if (slots[b] < 0 || slots[b] >= max_slots || positions[b] < 0 || positions[b] >= max_len) return -1;
    tl_team = g_team.threads > 1 && !atomic_flag_test_and_set(&g_team.busy);
    if (tl_team) {
        g_team.steps++;
        g_team.stall_bits <<= 1;
        if (g_team.solo_steps > 0) g_team.solo_steps--;
    }
    for (int i = 0; i < layers; i++) {
        const int64_t *p = params + (size_t)i * P_PER_LAYER;
        char *kv = (char *)(intptr_t)p[P_KV];
        linear(p + P_QKV, 3 * dim, dim, 0, h, qkv, B, wkind, xq, xscale);
        for (int b = 0; b < B; b++) {  /* the new token's K and V into the cache */
            const float *q = qkv + (size_t)b * 3 * dim;
            for (int hh = 0; hh < heads; hh++) {
                const size_t kpos = ((((size_t)0 * max_slots + slots[b]) * heads + hh) * max_len + positions[b]) * hd;
                const size_t vpos = ((((size_t)1 * max_slots + slots[b]) * heads + hh) * max_len + positions[b]) * hd;
                for (int k = 0; k < hd; k++) {
                    kv_put(kv, kvkind, kpos + k, q[dim + hh * hd + k]);
                    kv_put(kv, kvkind, vpos + k, q[2 * dim + hh * hd + k]);
                }
            }
        }
        attn_ctx ac = {qkv, kv, att, slots, positions, dim, heads, hd, max_slots, max_len, kvkind, scale};
        parallel(attend_unit, &ac, B * heads, 4);
        linear(p + P_OUT, dim, dim, 0, att, f1, B, wkind, xq, xscale);
        for (int b = 0; b < B; b++)
            add_norm(h + (size_t)b * dim, f1 + (size_t)b * dim, (const float *)(intptr_t)p[P_N1],
                     (const float *)(intptr_t)p[P_N1 + 1], dim, eps);
        linear(p + P_FF1, ffn, dim, 1, h, f1, B, wkind, xq, xscale);
        linear(p + P_FF2, dim, ffn, 0, f1, att, B, wkind, xq, xscale);
        for (int b = 0; b < B; b++)
            add_norm(h + (size_t)b * dim, att + (size_t)b * dim, (const float *)(intptr_t)p[P_N2],
                     (const float *)(intptr_t)p[P_N2 + 1], dim, eps);
    }
    if (head) {  /* the output head: fp32 [vocab, dim], no bias */
        gemv_job o = {head, NULL, NULL, vocab, dim, 0, h, NULL, NULL, logits};
        gemv(&o, B, W_FP32, xq, xscale);
    }
    if (tl_team) atomic_flag_clear(&g_team.busy);
    tl_team = 0;
    return 0;
}

/* y [B, out] = x [B, in] @ W^T (* scale) + bias: one linear through the step's products, for a caller outside the
 * step (the prefill's last row, which must round as the decode steps do). w: [out, in] fp32, or int8 with a
 * per-output-channel scale; bias may be NULL. Returns 0, or -1 for arguments out of range or no memory. */
int vb_linear(const void *w, const float *scale, const float *bias, int out, int in, int wkind, int B,
              const float *x, float *y) {
    if (B < 1 || B > VB_MAX_ROWS || out < 1 || in < 1 || (wkind == W_INT8 && !scale)) return -1;
    int16_t *xq = wkind == W_INT8 ? malloc((size_t)B * in * sizeof(int16_t)) : NULL;
    if (wkind == W_INT8 && !xq) return -1;
    float xscale[VB_MAX_ROWS];
    tl_team = g_team.threads > 1 && !atomic_flag_test_and_set(&g_team.busy);
    gemv_job j = {w, scale, bias, out, in, 0, x, NULL, NULL, y};
    gemv(&j, B, wkind, xq, xscale);
    if (tl_team) atomic_flag_clear(&g_team.busy);
    tl_team = 0;
    free(xq);
    return 0;
}

/* -------------------------------------------------------------------------------------------------- sampling */

/* The 32-bit avalanche hash of sampling.py's _mix (xorshift-multiply; arithmetic mod 2^32). */
static inline uint32_t mix32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7FEB352Du;
    x ^= x >> 15;
    x *= 0x846CA68Bu;
    return x ^ (x >> 16);
}

/* The k-th largest (1-based) of v[0..n), reordering v (quickselect). */
static float kth_largest(float *v, int n, int k) {
    int lo = 0, hi = n - 1, want = k - 1;
    while (lo < hi) {
        const float pivot = v[lo + (hi - lo) / 2];
        int i = lo, j = hi;
        while (i <= j) {  /* descending: larger values to the left */
            while (v[i] > pivot) i++;
            while (v[j] < pivot) j--;
            if (i <= j) {
                float t = v[i];
                v[i++] = v[j];
                v[j--] = t;
            }
        }
        if (want <= j) hi = j;
        else if (want >= i) lo = i;
        else return v[want];
    }
    return v[want];
}

/* One sampling step for rows 0..B-1 with upstream's rules, the same arithmetic as sampling.py's sample_step (without
 * top-p: the caller runs the torch sampler when a row uses it) and BatchDecoder._sample_rows' bookkeeping:
 * no EOS before `min_steps`; repetition penalty over the seen tokens; temperature; top-k keeping ties; softmax; the
 * exponential race argmax(p / q) with q = -log(u), u a pure function of (row key, step, token). Then the token is
 * written at tokens[b][steps[b]], marked seen, becomes next_token; eos_at[b] takes the step where the row stops (the
 * penalised argmax or the sample is EOS) if it has none yet and the row is live; steps[b] += live[b].
 * Torch and C may differ in the last bit of exp/log, so a sample can differ only where two candidates tie to ~1e-7.
 * scratch: 2 * V floats. Returns 0, or -1 for arguments out of range. */
int vb_sample_rows(const float *logits, int B, int V, uint8_t *seen, int64_t *tokens, int tok_stride,
                   int64_t *steps, int64_t *eos_at, int64_t *next_token, const int64_t *live, const int64_t *top_k,
                   const float *temperature, const float *penalty, const int64_t *key, int eos, int min_steps,
                   float *scratch) {
    if (B < 1 || V < 1 || eos < 0 || eos >= V) return -1;
    float *x = scratch, *sel = scratch + V;
    for (int b = 0; b < B; b++) {
        const float *l = logits + (size_t)b * V;
        uint8_t *sn = seen + (size_t)b * V;
        const int64_t step = steps[b];
        if (step < 0 || step >= tok_stride) return -1;
        const float rp = penalty[b], t = temperature[b] > 1e-5f ? temperature[b] : 1e-5f;
        int best_pen = 0;
        float best_pen_v = -INFINITY;
        for (int i = 0; i < V; i++) {
            float v = (i == eos && step < min_steps) ? -INFINITY : l[i];
            if (sn[i]) v = v < 0 ? v * rp : v / rp;
            if (i == 0 || v > best_pen_v) {  /* the first maximum, as torch.argmax */
                best_pen_v = v;
                best_pen = i;
            }
            x[i] = v / t;
            sel[i] = x[i];
        }
        int k = top_k[b] < 1 ? 1 : (top_k[b] > V ? V : (int)top_k[b]);
        const float pivot = kth_largest(sel, V, k);
        float m = -INFINITY;
        for (int i = 0; i < V; i++)
            if (x[i] >= pivot && x[i] > m) m = x[i];
        double sum = 0;  /* softmax over the kept logits (the rest are exp(-inf) = 0) */
        for (int i = 0; i < V; i++) {
            if (x[i] >= pivot) {
                x[i] = expf(x[i] - m);
                sum += x[i];
            } else {
                x[i] = 0;
            }
        }
        const float inv = (float)(1.0 / sum);
        const uint32_t row = mix32((uint32_t)key[b] ^ mix32((uint32_t)(step + 0x3C6EF372)));
        int tok = 0;
        float best = -1;
        for (int i = 0; i < V; i++) {
            if (x[i] == 0) continue;
            const uint32_t h = mix32(row ^ mix32((uint32_t)i * 0x9E37u + 0x27D4EB2Fu));
            const float u = ((float)(h >> 8) + 0.5f) * (1.0f / 16777216.0f);
            const float r = (x[i] * inv) / -logf(u);
            if (r > best) { best = r; tok = i; }
        }
        tokens[(size_t)b * tok_stride + step] = tok;
        sn[tok] = 1;
        if (eos_at[b] < 0 && live[b] > 0 && (best_pen == eos || tok == eos)) eos_at[b] = step;
        next_token[b] = tok;
        steps[b] = step + live[b];
    }
    return 0;
}
