/* Paged decode attention for the CPU's optimized path: one new query token per sequence, attending
 * over its cached context read in place from the paged pool (no gather, no padding to the batch's
 * longest sequence, no repeated KV heads). Built and loaded by engine/cpu_kernels/__init__.py.
 *
 * Layouts (all contiguous, as the engine keeps them):
 *   q, out       [B, H, D]
 *   k/v cache    [N, block_size, KVH, D]
 *   block table  [B, table_stride] int64, seq_lens [B] int64 (context length including the new token)
 * Sums run in float32 whatever the storage type, and each intermediate the torch path stores in the
 * storage type (scores, softmax weights, output) is rounded to it here too, so both paths give the same
 * tokens; the softmax runs in float32. Query head h reads KV head h / (H / KVH), as HF's repeat_kv.
 *
 * Work is split into chunks of whole blocks (every KV head of a token row at once, so reads run along
 * contiguous memory), several per sequence so one long sequence still uses every thread. Four passes
 * on the calling thread's OpenMP team (torch's, when torch loaded libgomp first): scores per chunk;
 * softmax per (sequence, head); weighted values per chunk; the chunks' sums per (sequence, head).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#ifdef _OPENMP
#include <omp.h>
static inline int team_size(void) { return omp_get_num_threads(); }
#else
static inline int team_size(void) { return 1; }
#endif

#define CHUNK_BLOCKS 4
/* A batch with at least this many (sequence, head) pairs per thread runs each pair in one pass (see below). */
#define PAIRS_PER_THREAD 4

static inline float f32_load(float x) { return x; }
static inline float f32_store(float x) { return x; }
/* Rounding to the storage type where the torch path stores an intermediate in it (its matmul outputs). */
static inline float f32_round(float x) { return x; }
static inline float bf16_round(float x) { return bf16_to_f32(f32_to_bf16(x)); }

/* q . k and acc += w * v over one head's D values (float32 q and acc; k and v in the storage type). NOTE:
 * written with AVX-512 (or AVX2 and FMA) where the CPU has it and D is whole vectors: left to the compiler
 * inside the kernel's loops, the dot products ran as scalar chains, 50 cycles per 64-value dot and weighted
 * add. */
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif
#if defined(__AVX512F__)
static inline __m512 bf16x16_to_f32(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
#elif defined(__AVX2__) && defined(__FMA__)
#define PD_AVX2 1
static inline __m256 bf16x8_to_f32(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}
static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
#endif

#if defined(__AVX512F__)
#define DOT_FAST(LOADV)                                                                                     \
    if (D % 16 == 0) {                                                                                     \
        __m512 s = _mm512_setzero_ps();                                                                    \
        for (int64_t d = 0; d < D; d += 16) s = _mm512_fmadd_ps(_mm512_loadu_ps(q + d), LOADV(k + d), s);  \
        return _mm512_reduce_add_ps(s);                                                                    \
    }
#elif defined(PD_AVX2)
/* two chains of 8, so one dot is not bound by the FMA's latency */
#define DOT_FAST(LOADV)                                                                                     \
    if (D % 16 == 0) {                                                                                     \
        __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();                                         \
        for (int64_t d = 0; d < D; d += 16) {                                                              \
            s0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), LOADV(k + d), s0);                                \
            s1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d + 8), LOADV(k + d + 8), s1);                        \
        }                                                                                                  \
        return hsum256(_mm256_add_ps(s0, s1));                                                             \
    }
#else
#define DOT_FAST(LOADV)
#endif
#define DEFINE_DOT(SUFFIX, T, LOAD, LOADV)                                                                  \
static inline float dot_##SUFFIX(const float *q, const T *k, int64_t D) {                                  \
    DOT_FAST(LOADV)                                                                                        \
    float s = 0.0f;                                                                                        \
    for (int64_t d = 0; d < D; d++) s += q[d] * LOAD(k[d]);                                                \
    return s;                                                                                              \
}
#if defined(PD_AVX2)
DEFINE_DOT(f32, float, f32_load, _mm256_loadu_ps)
DEFINE_DOT(bf16, uint16_t, bf16_to_f32, bf16x8_to_f32)
#else
DEFINE_DOT(f32, float, f32_load, _mm512_loadu_ps)
DEFINE_DOT(bf16, uint16_t, bf16_to_f32, bf16x16_to_f32)
#endif

/* acc[0 .. D) += sum over j < n of w[j] * v[j * stride + 0 .. D): one head's weighted values over a block of
 * tokens. NOTE: the sums stay in registers across the block (NV vectors of 16, a constant per case); added
 * into acc in memory token by token, each token's add waited on the last one's store (half of the kernel's
 * time). */
