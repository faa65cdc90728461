/* What the CPU kernels' C files share: the team-level (orphaned omp for) bodies decode_step.c chains inside
 * one parallel region. Each ends on its team's barrier. */
#ifndef SERVESCOPE_CPU_KERNELS_H
#define SERVESCOPE_CPU_KERNELS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

static inline float bf16_to_f32(uint16_t x) {
    union { uint32_t u; float f; } v;
    v.u = (uint32_t)x << 16;
    return v.f;
}

static inline uint16_t f32_to_bf16(float f) {
    union { uint32_t u; float f; } v;
    v.f = f;
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40u); /* NaN stays NaN */
    v.u += 0x7fffu + ((v.u >> 16) & 1u); /* round to nearest even, as torch does */
    return (uint16_t)(v.u >> 16);
}

/* n rounded up to a whole number of 64-byte cache lines (every scratch piece starts on one). */
static inline size_t align64(size_t n) { return (n + 63) & ~(size_t)63; }

/* e^x, branch-free so that the loops over it (the SiLU, the softmax) vectorize; libm's expf is a call per
 * element. 2^n * e^r with n = round(x / ln 2) and |r| <= ln 2 / 2, e^r by its Taylor series to r^6 (relative
 * error about 1e-7, a float's own rounding). x is clamped to where 2^n stays a normal float. */
static inline __attribute__((always_inline)) float exp_f32(float x) {
    x = x < -87.0f ? -87.0f : x; /* NOTE: not fminf/fmaxf: their NaN rules keep the loop scalar */
    x = x > 88.0f ? 88.0f : x;
    const float n = nearbyintf(x * 1.44269504088896341f);
    float r = fmaf(n, -0.693145751953125f, x); /* ln 2 in two parts: the first exact in float */
    r = fmaf(n, -1.428606765330187e-06f, r);
    float p = 1.0f / 720.0f;
    p = fmaf(p, r, 1.0f / 120.0f);
    p = fmaf(p, r, 1.0f / 24.0f);
    p = fmaf(p, r, 1.0f / 6.0f);
    p = fmaf(p, r, 0.5f);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    union { int32_t i; float f; } scale = {.i = ((int32_t)n + 127) << 23};
    return p * scale.f;
}

/* Activations of M rows quantized per group of 32: codes, dx [M, G] steps, sx [M, G] = sum(x). The codes are
 * xq [M, K] int16 (16-bit activations) or x8 [M, 4K] int8 (8-bit, in the layout quant_gemv.c's 8-bit tile
 * reads); both point at the same scratch, one call uses one. x16 [M - x16_row, 8K] int8: the 16-bit codes of
 * rows x16_row on again as two byte planes, for the AVX2 and AVX-512 VNNI builds' one-row Q4 tile
 * (quant_gemv.c; NULL in other builds). */
typedef struct {
    int16_t *xq;
    int8_t *x8;
    int8_t *x16;
    int64_t x16_row;
    float *dx;
    float *sx;
} QuantActs;

/* Batches of at most this many rows are quantized by every thread of the team into its own copy (quant_gemv.c),
 * instead of once, shared, behind a barrier: a decode step of one sequence runs ~120 GEMVs, and with one row the
 * other threads would only wait (quantizing a row costs less than the barrier and the wait). The fused decode
 * step (decode_step.c) keeps such batches' residuals, norms, SiLU and rotated Q and K per thread too:
 * quant_gemm_team reads its input from each thread's own copy exactly where quant_rows_private(M) holds. */
#define PRIVATE_ROWS 4

int quant_rows_private(int64_t M);

size_t quant_scratch_bytes(int64_t M, int64_t K, int threads);
void quant_scratch_split(void *scratch, int64_t M, int64_t K, int threads, QuantActs *a, float **rows);
void quant_gemm_team(const void *x, int x_bf16, int64_t M, int64_t K, const uint8_t *packed, int bits, int act_bits,
                     int64_t N, void *out, int out_bf16, const QuantActs *acts, float *rows);

/* The new token's K and V of each row, when the attention reads them from here and not from the cache (the fused
 * step's rows kept per thread; decode_step.c): row b's KV head g at k + b * k_stride + g * D (v alike), in the
 * cache's dtype. */
typedef struct {
    const void *k;
    int64_t k_stride;
    const void *v;
    int64_t v_stride;
} NewTokens;

void paged_decode_plan(const int64_t *seq_lens, int64_t B, int64_t bs, int64_t *max_len, int64_t *num_items);
void paged_decode_team_f32(const float *q, const float *kc, const float *vc, const int64_t *tables,
                           int64_t table_stride, const int64_t *seq_lens, float *out, int64_t B, int64_t H,
                           int64_t KVH, int64_t D, int64_t bs, float scale, int64_t *items, int64_t num_items,
                           float *scores, int64_t max_len, float *partial, const NewTokens *fresh);
void paged_decode_team_bf16(const uint16_t *q, const uint16_t *kc, const uint16_t *vc, const int64_t *tables,
                            int64_t table_stride, const int64_t *seq_lens, uint16_t *out, int64_t B, int64_t H,
                            int64_t KVH, int64_t D, int64_t bs, float scale, int64_t *items, int64_t num_items,
                            float *scores, int64_t max_len, float *partial, const NewTokens *fresh);

#endif
