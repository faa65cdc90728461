/* GEMV/GEMM of float activations with weights stored as 4-bit or 8-bit codes in groups of 32 inputs (the
 * GGUF's Q4_1 and Q8_0), for the CPU's quantized path. Built and loaded by engine/cpu_kernels/build.py.
 *
 * out[m, n] = sum_k x[m, k] * w[n, k], with per group g of 32 inputs:
 *   Q4:  w = d[n, g] * code + mn[n, g]     (code 0..15, Q4_1)
 *   Q8:  w = d[n, g] * (code - 128)        (code 0..255 stores Q8_0's signed value + 128)
 * The activations are quantized per row and group to int8 (xq = round(x * (127 / max|x|)), dx = max|x| * (1 / 127)),
 * as llama.cpp does, so the dot products run on integer instructions (AVX-512 VNNI vpdpbusd: unsigned codes
 * times signed activations, four products per 32-bit lane; AVX2 maddubs; or plain C):
 *   Q4:  d * dx * sum(code * xq) + mn * sum(x)      (sum(x) unquantized: the min term carries no extra error)
 *   Q8:  d * dx * (sum(code * xq) - 128 * sum(xq))
 *
 * Packed weight layout (engine/cpu_kernels/quant_pack.py writes it): output rows in tiles of 16 (rows padded
 * with zeros to a multiple of 16), one record per (tile, group), records ordered tile-major so one thread
 * streams its tiles' bytes in order. Each 32-bit lane of a register is one output row of the tile:
 *   Q4 record (320 bytes = 16 rows x 20, Q4_1's own size):
 *     nib[p][r][b], p < 4, r < 16, b < 4: low nibble code(r, 4p + b), high nibble code(r, 16 + 4p + b)
 *                   (for each row, exactly the 16 code bytes of its Q4_1 block, as 4-byte words)
 *     d[16] float16, mn[16] float16
 *   Q8 record (544 bytes = 16 rows x 34, Q8_0's own size):
 *     code[j][r][b], j < 8, r < 16, b < 4: code(r, 4j + b);  d[16] float16
 * NOTE: the activations' quantization is the same in every instruction set (the same float operations
 * rounded the same way), so every build gives the same integer dot products.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#define QG_AVX512_VNNI 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define QG_AVX2 1
#endif

#define TILE 16
#define GROUP 32
#define Q4_RECORD 320
#define Q8_RECORD 544
#define MBLOCK 4 /* activation rows sharing one unpacked tile group */

const char *quant_gemv_isa(void) {
#if defined(QG_AVX512_VNNI)
    return "avx512-vnni";
#elif defined(QG_AVX2)
    return "avx2";
#else
    return "scalar";
#endif
}

static inline float f16_to_f32(uint16_t h) {
#if defined(QG_AVX512_VNNI) || defined(QG_AVX2)
    return _cvtsh_ss(h);
#else
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    union { uint32_t u; float f; } v;
    if (exp == 0) { /* zero or subnormal: man * 2^-24 */
        v.f = (float)man * 5.9604644775390625e-08f;
        v.u |= sign;
    } else if (exp == 31) {
        v.u = sign | 0x7f800000u | (man << 13);
    } else {
        v.u = sign | ((exp + 112u) << 23) | (man << 13);
    }
    return v.f;
#endif
}


static void quantize_row(const float *x, int64_t K, int8_t *xq, float *dx, float *sx, int32_t *isum) {
    for (int64_t g = 0; g < K / GROUP; g++) {
        const float *xg = x + g * GROUP;
        float amax = 0.0f, sum = 0.0f;
        for (int k = 0; k < GROUP; k++) {
            const float a = fabsf(xg[k]);
            amax = a > amax ? a : amax;
            sum += xg[k];
        }
        const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        int32_t s = 0;
        for (int k = 0; k < GROUP; k++) {
            const int32_t q = (int32_t)nearbyintf(xg[k] * inv);
            xq[g * GROUP + k] = (int8_t)q;
            s += q;
        }
        dx[g] = amax * (1.0f / 127.0f); /* NOTE: as written: the build's -freciprocal-math would make a
                                            * division this multiplication anyway, the tests' reference does it */
        sx[g] = sum;
        isum[g] = s;
    }
}

