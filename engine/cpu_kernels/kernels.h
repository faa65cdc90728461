/* What the CPU kernels' C files share: the team-level (orphaned omp for) bodies decode_step.c chains inside
 * one parallel region. Each ends on its team's barrier. */
#ifndef SERVESCOPE_CPU_KERNELS_H
#define SERVESCOPE_CPU_KERNELS_H

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

/* Activations of M rows quantized per group of 32: xq [M, K] int16, dx [M, G] steps, sx [M, G] = sum(x). */
typedef struct {
    int16_t *xq;
    float *dx;
    float *sx;
} QuantActs;

size_t quant_scratch_bytes(int64_t M, int64_t K, int threads);
void quant_scratch_split(void *scratch, int64_t M, int64_t K, QuantActs *a, float **rows);
void quant_gemm_team(const void *x, int x_bf16, int64_t M, int64_t K, const uint8_t *packed, int bits, int64_t N,
                     void *out, int out_bf16, const QuantActs *acts, float *rows);

void paged_decode_plan(const int64_t *seq_lens, int64_t B, int64_t bs, int64_t *max_len, int64_t *num_items);
void paged_decode_team_f32(const float *q, const float *kc, const float *vc, const int64_t *tables,
                           int64_t table_stride, const int64_t *seq_lens, float *out, int64_t B, int64_t H,
                           int64_t KVH, int64_t D, int64_t bs, float scale, int64_t *items, int64_t num_items,
                           float *scores, int64_t max_len, float *partial);
void paged_decode_team_bf16(const uint16_t *q, const uint16_t *kc, const uint16_t *vc, const int64_t *tables,
                            int64_t table_stride, const int64_t *seq_lens, uint16_t *out, int64_t B, int64_t H,
                            int64_t KVH, int64_t D, int64_t bs, float scale, int64_t *items, int64_t num_items,
                            float *scores, int64_t max_len, float *partial);

#endif