#if defined(__AVX512F__)
#define DEFINE_WEIGHTED_ROWS(SUFFIX, T, LOADV)                                                              \
static inline void weighted_rows_##SUFFIX##_nv(float *acc, const float *w, const T *v, int64_t stride, int64_t n, \
                                               const int nv) {                                              \
    __m512 a[8];                                                                                           \
    for (int i = 0; i < nv; i++) a[i] = _mm512_loadu_ps(acc + 16 * i);                                     \
    for (int64_t j = 0; j < n; j++) {                                                                      \
        const __m512 wv = _mm512_set1_ps(w[j]);                                                            \
        for (int i = 0; i < nv; i++) a[i] = _mm512_fmadd_ps(wv, LOADV(v + j * stride + 16 * i), a[i]);     \
    }                                                                                                      \
    for (int i = 0; i < nv; i++) _mm512_storeu_ps(acc + 16 * i, a[i]);                                     \
}
DEFINE_WEIGHTED_ROWS(f32, float, _mm512_loadu_ps)
DEFINE_WEIGHTED_ROWS(bf16, uint16_t, bf16x16_to_f32)
#elif defined(PD_AVX2)
/* the same in vectors of 8: at most 8 of them (64 values) in registers, a wider head in slices of 64 */
#define DEFINE_WEIGHTED_ROWS(SUFFIX, T, LOADV)                                                              \
static inline void weighted_rows_##SUFFIX##_nv(float *acc, const float *w, const T *v, int64_t stride, int64_t n, \
                                               const int nv) {                                              \
    __m256 a[8];                                                                                           \
    for (int i = 0; i < nv; i++) a[i] = _mm256_loadu_ps(acc + 8 * i);                                      \
    for (int64_t j = 0; j < n; j++) {                                                                      \
        const __m256 wv = _mm256_set1_ps(w[j]);                                                            \
        for (int i = 0; i < nv; i++) a[i] = _mm256_fmadd_ps(wv, LOADV(v + j * stride + 8 * i), a[i]);     \
    }                                                                                                      \
    for (int i = 0; i < nv; i++) _mm256_storeu_ps(acc + 8 * i, a[i]);                                      \
}
DEFINE_WEIGHTED_ROWS(f32, float, _mm256_loadu_ps)
DEFINE_WEIGHTED_ROWS(bf16, uint16_t, bf16x8_to_f32)
#endif

#define DEFINE_WEIGHTED_ROWS_ANY(SUFFIX, T, LOAD)                                                           \
static inline void weighted_rows_##SUFFIX(float *acc, const float *w, const T *v, int64_t stride, int64_t n,  \
                                          int64_t D) {                                                     \
    WEIGHTED_ROWS_FAST(SUFFIX)                                                                             \
    for (int64_t j = 0; j < n; j++)                                                                        \
        for (int64_t d = 0; d < D; d++) acc[d] += w[j] * LOAD(v[j * stride + d]);                          \
}
#if defined(__AVX512F__)
/* each case inlines its own copy with nv a constant, so the loops over the vectors unroll into registers */
#define WEIGHTED_ROWS_FAST(SUFFIX)                                                                          \
    switch (D) {                                                                                           \
    case 64: weighted_rows_##SUFFIX##_nv(acc, w, v, stride, n, 4); return;                                 \
    case 128: weighted_rows_##SUFFIX##_nv(acc, w, v, stride, n, 8); return;                                \
    default: break;                                                                                        \
    }
#elif defined(PD_AVX2)
#define WEIGHTED_ROWS_FAST(SUFFIX)                                                                          \
    if (D % 64 == 0) {                                                                                     \
        for (int64_t d = 0; d < D; d += 64) weighted_rows_##SUFFIX##_nv(acc + d, w, v + d, stride, n, 8);  \
        return;                                                                                            \
    }
#else
#define WEIGHTED_ROWS_FAST(SUFFIX)
#endif
DEFINE_WEIGHTED_ROWS_ANY(f32, float, f32_load)
DEFINE_WEIGHTED_ROWS_ANY(bf16, uint16_t, bf16_to_f32)

/* How much scratch a batch needs: the longest context and the number of (sequence, chunk) work items. */
void paged_decode_plan(const int64_t *seq_lens, int64_t B, int64_t bs, int64_t *max_len, int64_t *num_items) {
    const int64_t chunk = CHUNK_BLOCKS * bs;
    *max_len = 0;
    *num_items = 0;
    for (int64_t b = 0; b < B; b++) {
        *max_len = seq_lens[b] > *max_len ? seq_lens[b] : *max_len;
        *num_items += (seq_lens[b] + chunk - 1) / chunk;
    }
}