/* Row m of x (float32 or bfloat16) into QuantActs; `row` is K floats of scratch. */
static void quantize_one(const void *x, int x_bf16, int64_t m, int64_t K, const QuantActs *a, float *row) {
    const float *src;
    if (x_bf16) {
        const uint16_t *xb = (const uint16_t *)x + m * K;
        for (int64_t k = 0; k < K; k++) row[k] = bf16_to_f32(xb[k]);
        src = row;
    } else {
        src = (const float *)x + m * K;
    }
    const int64_t G = K / GROUP;
    quantize_row(src, K, a->xq + m * K, a->dx + m * G, a->sx + m * G, a->isum + m * G);
}

static inline void store_rows(const float *acc /* [rows][TILE] */, int rows, int64_t m0, int64_t n0, int64_t N,
                              void *out, int out_bf16) {
    const int64_t valid = N - n0 < TILE ? N - n0 : TILE;
    for (int i = 0; i < rows; i++) {
        if (out_bf16) {
            uint16_t *o = (uint16_t *)out + (m0 + i) * N + n0;
            for (int64_t r = 0; r < valid; r++) o[r] = f32_to_bf16(acc[i * TILE + r]);
        } else {
            float *o = (float *)out + (m0 + i) * N + n0;
            for (int64_t r = 0; r < valid; r++) o[r] = acc[i * TILE + r];
        }
    }
}

#if defined(QG_AVX512_VNNI)

static inline __m512i bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* One tile, activation rows m0 .. m0 + MB - 1: Q4 records. MB is a constant at every call site. */
static inline __attribute__((always_inline)) void q4_tile(const uint8_t *rec, int64_t G, const QuantActs *a,
                                                          int64_t K, int64_t m0, int MB, float *acc_out) {
    const __m512i low = _mm512_set1_epi8(0x0f);
    __m512 acc[MBLOCK];
    for (int i = 0; i < MB; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t g = 0; g < G; g++, rec += Q4_RECORD) {
        __m512i c[8];
        for (int p = 0; p < 4; p++) {
            const __m512i packed = _mm512_loadu_si512(rec + 64 * p);
            c[p] = _mm512_and_si512(packed, low);
            c[p + 4] = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low);
        }
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rec + 256)));
        const __m512 mn = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rec + 288)));
        for (int i = 0; i < MB; i++) {
            const int64_t m = m0 + i;
            const int8_t *xq = a->xq + m * K + g * GROUP;
            /* two chains: with one activation row a single chain of 8 dependent vpdpbusd would bound the loop */
            __m512i dot = _mm512_setzero_si512(), dot2 = _mm512_setzero_si512();
            for (int j = 0; j < 8; j += 2) {
                dot = _mm512_dpbusd_epi32(dot, c[j], bcast4(xq + 4 * j));
                dot2 = _mm512_dpbusd_epi32(dot2, c[j + 1], bcast4(xq + 4 * j + 4));
            }
            dot = _mm512_add_epi32(dot, dot2);
            const __m512 scale = _mm512_mul_ps(d, _mm512_set1_ps(a->dx[m * G + g]));
            acc[i] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(dot), acc[i]);
            acc[i] = _mm512_fmadd_ps(mn, _mm512_set1_ps(a->sx[m * G + g]), acc[i]);
        }
    }
    for (int i = 0; i < MB; i++) _mm512_storeu_ps(acc_out + i * TILE, acc[i]);
}

