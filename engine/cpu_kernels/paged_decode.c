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

#define CHUNK_BLOCKS 4

static inline float f32_load(float x) { return x; }
static inline float f32_store(float x) { return x; }
/* Rounding to the storage type where the torch path stores an intermediate in it (its matmul outputs). */
static inline float f32_round(float x) { return x; }
static inline float bf16_round(float x) { return bf16_to_f32(f32_to_bf16(x)); }

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

/* paged_decode_team_*: the four passes, for a thread team already running (orphaned omp for: every thread
 * of the enclosing parallel region calls it). Scratch from the caller: items [2 * num_items] int64,
 * scores [B * H * max_len] and partial [B * max_chunks * H * D] float32 (see paged_decode_plan).
 * paged_decode_*: the same on its own team, with its own scratch. */
#define DEFINE_KERNEL(SUFFIX, T, LOAD, STORE, ROUND)                                                        \
void paged_decode_team_##SUFFIX(const T *q, const T *kc, const T *vc, const int64_t *tables,               \
                                int64_t table_stride, const int64_t *seq_lens, T *out, int64_t B, int64_t H, \
                                int64_t KVH, int64_t D, int64_t bs, float scale, int64_t *items,           \
                                int64_t num_items, float *scores, int64_t max_len, float *partial) {         \
    const int64_t G = H / KVH, row = KVH * D, block_stride = bs * KVH * D, chunk = CHUNK_BLOCKS * bs;      \
    const int64_t max_chunks = (max_len + chunk - 1) / chunk;                                              \
    /* item i is (sequence items[2i], chunk items[2i + 1]): that sequence's tokens [chunk * c, chunk * (c + 1)) */ \
    _Pragma("omp single")                                                                                  \
    {                                                                                                      \
        int64_t n = 0;                                                                                     \
        for (int64_t b = 0; b < B; b++)                                                                    \
            for (int64_t c = 0; c * chunk < seq_lens[b]; c++) { items[2 * n] = b; items[2 * n + 1] = c; n++; } \
    }                                                                                                      \
    {                                                                                                      \
        float qf[H * D];                                                                                   \
        _Pragma("omp for schedule(dynamic, 1)")                                                            \
        for (int64_t i = 0; i < num_items; i++) {                                                          \
            const int64_t b = items[2 * i], c = items[2 * i + 1], len = seq_lens[b];                       \
            const int64_t t0 = c * chunk, t1 = t0 + chunk < len ? t0 + chunk : len;                        \
            for (int64_t j = 0; j < H * D; j++) qf[j] = LOAD(q[b * H * D + j]);                            \
            float *sb = scores + b * H * max_len;                                                          \
            for (int64_t t = t0; t < t1; t++) {                                                            \
                const T *k = kc + tables[b * table_stride + t / bs] * block_stride + (t % bs) * row;       \
                for (int64_t h = 0; h < H; h++) {                                                          \
                    const float *qh = qf + h * D;                                                          \
                    const T *kh = k + (h / G) * D;                                                         \
                    float s = 0.0f;                                                                        \
                    for (int64_t d = 0; d < D; d++) s += qh[d] * LOAD(kh[d]);                              \
                    sb[h * max_len + t] = ROUND(s) * scale;                                                \
                }                                                                                          \
            }                                                                                              \
        }                                                                                                  \
        _Pragma("omp for schedule(static)")                                                                \
        for (int64_t bh = 0; bh < B * H; bh++) {                                                           \
            const int64_t len = seq_lens[bh / H];                                                          \
            float *s = scores + bh * max_len, m = s[0], sum = 0.0f;                                        \
            for (int64_t t = 1; t < len; t++) m = s[t] > m ? s[t] : m;                                      \
            for (int64_t t = 0; t < len; t++) { s[t] = exp_f32(s[t] - m); sum += s[t]; }                       \
            for (int64_t t = 0; t < len; t++) s[t] = ROUND(s[t] / sum);                                    \
        }                                                                                                  \
        _Pragma("omp for schedule(dynamic, 1)")                                                            \
        for (int64_t i = 0; i < num_items; i++) {                                                          \
            const int64_t b = items[2 * i], c = items[2 * i + 1], len = seq_lens[b];                       \
            const int64_t t0 = c * chunk, t1 = t0 + chunk < len ? t0 + chunk : len;                        \
            float *acc = partial + (b * max_chunks + c) * H * D;                                           \
            const float *sb = scores + b * H * max_len;                                                    \
            memset(acc, 0, sizeof(float) * (size_t)(H * D));                                               \
            for (int64_t t = t0; t < t1; t++) {                                                            \
                const T *v = vc + tables[b * table_stride + t / bs] * block_stride + (t % bs) * row;       \
                for (int64_t h = 0; h < H; h++) {                                                          \
                    const float w = sb[h * max_len + t];                                                   \
                    const T *vh = v + (h / G) * D;                                                         \
                    float *ah = acc + h * D;                                                               \
                    for (int64_t d = 0; d < D; d++) ah[d] += w * LOAD(vh[d]);                              \
                }                                                                                          \
            }                                                                                              \
        }                                                                                                  \
        _Pragma("omp for schedule(static)")                                                                \
        for (int64_t bh = 0; bh < B * H; bh++) {                                                           \
            const int64_t b = bh / H, h = bh % H, chunks = (seq_lens[b] + chunk - 1) / chunk;              \
            for (int64_t d = 0; d < D; d++) {                                                              \
                float s = 0.0f;                                                                            \
                for (int64_t c = 0; c < chunks; c++) s += partial[((b * max_chunks + c) * H + h) * D + d]; \
                out[bh * D + d] = STORE(s);                                                                \
            }                                                                                              \
        }                                                                                                  \
    }                                                                                                      \
}                                                                                                          \
                                                                                                           \
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
                               items, num_items, scores, max_len, partial);                                \
    free(items);                                                                                           \
    free(scores);                                                                                          \
    free(partial);                                                                                         \
    return 0;                                                                                              \
}

DEFINE_KERNEL(f32, float, f32_load, f32_store, f32_round)
DEFINE_KERNEL(bf16, uint16_t, bf16_to_f32, f32_to_bf16, bf16_round)
