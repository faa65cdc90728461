/* The Q4 byte tiles of quant_gemv.c, included by it once after quant_tiles.h (whose AVX2 helpers they share):
 * gemm_tile_a8, 8-bit activations, in AVX-512 VNNI, AVX2 or plain C; gemm_tile_planes, 16-bit activations as
 * two byte planes, in AVX-512 VNNI or AVX2. The layouts and the arithmetic are described at the top of
 * quant_gemv.c. */
#ifndef SERVESCOPE_QUANT_BYTE_TILES_H
#define SERVESCOPE_QUANT_BYTE_TILES_H

/* The 8-bit-activation tile: Q4 codes times 8-bit activations (see the top). */
#if defined(QG_BYTE_VNNI)

/* Block p's codes with each 32-bit lane one row's four codes in order (vpdpbusd sums four byte products a
 * lane): c[0] codes 4p .. 4p + 3 (the low nibbles), c[1] codes 16 + 4p .. 16 + 4p + 3 (the high ones). The
 * byte shuffle gathers a row's two pairs, which the layout keeps 8 bytes apart. */
static inline __attribute__((always_inline)) void q4_row_codes(const uint8_t *rec, int p, __m512i c[2]) {
    const __m512i low = _mm512_set1_epi8(0x0f);
    const __m512i rows_together = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13,
                                                                       6, 7, 14, 15));
    const __m512i packed = _mm512_shuffle_epi8(_mm512_loadu_si512(rec + 64 * p), rows_together);
    c[0] = _mm512_and_si512(packed, low);
    c[1] = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low);
}

/* One group's Q4_1 sum of one row into its accumulator: acc + d * dx * dot + mn * sx. */
static inline __attribute__((always_inline)) __m512 q4_group_add(__m512 acc, const uint8_t *rec, __m512i dot,
                                                                float dx, float sx) {
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rec + 256)));
    const __m512 mn = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rec + 288)));
    acc = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(dx)), _mm512_cvtepi32_ps(dot), acc);
    return _mm512_fmadd_ps(mn, _mm512_set1_ps(sx), acc);
}

/* One tile's 16 rows, activation rows m0 .. m0 + MB - 1, into acc_out [MB][16]: per row two chains of
 * vpdpbusd (unsigned codes times signed activations; at most 16 x 15 x 127 a chain, exact). */
static inline __attribute__((always_inline)) void gemm_tile_a8(const uint8_t *rec, int64_t G, const QuantActs *a,
                                                               int64_t K, int64_t m0, int MB, float *acc_out) {
    __m512 acc[MBLOCK];
    for (int i = 0; i < MB; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t g = 0; g < G; g++, rec += Q4_RECORD) {
        prefetch_ahead(rec, Q4_RECORD, MB);
        __m512i lo[MBLOCK], hi[MBLOCK];
        for (int i = 0; i < MB; i++) lo[i] = hi[i] = _mm512_setzero_si512();
        for (int p = 0; p < 4; p++) {
            __m512i c[2];
            q4_row_codes(rec, p, c);
            for (int i = 0; i < MB; i++) {
                const int8_t *xa = a->x8 + (m0 + i) * 4 * K + g * 4 * GROUP;
                lo[i] = _mm512_dpbusd_epi32(lo[i], c[0], bcast4(xa + 4 * p));
                hi[i] = _mm512_dpbusd_epi32(hi[i], c[1], bcast4(xa + 16 + 4 * p));
            }
        }
        for (int i = 0; i < MB; i++) {
            const int64_t m = m0 + i;
            acc[i] = q4_group_add(acc[i], rec, _mm512_add_epi32(lo[i], hi[i]), a->dx[m * G + g], a->sx[m * G + g]);
        }
    }
    for (int i = 0; i < MB; i++) _mm512_storeu_ps(acc_out + i * TILE, acc[i]);
}

/* The Q4 tile with 16-bit activations read as two byte planes (xq = 256 * hi + lo, quantize_planes): vpdpbusd
 * of the codes with hi (signed) and of lo (unsigned) with the codes (0 .. 15, the same as signed bytes), no
 * code widened to 16 bits; both sums exact in int32, so the outputs are the widening tile's. */
