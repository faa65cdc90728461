/* The tile bodies of quant_gemv.c, one per instruction set, included by it once (they are static inline: each
 * call site there compiles its own unrolled copy). gemm_tile: 16-bit activations, AVX-512 VNNI, AVX2 or plain
 * C (the byte tiles are in quant_byte_tiles.h). The layouts and the arithmetic are described at the top of
 * quant_gemv.c, which defines everything used here before including it. */
#ifndef SERVESCOPE_QUANT_TILES_H
#define SERVESCOPE_QUANT_TILES_H

/* Pieces the AVX2 tiles share. */
#if defined(QG_A8_AVX2)

/* Per 128-bit lane: 16-bit lane i (row i, codes 4b, 4b + 1) next to lane 4 + i (row i, codes 4b + 2, 4b + 3). */
#define ROWS_TOGETHER _mm256_setr_epi8(0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15, \
                                       0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15)

/* Block p's codes as bytes: c[h][0] codes 4p .. 4p + 3 of half h's rows (the low nibbles), c[h][1] codes
 * 16 + 4p .. 16 + 4p + 3 (the high ones). */
static inline __attribute__((always_inline)) void q4_nibbles(const uint8_t *rec, int p, __m256i c[2][2]) {
    const __m256i low = _mm256_set1_epi8(0x0f);
    for (int h = 0; h < 2; h++) {
        const __m256i packed = _mm256_loadu_si256((const __m256i *)(rec + 64 * p + 32 * h));
        c[h][0] = _mm256_and_si256(packed, low);
        c[h][1] = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low);
    }
}

/* Activation quad b's 16 bytes of an 8-bit-layout group, for both 128-bit lanes. */
static inline __attribute__((always_inline)) __m256i quad(const int8_t *group, int b) {
    return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(group + 16 * b)));
}

/* One group's Q4_1 sum of one row of half h into its accumulator: acc + d * dx * dot + mn * sx. */
static inline __attribute__((always_inline)) __m256 q4_group_add(__m256 acc, const uint8_t *rec, int h,
                                                                __m256i dot, float dx, float sx) {
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(rec + 256 + 16 * h)));
    const __m256 mn = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(rec + 288 + 16 * h)));
    acc = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(dx)), _mm256_cvtepi32_ps(dot), acc);
    return _mm256_fmadd_ps(mn, _mm256_set1_ps(sx), acc);
}

static inline __attribute__((always_inline)) void store_halves(__m256 acc[MBLOCK][2], int MB, float *acc_out) {
    for (int i = 0; i < MB; i++) {
        _mm256_storeu_ps(acc_out + i * TILE, acc[i][0]);
        _mm256_storeu_ps(acc_out + i * TILE + 8, acc[i][1]);
    }
}

#endif

#if defined(QG_AVX512_VNNI)

/* The four bytes at p (a pair of 16-bit codes, or four 8-bit ones) in every 32-bit lane. */
static inline __attribute__((always_inline)) __m512i bcast4(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* u[j] lane r: row r's codes 2j, 2j + 1 as 16-bit words (j < 16). */
static inline __attribute__((always_inline)) void q4_widen(const uint8_t *rec, __m512i u[16]) {
    const __m512i low = _mm512_set1_epi8(0x0f), zero = _mm512_setzero_si512();
    for (int p = 0; p < 4; p++) {
        const __m512i packed = _mm512_loadu_si512(rec + 64 * p);
        const __m512i lo = _mm512_and_si512(packed, low), hi = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low);
        u[2 * p] = _mm512_unpacklo_epi8(lo, zero);
        u[2 * p + 1] = _mm512_unpackhi_epi8(lo, zero);
        u[2 * p + 8] = _mm512_unpacklo_epi8(hi, zero);
        u[2 * p + 9] = _mm512_unpackhi_epi8(hi, zero);
    }
}

static inline __attribute__((always_inline)) void q8_widen(const uint8_t *rec, __m512i u[16]) {
    for (int q = 0; q < 8; q++) {
        const __m512i codes = _mm512_loadu_si512(rec + 64 * q);
        const __m512i sign = _mm512_movm_epi8(_mm512_movepi8_mask(codes));
        u[2 * q] = _mm512_unpacklo_epi8(codes, sign);
        u[2 * q + 1] = _mm512_unpackhi_epi8(codes, sign);
    }
}