/* Blocks ahead of the one being read whose rows of the head the spans ask the L2 cache for (and the first ones
 * before they start). NOTE: a head's rows are a quarter to a third of each cached token row, in blocks scattered
 * over the pool, and the hardware prefetchers did not follow them: one sequence of 1006 tokens read its float32
 * KV at 7.6 GB/s over 30 layers (the same data from cache took a third of the time). Asking 2 blocks ahead into
 * L2 (prefetcht1): the 30 layers' attention 0.66x, a fused one-row step 0.69x at 1006 tokens and 0.90x at 256,
 * eight rows of 260 tokens 0.86x; into L1 (prefetcht0) 0.92x; 1, 4 or 8 blocks ahead no better (2-core
 * AVX-512 EPYC, Zen 4, 2026-12-07). */
#ifndef AHEAD_BLOCKS
#define AHEAD_BLOCKS 2
#endif
/* Ask the L2 cache for one head's rows in `blocks` blocks from token `from` (block-aligned), none at or past token
 * `end`: `head` bytes of each of a block's bs rows, rows `row` bytes apart, blocks `block` bytes apart in the pool
 * at `base`. */
static inline void prefetch_head_blocks(const void *base, const int64_t *table, int64_t from, int64_t blocks,
                                        int64_t end, int64_t bs, int64_t block, int64_t row, int64_t head) {
    for (int64_t t = from; t < end && t < from + blocks * bs; t += bs) {
        const char *p = (const char *)base + table[t / bs] * block;
        for (int64_t r = 0; r < bs; r++)
            for (int64_t b = 0; b < head; b += 64) __builtin_prefetch(p + r * row + b, 0, 2);
    }
}

/* One head over tokens [t0, t1) of one sequence (t0 starts a block; `table` is that sequence's block table, kc
 * and vc already offset to the head's KV head): its scaled scores into s, and its weighted values (the weights
 * in s) added into acc; and the softmax in place over a row of scores, its weights rounded as the torch path
 * stores them. Both ways of the kernel below are made of these. */
#define DEFINE_SPANS(SUFFIX, T, ROUND)                                                                     \
static inline void scores_span_##SUFFIX(const float *qh, const T *kc, const int64_t *table, int64_t t0,    \
                                        int64_t t1, int64_t bs, int64_t block_stride, int64_t row, int64_t D,\
                                        float scale, float *s) {                                           \
    const int64_t sz = (int64_t)sizeof(T);                                                                 \
    prefetch_head_blocks(kc, table, t0, AHEAD_BLOCKS, t1, bs, block_stride * sz, row * sz, D * sz);          \
    for (int64_t t = t0; t < t1; t += bs) {                                                                \
        const T *k = kc + table[t / bs] * block_stride;                                                    \
        const int64_t n = t1 - t < bs ? t1 - t : bs;                                                       \
        prefetch_head_blocks(kc, table, t + AHEAD_BLOCKS * bs, 1, t1, bs, block_stride * sz, row * sz, D * sz);\
        for (int64_t j = 0; j < n; j++) s[t + j] = ROUND(dot_##SUFFIX(qh, k + j * row, D)) * scale;        \
    }                                                                                                      \
}                                                                                                          \
static inline void values_span_##SUFFIX(float *acc, const float *s, const T *vc, const int64_t *table,     \
                                        int64_t t0, int64_t t1, int64_t bs, int64_t block_stride, int64_t row,\
                                        int64_t D) {                                                       \
    const int64_t sz = (int64_t)sizeof(T);                                                                 \
    prefetch_head_blocks(vc, table, t0, AHEAD_BLOCKS, t1, bs, block_stride * sz, row * sz, D * sz);          \
    for (int64_t t = t0; t < t1; t += bs) {                                                                \
        prefetch_head_blocks(vc, table, t + AHEAD_BLOCKS * bs, 1, t1, bs, block_stride * sz, row * sz, D * sz);\
        weighted_rows_##SUFFIX(acc, s + t, vc + table[t / bs] * block_stride, row, t1 - t < bs ? t1 - t : bs, D);\
    }                                                                                                      \
}                                                                                                          \
static inline void softmax_##SUFFIX(float *s, int64_t len) {                                               \
    float m = s[0], sum = 0.0f;                                                                            \
    for (int64_t t = 1; t < len; t++) m = s[t] > m ? s[t] : m;                                             \
    for (int64_t t = 0; t < len; t++) { s[t] = exp_f32(s[t] - m); sum += s[t]; }                           \
    for (int64_t t = 0; t < len; t++) s[t] = ROUND(s[t] / sum);                                            \
}
DEFINE_SPANS(f32, float, f32_round)
DEFINE_SPANS(bf16, uint16_t, bf16_round)