static inline __attribute__((always_inline)) void gemm_tile_planes(const uint8_t *rec, int64_t G,
                                                                   const QuantActs *a, int64_t K, int64_t m0,
                                                                   int MB, float *acc_out) {
    __m512 acc[MBLOCK];
    for (int i = 0; i < MB; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t g = 0; g < G; g++, rec += Q4_RECORD) {
        prefetch_ahead(rec, Q4_RECORD, MB);
        __m512i hi[MBLOCK], lo[MBLOCK];
        for (int i = 0; i < MB; i++) hi[i] = lo[i] = _mm512_setzero_si512();
        for (int p = 0; p < 4; p++) {
            __m512i c[2];
            q4_row_codes(rec, p, c);
            for (int i = 0; i < MB; i++) {
                const int8_t *xh = a->x16 + ((m0 + i - a->x16_row) * G + g) * 8 * GROUP, *xl = xh + 4 * GROUP;
                hi[i] = _mm512_dpbusd_epi32(hi[i], c[0], bcast4(xh + 4 * p));
                hi[i] = _mm512_dpbusd_epi32(hi[i], c[1], bcast4(xh + 16 + 4 * p));
                lo[i] = _mm512_dpbusd_epi32(lo[i], bcast4(xl + 4 * p), c[0]);
                lo[i] = _mm512_dpbusd_epi32(lo[i], bcast4(xl + 16 + 4 * p), c[1]);
            }
        }
        for (int i = 0; i < MB; i++) {
            const int64_t m = m0 + i;
            const __m512i dot = _mm512_add_epi32(_mm512_slli_epi32(hi[i], 8), lo[i]);
            acc[i] = q4_group_add(acc[i], rec, dot, a->dx[m * G + g], a->sx[m * G + g]);
        }
    }
    for (int i = 0; i < MB; i++) _mm512_storeu_ps(acc_out + i * TILE, acc[i]);
}

#elif defined(QG_A8_AVX2)

/* One tile's 16 rows, activation rows m0 .. m0 + MB - 1, into acc_out [MB][16]. Both halves of 8 rows block by
 * block, as the 16-bit AVX2 tile does (one broadcast of each activation quad for the 16 rows; no group of codes
 * kept whole beside the sums): a one-row step's layers 2.72 -> 2.35 ms, four rows 6.11 -> 5.67, eight 10.85 ->
 * 10.37 (fused step on fixed inputs, interleaved builds, 2-core AVX2 EPYC, 2026-12-07). */