/* sum over the group of code * xq, per row (lane); two chains so one activation row is not latency-bound. */
static inline __attribute__((always_inline)) __m512i dot16(const __m512i u[16], const int16_t *xq) {
    __m512i a = _mm512_setzero_si512(), b = _mm512_setzero_si512();
    for (int j = 0; j < 16; j += 2) {
        a = _mm512_dpwssd_epi32(a, u[j], bcast4(xq + 2 * j));
        b = _mm512_dpwssd_epi32(b, u[j + 1], bcast4(xq + 2 * j + 2));
    }
    return _mm512_add_epi32(a, b);
}

/* One tile, activation rows m0 .. m0 + MB - 1 (MB a constant at every call site), into acc_out [MB][16]. */
static inline __attribute__((always_inline)) void gemm_tile(const uint8_t *rec, int bits, int64_t G,
                                                            const QuantActs *a, int64_t K, int64_t m0, int MB,
                                                            float *acc_out) {
    __m512 acc[MBLOCK];
    for (int i = 0; i < MB; i++) acc[i] = _mm512_setzero_ps();
    const size_t record = bits == 4 ? Q4_RECORD : Q8_RECORD;
    for (int64_t g = 0; g < G; g++, rec += record) {
        __m512i u[16];
        __m512 d, mn = _mm512_setzero_ps();
        prefetch_ahead(rec, (int)record, MB);
        if (bits == 4) {
            q4_widen(rec, u);
            d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rec + 256)));
            mn = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rec + 288)));
        } else {
            q8_widen(rec, u);
            d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rec + 512)));
        }
        for (int i = 0; i < MB; i++) {
            const int64_t m = m0 + i;
            const __m512i dot = dot16(u, a->xq + m * K + g * GROUP);
            const __m512 scale = _mm512_mul_ps(d, _mm512_set1_ps(a->dx[m * G + g]));
            acc[i] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(dot), acc[i]);
            if (bits == 4) acc[i] = _mm512_fmadd_ps(mn, _mm512_set1_ps(a->sx[m * G + g]), acc[i]);
        }
    }
    for (int i = 0; i < MB; i++) _mm512_storeu_ps(acc_out + i * TILE, acc[i]);
}

#elif defined(QG_AVX2)

static inline __m256i bcast_pair(const int16_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* The tile's 16 rows are two halves of 8 (each block's first and second 32 bytes); both halves are multiplied
 * together, block by block. NOTE: so each activation pair is broadcast once for the 16 rows, not once per half,
 * and each block's widened codes are used as soon as they exist: widening a half's whole group first (16
 * vectors) and then multiplying left more live vectors than AVX2's 16 registers, and the spills cost more than
 * the arithmetic. SmolLM2's layers in a one-row decode step 2.86 -> 2.52 ms, four rows 7.71 -> 5.57, eight
 * 16.5 -> 12.4 (fused step on fixed inputs, interleaved builds, 2-core AVX2 EPYC, 2026-12-07); the Q8_0 head
 * at one row 0.76 -> 0.69 ms, four 1.79 -> 1.18. The integer sums are exact, so the order does not change a
 * bit of the output. */

/* dot[i][h] += the products of activation row i's pairs with block p's codes, per row of half h (Q4: the
 * low and high nibbles of the block's 32 bytes per half are codes 4p .. 4p + 3 and 16 + 4p .. 16 + 4p + 3). */
static inline __attribute__((always_inline)) void q4_block_dots(const uint8_t *rec, int p, const int16_t *xq,
                                                                int64_t K, int MB, __m256i dot[MBLOCK][2]) {
    const __m256i zero = _mm256_setzero_si256();
    __m256i c[2][2], u[2][4];
    q4_nibbles(rec, p, c);
    for (int h = 0; h < 2; h++) {
        u[h][0] = _mm256_unpacklo_epi8(c[h][0], zero);
        u[h][1] = _mm256_unpackhi_epi8(c[h][0], zero);
        u[h][2] = _mm256_unpacklo_epi8(c[h][1], zero);
        u[h][3] = _mm256_unpackhi_epi8(c[h][1], zero);
    }
    for (int i = 0; i < MB; i++) {
        const int16_t *x = xq + i * K;
        const __m256i b0 = bcast_pair(x + 4 * p), b1 = bcast_pair(x + 4 * p + 2);
        const __m256i b2 = bcast_pair(x + 4 * p + 16), b3 = bcast_pair(x + 4 * p + 18);
        for (int h = 0; h < 2; h++) {
            const __m256i s0 = _mm256_add_epi32(_mm256_madd_epi16(u[h][0], b0), _mm256_madd_epi16(u[h][1], b1));
            const __m256i s1 = _mm256_add_epi32(_mm256_madd_epi16(u[h][2], b2), _mm256_madd_epi16(u[h][3], b3));
            dot[i][h] = _mm256_add_epi32(dot[i][h], _mm256_add_epi32(s0, s1));
        }
    }
}