static inline __attribute__((always_inline)) void q8_tile(const uint8_t *rec, int64_t G, const QuantActs *a,
                                                          int64_t K, int64_t m0, int MB, float *acc_out) {
    __m512 acc[MBLOCK];
    for (int i = 0; i < MB; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t g = 0; g < G; g++, rec += Q8_RECORD) {
        __m512i c[8];
        for (int j = 0; j < 8; j++) c[j] = _mm512_loadu_si512(rec + 64 * j);
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rec + 512)));
        for (int i = 0; i < MB; i++) {
            const int64_t m = m0 + i;
            const int8_t *xq = a->xq + m * K + g * GROUP;
            __m512i dot = _mm512_set1_epi32(-128 * a->isum[m * G + g]), dot2 = _mm512_setzero_si512();
            for (int j = 0; j < 8; j += 2) {
                dot = _mm512_dpbusd_epi32(dot, c[j], bcast4(xq + 4 * j));
                dot2 = _mm512_dpbusd_epi32(dot2, c[j + 1], bcast4(xq + 4 * j + 4));
            }
            dot = _mm512_add_epi32(dot, dot2);
            const __m512 scale = _mm512_mul_ps(d, _mm512_set1_ps(a->dx[m * G + g]));
            acc[i] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(dot), acc[i]);
        }
    }
    for (int i = 0; i < MB; i++) _mm512_storeu_ps(acc_out + i * TILE, acc[i]);
}

#elif defined(QG_AVX2)

static inline __m256i bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* AVX2 has no unsigned-times-signed 4-way dot: maddubs gives pairs in int16, madd with ones sums them. The
 * tile's 16 rows are two halves of 8 lanes. */
static inline __attribute__((always_inline)) void q4_tile(const uint8_t *rec, int64_t G, const QuantActs *a,
                                                          int64_t K, int64_t m0, int MB, float *acc_out) {
    const __m256i low = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    __m256 acc[MBLOCK][2];
    for (int i = 0; i < MB; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    for (int64_t g = 0; g < G; g++, rec += Q4_RECORD) {
        for (int h = 0; h < 2; h++) {
            __m256i c[8];
            for (int p = 0; p < 4; p++) {
                const __m256i packed = _mm256_loadu_si256((const __m256i *)(rec + 64 * p + 32 * h));
                c[p] = _mm256_and_si256(packed, low);
                c[p + 4] = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low);
            }
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(rec + 256 + 16 * h)));
            const __m256 mn = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(rec + 288 + 16 * h)));
            for (int i = 0; i < MB; i++) {
                const int64_t m = m0 + i;
                const int8_t *xq = a->xq + m * K + g * GROUP;
                /* NOTE: eight pair sums of at most 2 * 15 * 127 each stay within int16. */
                __m256i pairs = _mm256_setzero_si256();
                for (int j = 0; j < 8; j++) pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(c[j], bcast4(xq + 4 * j)));
                const __m256i dot = _mm256_madd_epi16(pairs, ones);
                const __m256 scale = _mm256_mul_ps(d, _mm256_set1_ps(a->dx[m * G + g]));
                acc[i][h] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(dot), acc[i][h]);
                acc[i][h] = _mm256_fmadd_ps(mn, _mm256_set1_ps(a->sx[m * G + g]), acc[i][h]);
            }
        }
    }
    for (int i = 0; i < MB; i++) {
        _mm256_storeu_ps(acc_out + i * TILE, acc[i][0]);
        _mm256_storeu_ps(acc_out + i * TILE + 8, acc[i][1]);
    }
}

static inline __attribute__((always_inline)) void q8_tile(const uint8_t *rec, int64_t G, const QuantActs *a,
                                                          int64_t K, int64_t m0, int MB, float *acc_out) {
    const __m256i flip = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
    __m256 acc[MBLOCK][2];
    for (int i = 0; i < MB; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    for (int64_t g = 0; g < G; g++, rec += Q8_RECORD) {
        for (int h = 0; h < 2; h++) {
            __m256i wabs[8], wsign[8];
            for (int j = 0; j < 8; j++) {
                /* code ^ 0x80 is the signed Q8_0 value; maddubs wants |w| unsigned and the sign moved onto x */
                wsign[j] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(rec + 64 * j + 32 * h)), flip);
                wabs[j] = _mm256_abs_epi8(wsign[j]);
            }
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(rec + 512 + 16 * h)));
            for (int i = 0; i < MB; i++) {
                const int64_t m = m0 + i;
                const int8_t *xq = a->xq + m * K + g * GROUP;
                __m256i dot = _mm256_setzero_si256();
                for (int j = 0; j < 8; j++) {
                    /* NOTE: |w| <= 127 and |x| <= 127, so a pair sum fits int16 */
                    const __m256i pair = _mm256_maddubs_epi16(wabs[j], _mm256_sign_epi8(bcast4(xq + 4 * j), wsign[j]));
                    dot = _mm256_add_epi32(dot, _mm256_madd_epi16(pair, ones));
                }
                const __m256 scale = _mm256_mul_ps(d, _mm256_set1_ps(a->dx[m * G + g]));
                acc[i][h] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(dot), acc[i][h]);
            }
        }
    }
    for (int i = 0; i < MB; i++) {
        _mm256_storeu_ps(acc_out + i * TILE, acc[i][0]);
        _mm256_storeu_ps(acc_out + i * TILE + 8, acc[i][1]);
    }
}