static inline __attribute__((always_inline)) void gemm_tile_a8(const uint8_t *rec, int64_t G, const QuantActs *a,
                                                               int64_t K, int64_t m0, int MB, float *acc_out) {
    const __m256i ones = _mm256_set1_epi16(1), rows_together = ROWS_TOGETHER;
    __m256 acc[MBLOCK][2];
    for (int i = 0; i < MB; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    for (int64_t g = 0; g < G; g++, rec += Q4_RECORD) {
        prefetch_ahead(rec, Q4_RECORD, MB);
        /* sum[i][h]: row i's products with half h's codes, pairs summed in int16 (at most 8 x 2 x 15 x 127 =
         * 30480 over a group in any order: no wrap) */
        __m256i sum[MBLOCK][2];
        for (int i = 0; i < MB; i++) sum[i][0] = sum[i][1] = _mm256_setzero_si256();
        for (int p = 0; p < 4; p++) {
            __m256i c[2][2];
            q4_nibbles(rec, p, c);
            for (int i = 0; i < MB; i++) {
                const int8_t *xa = a->x8 + (m0 + i) * 4 * K + g * 4 * GROUP;
                const __m256i x0 = quad(xa, p), x1 = quad(xa, p + 4);
                for (int h = 0; h < 2; h++)
                    sum[i][h] = _mm256_add_epi16(sum[i][h], _mm256_add_epi16(_mm256_maddubs_epi16(c[h][0], x0),
                                                                             _mm256_maddubs_epi16(c[h][1], x1)));
            }
        }
        for (int h = 0; h < 2; h++)
            for (int i = 0; i < MB; i++) {
                const int64_t m = m0 + i;
                const __m256i dot = _mm256_madd_epi16(_mm256_shuffle_epi8(sum[i][h], rows_together), ones);
                acc[i][h] = q4_group_add(acc[i][h], rec, h, dot, a->dx[m * G + g], a->sx[m * G + g]);
            }
    }
    store_halves(acc, MB, acc_out);
}

#if defined(QG_A16_PLANES)

/* The Q4 tile with 16-bit activations read as two byte planes (xq = 256 * hi + lo, quantize_planes): the 8-bit
 * tile's arithmetic twice, code * hi (signed) and lo (unsigned) * code, no code widened to 16 bits.
 * Over a group the hi sums stay within int16 (8 x 2 x 15 x 128 = 30720) and the lo sums within uint16
 * (8 x 2 x 255 x 15 = 61200; the adds wrap alike, the sum is read unsigned), so the integer sums are the
 * 16-bit tile's exactly. One-row rate from L2 18.4 GB/s a thread against 16.5 for the widening tile; SmolLM2's
 * layers in a one-row fused step 0.88-0.97x its time (three runs of interleaved builds, and 0.96x at another
 * moment: the gain is largest when the host is slow, where the widening tile bound the step; 2-core AVX2 EPYC,
 * 2026-12-07). */
static inline __attribute__((always_inline)) void gemm_tile_planes(const uint8_t *rec, int64_t G,
                                                                   const QuantActs *a, int64_t K, int64_t m0,
                                                                   int MB, float *acc_out) {
    const __m256i ones = _mm256_set1_epi16(1), word = _mm256_set1_epi32(0xffff), rows_together = ROWS_TOGETHER;
    __m256 acc[MBLOCK][2];
    for (int i = 0; i < MB; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    for (int64_t g = 0; g < G; g++, rec += Q4_RECORD) {
        prefetch_ahead(rec, Q4_RECORD, MB);
        __m256i hi[MBLOCK][2], lo[MBLOCK][2];
        for (int i = 0; i < MB; i++) hi[i][0] = hi[i][1] = lo[i][0] = lo[i][1] = _mm256_setzero_si256();
        for (int p = 0; p < 4; p++) {
            __m256i c[2][2];
            q4_nibbles(rec, p, c);
            for (int i = 0; i < MB; i++) {
                const int8_t *xa = a->x16 + ((m0 + i - a->x16_row) * G + g) * 8 * GROUP, *xl = xa + 4 * GROUP;
                const __m256i h0 = quad(xa, p), h1 = quad(xa, p + 4), l0 = quad(xl, p), l1 = quad(xl, p + 4);
                for (int h = 0; h < 2; h++) {
                    hi[i][h] = _mm256_add_epi16(hi[i][h], _mm256_add_epi16(_mm256_maddubs_epi16(c[h][0], h0),
                                                                           _mm256_maddubs_epi16(c[h][1], h1)));
                    lo[i][h] = _mm256_add_epi16(lo[i][h], _mm256_add_epi16(_mm256_maddubs_epi16(l0, c[h][0]),
                                                                           _mm256_maddubs_epi16(l1, c[h][1])));
                }
            }
        }
        for (int h = 0; h < 2; h++)
            for (int i = 0; i < MB; i++) {
                const int64_t m = m0 + i;
                const __m256i hs = _mm256_madd_epi16(_mm256_shuffle_epi8(hi[i][h], rows_together), ones);
                const __m256i ls = _mm256_shuffle_epi8(lo[i][h], rows_together);
                const __m256i lw = _mm256_add_epi32(_mm256_and_si256(ls, word), _mm256_srli_epi32(ls, 16));
                const __m256i dot = _mm256_add_epi32(_mm256_slli_epi32(hs, 8), lw);
                acc[i][h] = q4_group_add(acc[i][h], rec, h, dot, a->dx[m * G + g], a->sx[m * G + g]);
            }
    }
    store_halves(acc, MB, acc_out);
}

#endif

#else /* plain C */

static inline void gemm_tile_a8(const uint8_t *rec, int64_t G, const QuantActs *a, int64_t K, int64_t m0, int MB,
                                float *acc_out) {
    for (int i = 0; i < MB * TILE; i++) acc_out[i] = 0.0f;
    for (int64_t g = 0; g < G; g++, rec += Q4_RECORD) {
        const uint16_t *dh = (const uint16_t *)(rec + 256), *mh = (const uint16_t *)(rec + 288);
        for (int i = 0; i < MB; i++) {
            const int64_t m = m0 + i;
            const int8_t *xa = a->x8 + m * 4 * K + g * 4 * GROUP;
            for (int r = 0; r < TILE; r++) {
                int32_t dot = 0;
                for (int k = 0; k < GROUP; k++) dot += code_at(rec, 4, r, k) * xa[a8_offset(k)];
                float *acc = acc_out + i * TILE + r;
                *acc = fmaf(f16_to_f32(dh[r]) * a->dx[m * G + g], (float)dot, *acc);
                *acc = fmaf(f16_to_f32(mh[r]), a->sx[m * G + g], *acc);
            }
        }
    }
}

#endif

#endif