/* The same for Q8 block q: signed codes 4q .. 4q + 3. */
static inline __attribute__((always_inline)) void q8_block_dots(const uint8_t *rec, int q, const int16_t *xq,
                                                                int64_t K, int MB, __m256i dot[MBLOCK][2]) {
    const __m256i zero = _mm256_setzero_si256();
    __m256i u[2][2];
    for (int h = 0; h < 2; h++) {
        const __m256i codes = _mm256_loadu_si256((const __m256i *)(rec + 64 * q + 32 * h));
        const __m256i sign = _mm256_cmpgt_epi8(zero, codes);
        u[h][0] = _mm256_unpacklo_epi8(codes, sign);
        u[h][1] = _mm256_unpackhi_epi8(codes, sign);
    }
    for (int i = 0; i < MB; i++) {
        const int16_t *x = xq + i * K;
        const __m256i b0 = bcast_pair(x + 4 * q), b1 = bcast_pair(x + 4 * q + 2);
        for (int h = 0; h < 2; h++)
            dot[i][h] = _mm256_add_epi32(dot[i][h], _mm256_add_epi32(_mm256_madd_epi16(u[h][0], b0),
                                                                     _mm256_madd_epi16(u[h][1], b1)));
    }
}

static inline __attribute__((always_inline)) void gemm_tile(const uint8_t *rec, int bits, int64_t G,
                                                            const QuantActs *a, int64_t K, int64_t m0, int MB,
                                                            float *acc_out) {
    __m256 acc[MBLOCK][2];
    for (int i = 0; i < MB; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    const size_t record = bits == 4 ? Q4_RECORD : Q8_RECORD;
    for (int64_t g = 0; g < G; g++, rec += record) {
        prefetch_ahead(rec, (int)record, MB);
        const int16_t *xq = a->xq + m0 * K + g * GROUP;
        __m256i dot[MBLOCK][2];
        for (int i = 0; i < MB; i++) dot[i][0] = dot[i][1] = _mm256_setzero_si256();
        if (bits == 4)
            for (int p = 0; p < 4; p++) q4_block_dots(rec, p, xq, K, MB, dot);
        else
            for (int q = 0; q < 8; q++) q8_block_dots(rec, q, xq, K, MB, dot);
        for (int h = 0; h < 2; h++) {
            const uint8_t *scales = rec + (bits == 4 ? 256 : 512) + 16 * h;
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)scales));
            const __m256 mn = bits == 4 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(rec + 288 + 16 * h)))
                                        : _mm256_setzero_ps();
            for (int i = 0; i < MB; i++) {
                const int64_t m = m0 + i;
                const __m256 scale = _mm256_mul_ps(d, _mm256_set1_ps(a->dx[m * G + g]));
                acc[i][h] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(dot[i][h]), acc[i][h]);
                if (bits == 4) acc[i][h] = _mm256_fmadd_ps(mn, _mm256_set1_ps(a->sx[m * G + g]), acc[i][h]);
            }
        }
    }
    store_halves(acc, MB, acc_out);
}

#else /* plain C */

static inline void gemm_tile(const uint8_t *rec, int bits, int64_t G, const QuantActs *a, int64_t K, int64_t m0,
                             int MB, float *acc_out) {
    for (int i = 0; i < MB * TILE; i++) acc_out[i] = 0.0f;
    const size_t record = bits == 4 ? Q4_RECORD : Q8_RECORD;
    for (int64_t g = 0; g < G; g++, rec += record) {
        const uint16_t *dh = (const uint16_t *)(rec + (bits == 4 ? 256 : 512)), *mh = (const uint16_t *)(rec + 288);
        for (int i = 0; i < MB; i++) {
            const int64_t m = m0 + i;
            const int16_t *xq = a->xq + m * K + g * GROUP;
            for (int r = 0; r < TILE; r++) {
                int32_t dot = 0;
                for (int k = 0; k < GROUP; k++) dot += code_at(rec, bits, r, k) * xq[k];
                float *acc = acc_out + i * TILE + r;
                *acc = fmaf(f16_to_f32(dh[r]) * a->dx[m * G + g], (float)dot, *acc);
                if (bits == 4) *acc = fmaf(f16_to_f32(mh[r]), a->sx[m * G + g], *acc);
            }
        }
    }
}

#endif

#endif