#else /* plain C */

static inline void q4_tile(const uint8_t *rec, int64_t G, const QuantActs *a, int64_t K, int64_t m0, int MB,
                           float *acc_out) {
    for (int i = 0; i < MB * TILE; i++) acc_out[i] = 0.0f;
    for (int64_t g = 0; g < G; g++, rec += Q4_RECORD) {
        const uint16_t *dh = (const uint16_t *)(rec + 256), *mh = (const uint16_t *)(rec + 288);
        for (int i = 0; i < MB; i++) {
            const int64_t m = m0 + i;
            const int8_t *xq = a->xq + m * K + g * GROUP;
            for (int r = 0; r < TILE; r++) {
                int32_t dot = 0;
                for (int p = 0; p < 4; p++)
                    for (int b = 0; b < 4; b++) {
                        const uint8_t byte = rec[(p * TILE + r) * 4 + b];
                        dot += (byte & 0x0f) * xq[4 * p + b] + (byte >> 4) * xq[16 + 4 * p + b];
                    }
                float *acc = acc_out + i * TILE + r;
                *acc = fmaf(f16_to_f32(dh[r]) * a->dx[m * G + g], (float)dot, *acc);
                *acc = fmaf(f16_to_f32(mh[r]), a->sx[m * G + g], *acc);
            }
        }
    }
}

static inline void q8_tile(const uint8_t *rec, int64_t G, const QuantActs *a, int64_t K, int64_t m0, int MB,
                           float *acc_out) {
    for (int i = 0; i < MB * TILE; i++) acc_out[i] = 0.0f;
    for (int64_t g = 0; g < G; g++, rec += Q8_RECORD) {
        const uint16_t *dh = (const uint16_t *)(rec + 512);
        for (int i = 0; i < MB; i++) {
            const int64_t m = m0 + i;
            const int8_t *xq = a->xq + m * K + g * GROUP;
            for (int r = 0; r < TILE; r++) {
                int32_t dot = -128 * a->isum[m * G + g];
                for (int j = 0; j < 8; j++)
                    for (int b = 0; b < 4; b++) dot += rec[(j * TILE + r) * 4 + b] * xq[4 * j + b];
                float *acc = acc_out + i * TILE + r;
                *acc = fmaf(f16_to_f32(dh[r]) * a->dx[m * G + g], (float)dot, *acc);
            }
        }
    }
}

#endif

/* Inside a running thread team (orphaned omp for): quantize x's rows into `acts`, then every tile. `rows` is
 * K floats of scratch per thread of the team. Ends on the team's barrier: `out` is complete on return. */