/* paged_decode_team_*: the four passes, for a thread team already running (orphaned omp for: every thread
 * of the enclosing parallel region calls it). Scratch from the caller: items [2 * num_items] int64,
 * scores [B * H * max_len] and partial [B * max_chunks * H * D] float32 (see paged_decode_plan). `fresh`:
 * NULL, or where each row's last token's K and V are read instead of the cache (the same values, so the same
 * sums in the same order). paged_decode_*: the same on its own team, with its own scratch. */
/* Row b's new K (or V: `which`) at KV-head offset kv in `fresh`, as the cache's type T. */
#define NEW_ROW(T, fresh, which, b, kv) ((const T *)(fresh)->which + (b) * (fresh)->which##_stride + (kv))

#define DEFINE_KERNEL(SUFFIX, T, LOAD, STORE, ROUND)                                                       \
void paged_decode_team_##SUFFIX(const T *q, const T *kc, const T *vc, const int64_t *tables,               \
                                int64_t table_stride, const int64_t *seq_lens, T *out, int64_t B, int64_t H,\
                                int64_t KVH, int64_t D, int64_t bs, float scale, int64_t *items,           \
                                int64_t num_items, float *scores, int64_t max_len, float *partial,         \
                                const NewTokens *fresh) {                                                  \
    const int64_t G = H / KVH, row = KVH * D, block_stride = bs * KVH * D, chunk = CHUNK_BLOCKS * bs;      \
    const int64_t max_chunks = (max_len + chunk - 1) / chunk;                                              \
    if (B * H >= PAIRS_PER_THREAD * team_size()) {                                                         \
        /* Enough (sequence, head) pairs for every thread: each pair whole on one thread, in one pass.     \
         * NOTE: a one-sequence decode step of a small model has 9 heads over a short context; split into  \
         * the passes below, each pass read what another thread wrote in the one before, and moving those  \
         * cache lines between the cores cost more than the arithmetic (2 threads slower than 1). */       \
        _Pragma("omp for schedule(static)")                                                                \
        for (int64_t bh = 0; bh < B * H; bh++) {                                                           \
            const int64_t b = bh / H, len = seq_lens[b], kv = (bh % H / G) * D, upto = fresh ? len - 1 : len;\
            float qh[D], acc[D];                                                                           \
            for (int64_t d = 0; d < D; d++) { qh[d] = LOAD(q[bh * D + d]); acc[d] = 0.0f; }                \
            float *sh = scores + bh * max_len;                                                             \
            scores_span_##SUFFIX(qh, kc + kv, tables + b * table_stride, 0, upto, bs, block_stride, row, D, scale,\
                                 sh);                                                                      \
            if (fresh) sh[len - 1] = ROUND(dot_##SUFFIX(qh, NEW_ROW(T, fresh, k, b, kv), D)) * scale;      \
            softmax_##SUFFIX(sh, len);                                                                     \
            values_span_##SUFFIX(acc, sh, vc + kv, tables + b * table_stride, 0, upto, bs, block_stride, row, D);\
            if (fresh) weighted_rows_##SUFFIX(acc, sh + len - 1, NEW_ROW(T, fresh, v, b, kv), 0, 1, D);    \
            for (int64_t d = 0; d < D; d++) out[bh * D + d] = STORE(acc[d]);                               \
        }                                                                                                  \
        return;                                                                                            \
    }                                                                                                      \
    /* item i is (sequence items[2i], chunk items[2i + 1]): that sequence's tokens [chunk * c, chunk * (c + 1)) */\
    _Pragma("omp single")                                                                                  \
    {                                                                                                      \
        int64_t n = 0;                                                                                     \
        for (int64_t b = 0; b < B; b++)                                                                    \
            for (int64_t c = 0; c * chunk < seq_lens[b]; c++) { items[2 * n] = b; items[2 * n + 1] = c; n++; }\
    }                                                                                                      \
    /* NOTE: a unit of work is one head of one chunk: one sequence decoding a short context is one chunk,  \
     * and as whole chunks its attention ran on one thread while the others waited */                      \
    _Pragma("omp for schedule(dynamic, 1)")                                                                \
    for (int64_t u = 0; u < num_items * H; u++) {                                                          \
        const int64_t i = u / H, h = u % H, b = items[2 * i], c = items[2 * i + 1], len = seq_lens[b];     \
        const int64_t t0 = c * chunk, t1 = t0 + chunk < len ? t0 + chunk : len;                            \
        const int last = fresh && t1 == len; /* the new token's score from fresh */                        \
        float qh[D];                                                                                       \
        for (int64_t d = 0; d < D; d++) qh[d] = LOAD(q[(b * H + h) * D + d]);                              \
        float *sh = scores + (b * H + h) * max_len;                                                        \
        scores_span_##SUFFIX(qh, kc + (h / G) * D, tables + b * table_stride, t0, t1 - last, bs, block_stride, row,\
                             D, scale, sh);                                                                \
        if (last) sh[len - 1] = ROUND(dot_##SUFFIX(qh, NEW_ROW(T, fresh, k, b, (h / G) * D), D)) * scale;   \
    }                                                                                                      \
    _Pragma("omp for schedule(static)")                                                                    \
    for (int64_t bh = 0; bh < B * H; bh++) softmax_##SUFFIX(scores + bh * max_len, seq_lens[bh / H]);      \
    _Pragma("omp for schedule(dynamic, 1)")                                                                \
    for (int64_t u = 0; u < num_items * H; u++) {                                                          \
        const int64_t i = u / H, h = u % H, b = items[2 * i], c = items[2 * i + 1], len = seq_lens[b];     \
        const int64_t t0 = c * chunk, t1 = t0 + chunk < len ? t0 + chunk : len;                            \
        const int last = fresh && t1 == len;                                                               \
        float *acc = partial + ((b * max_chunks + c) * H + h) * D;                                         \
        const float *sh = scores + (b * H + h) * max_len;                                                  \
        memset(acc, 0, sizeof(float) * (size_t)D);                                                         \
        values_span_##SUFFIX(acc, sh, vc + (h / G) * D, tables + b * table_stride, t0, t1 - last, bs, block_stride,\
                             row, D);                                                                      \
        if (last) weighted_rows_##SUFFIX(acc, sh + len - 1, NEW_ROW(T, fresh, v, b, (h / G) * D), 0, 1, D); \
    }                                                                                                      \
    _Pragma("omp for schedule(static)")                                                                    \
    for (int64_t bh = 0; bh < B * H; bh++) {                                                               \
        const int64_t b = bh / H, h = bh % H, chunks = (seq_lens[b] + chunk - 1) / chunk;                  \
        for (int64_t d = 0; d < D; d++) {                                                                  \
            float s = 0.0f;                                                                                \
            for (int64_t c = 0; c < chunks; c++) s += partial[((b * max_chunks + c) * H + h) * D + d];     \
            out[bh * D + d] = STORE(s);                                                                    \
        }                                                                                                  \
    }                                                                                                      \
}                                                                                                          \
int paged_decode_##SUFFIX(const T *q, const T *kc, const T *vc, const int64_t *tables, int64_t table_stride, \
                          const int64_t *seq_lens, T *out, int64_t B, int64_t H, int64_t KVH, int64_t D,    \
                          int64_t bs, float scale, int num_threads) {                                      \
    int64_t max_len, num_items;                                                                            \
    paged_decode_plan(seq_lens, B, bs, &max_len, &num_items);                                              \
    const int64_t chunk = CHUNK_BLOCKS * bs, max_chunks = (max_len + chunk - 1) / chunk;                   \
    int64_t *items = malloc(sizeof(int64_t) * (size_t)(2 * num_items));                                    \
    float *scores = malloc(sizeof(float) * (size_t)(B * H * max_len));                                    \
    float *partial = malloc(sizeof(float) * (size_t)(B * max_chunks * H * D));                             \
    if (!items || !scores || !partial) { free(items); free(scores); free(partial); return -1; }            \
    _Pragma("omp parallel num_threads(num_threads)")                                                       \
    paged_decode_team_##SUFFIX(q, kc, vc, tables, table_stride, seq_lens, out, B, H, KVH, D, bs, scale,   \
                               items, num_items, scores, max_len, partial, NULL);                          \
    free(items);                                                                                           \
    free(scores);                                                                                          \
    free(partial);                                                                                         \
    return 0;                                                                                              \
}

DEFINE_KERNEL(f32, float, f32_load, f32_store, f32_round)
DEFINE_KERNEL(bf16, uint16_t, bf16_to_f32, f32_to_bf16, bf16_round)
