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
 * tokens; the softmax runs in float32. Query head h reads KV head h / (H / KVH), as HF's repeat_kv. Work is split over (sequence, KV head) pairs
 * on the OpenMP team of the calling thread (torch's, when torch loaded libgomp first).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static inline float bf16_load(uint16_t x) {
    union { uint32_t u; float f; } v;
    v.u = (uint32_t)x << 16;
    return v.f;
}

static inline uint16_t bf16_store(float f) {
    union { uint32_t u; float f; } v;
    v.f = f;
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40u); /* NaN stays NaN */
    v.u += 0x7fffu + ((v.u >> 16) & 1u); /* round to nearest even, as torch does */
    return (uint16_t)(v.u >> 16);
}

static inline float f32_load(float x) { return x; }
static inline float f32_store(float x) { return x; }
/* Rounding to the storage type where the torch path stores an intermediate in it (its matmul outputs). */
static inline float f32_round(float x) { return x; }
static inline float bf16_round(float x) { return bf16_load(bf16_store(x)); }

/* One (sequence, KV head) pair: its G query heads against its context. `scores` holds G * len floats. */
#define DEFINE_PAIR(SUFFIX, T, LOAD, STORE, ROUND)                                                               \
static void pair_##SUFFIX(const T *q, const T *kc, const T *vc, const int64_t *table, int64_t len,         \
                          T *out, int64_t G, int64_t KVH, int64_t D, int64_t bs, int64_t kh, float scale,     \
                          float *qf, float *acc, float *scores) {                                          \
    const int64_t tok_stride = KVH * D, block_stride = bs * KVH * D;                                       \
    for (int64_t g = 0; g < G; g++)                                                                        \
        for (int64_t d = 0; d < D; d++) qf[g * D + d] = LOAD(q[(kh * G + g) * D + d]);                     \
    for (int64_t t = 0; t < len; t++) {                                                                    \
        const T *k = kc + table[t / bs] * block_stride + (t % bs) * tok_stride + kh * D;                   \
        for (int64_t g = 0; g < G; g++) {                                                                  \
            const float *qg = qf + g * D;                                                                  \
            float s = 0.0f;                                                                                \
            for (int64_t d = 0; d < D; d++) s += qg[d] * LOAD(k[d]);                                       \
            scores[g * len + t] = ROUND(s) * scale;                                                        \
        }                                                                                                  \
    }                                                                                                      \
    for (int64_t g = 0; g < G; g++) {                                                                      \
        float *sg = scores + g * len, m = sg[0], sum = 0.0f;                                               \
        for (int64_t t = 1; t < len; t++) m = sg[t] > m ? sg[t] : m;                                        \
        for (int64_t t = 0; t < len; t++) { sg[t] = expf(sg[t] - m); sum += sg[t]; }                        \
        for (int64_t t = 0; t < len; t++) sg[t] = ROUND(sg[t] / sum);                                      \
    }                                                                                                      \
    memset(acc, 0, (size_t)(G * D) * sizeof(float));                                                       \
    for (int64_t t = 0; t < len; t++) {                                                                    \
        const T *v = vc + table[t / bs] * block_stride + (t % bs) * tok_stride + kh * D;                   \
        for (int64_t g = 0; g < G; g++) {                                                                  \
            const float w = scores[g * len + t];                                                           \
            float *ag = acc + g * D;                                                                       \
            for (int64_t d = 0; d < D; d++) ag[d] += w * LOAD(v[d]);                                       \
        }                                                                                                  \
    }                                                                                                      \
    for (int64_t g = 0; g < G; g++)                                                                        \
        for (int64_t d = 0; d < D; d++) out[(kh * G + g) * D + d] = STORE(acc[g * D + d]);                 \
}                                                                                                          \
                                                                                                           \
int paged_decode_##SUFFIX(const T *q, const T *kc, const T *vc, const int64_t *tables, int64_t table_stride, \
                          const int64_t *seq_lens, T *out, int64_t B, int64_t H, int64_t KVH, int64_t D,    \
                          int64_t bs, float scale, int num_threads) {                                      \
    const int64_t G = H / KVH;                                                                             \
    int64_t max_len = 0;                                                                                   \
    for (int64_t b = 0; b < B; b++) max_len = seq_lens[b] > max_len ? seq_lens[b] : max_len;               \
    int failed = 0;                                                                                        \
    _Pragma("omp parallel num_threads(num_threads)")                                                       \
    {                                                                                                      \
        float *buf = malloc(sizeof(float) * (size_t)(2 * G * D + G * max_len));                            \
        if (!buf) {                                                                                        \
            _Pragma("omp atomic write")                                                                    \
            failed = 1;                                                                                    \
        }                                                                                                  \
        _Pragma("omp for schedule(dynamic, 1) collapse(2)")                                                \
        for (int64_t b = 0; b < B; b++)                                                                    \
            for (int64_t kh = 0; kh < KVH; kh++)                                                           \
                if (buf)                                                                                   \
                    pair_##SUFFIX(q + b * H * D, kc, vc, tables + b * table_stride, seq_lens[b],           \
                                  out + b * H * D, G, KVH, D, bs, kh, scale, buf, buf + G * D,             \
                                  buf + 2 * G * D);                                                        \
        free(buf);                                                                                         \
    }                                                                                                      \
    return failed ? -1 : 0;                                                                                \
}

DEFINE_PAIR(f32, float, f32_load, f32_store, f32_round)
DEFINE_PAIR(bf16, uint16_t, bf16_load, bf16_store, bf16_round)