void quant_gemm_team(const void *x, int x_bf16, int64_t M, int64_t K, const uint8_t *packed, int bits, int64_t N,
                     void *out, int out_bf16, const QuantActs *acts, float *rows) {
    const int64_t G = K / GROUP, num_tiles = (N + TILE - 1) / TILE;
    const size_t record = bits == 4 ? Q4_RECORD : Q8_RECORD;
#ifdef _OPENMP
    float *row = rows + (int64_t)omp_get_thread_num() * K;
#else
    float *row = rows;
#endif
    #pragma omp for schedule(static)
    for (int64_t m = 0; m < M; m++) quantize_one(x, x_bf16, m, K, acts, row);
    #pragma omp for schedule(static)
    for (int64_t t = 0; t < num_tiles; t++) {
        const uint8_t *rec = packed + (size_t)(t * G) * record;
        float acc[MBLOCK * TILE] __attribute__((aligned(64)));
        for (int64_t m0 = 0; m0 < M; m0 += MBLOCK) {
            const int64_t left = M - m0;
            if (bits == 4) {
                switch (left >= MBLOCK ? MBLOCK : left) {
                case 4: q4_tile(rec, G, acts, K, m0, 4, acc); break;
                case 3: q4_tile(rec, G, acts, K, m0, 3, acc); break;
                case 2: q4_tile(rec, G, acts, K, m0, 2, acc); break;
                default: q4_tile(rec, G, acts, K, m0, 1, acc); break;
                }
            } else {
                switch (left >= MBLOCK ? MBLOCK : left) {
                case 4: q8_tile(rec, G, acts, K, m0, 4, acc); break;
                case 3: q8_tile(rec, G, acts, K, m0, 3, acc); break;
                case 2: q8_tile(rec, G, acts, K, m0, 2, acc); break;
                default: q8_tile(rec, G, acts, K, m0, 1, acc); break;
                }
            }
            store_rows(acc, left >= MBLOCK ? MBLOCK : (int)left, m0, t * TILE, N, out, out_bf16);
        }
    }
}

/* Bytes of scratch quant_gemm_team needs for M rows of K inputs on `threads` threads. */
size_t quant_scratch_bytes(int64_t M, int64_t K, int threads) {
    const int64_t G = K / GROUP;
    return (((size_t)(M * K) + 63) & ~(size_t)63) + 3 * sizeof(float) * (size_t)(M * G)
           + sizeof(float) * (size_t)(threads * K);
}

/* Carve `scratch` (quant_scratch_bytes of it, 64-byte aligned) into the activations and per-thread rows. */
void quant_scratch_split(void *scratch, int64_t M, int64_t K, QuantActs *a, float **rows) {
    const int64_t G = K / GROUP;
    char *p = scratch;
    a->xq = (int8_t *)p;
    a->dx = (float *)(p + (((size_t)(M * K) + 63) & ~(size_t)63));
    a->sx = a->dx + M * G;
    a->isum = (int32_t *)(a->sx + M * G);
    *rows = (float *)(a->isum + M * G);
}

/* The activations' scratch of quant_gemm, per calling thread, grown on demand and kept (a step calls it often). */
static __thread void *scratch;
static __thread size_t scratch_bytes;

/* x [M, K] (float32, or bfloat16 when x_bf16) times the packed [N, K] weight (bits 4 or 8) into out [M, N]
 * (float32, or bfloat16 when out_bf16). Threads quantize rows, then take whole tiles. Returns 0, or -1 when
 * the scratch cannot be allocated, -2 for a bad argument. */
int quant_gemm(const void *x, int x_bf16, int64_t M, int64_t K, const uint8_t *packed, int bits, int64_t N,
               void *out, int out_bf16, int num_threads) {
    if (K % GROUP || (bits != 4 && bits != 8) || M < 0 || N < 0) return -2;
    if (M == 0 || N == 0) return 0;
    if (num_threads < 1) num_threads = 1;
    const size_t need = quant_scratch_bytes(M, K, num_threads);
    if (need > scratch_bytes) {
        free(scratch);
        scratch = aligned_alloc(64, (need + 63) & ~(size_t)63);
        scratch_bytes = scratch ? need : 0;
        if (!scratch) return -1;
    }
    QuantActs acts;
    float *rows;
    quant_scratch_split(scratch, M, K, &acts, &rows);
    #pragma omp parallel num_threads(num_threads)
    quant_gemm_team(x, x_bf16, M, K, packed, bits, N, out, out_bf16, &acts, rows);
    return 0;
}

/* The activation quantization alone, for tests: xq [M, K], dx, sx [M, K / 32] float32, isum int32. */
int quant_activations(const void *x, int x_bf16, int64_t M, int64_t K, int8_t *xq, float *dx, float *sx,
                      int32_t *isum) {
    if (K % GROUP) return -2;
    float *row = malloc(sizeof(float) * (size_t)(K > 0 ? K : 1));
    if (!row) return -1;
    const QuantActs a = {xq, dx, sx, isum};
    for (int64_t m = 0; m < M; m++) quantize_one(x, x_bf16, m, K, &a, row);
    free(row);
    return 0;
}
