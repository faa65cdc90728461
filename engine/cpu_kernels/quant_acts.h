/* The activations' quantization of quant_gemv.c, included by it once: one row of float32 (or bfloat16, via
 * float32) into 16-bit codes (and, in the AVX2 and AVX-512 VNNI builds, their byte planes) or 8-bit codes in
 * the 8-bit tile's layout, with each group's step dx and sum sx. The layouts are described at the top of
 * quant_gemv.c, which defines everything used here before including it. The same float operations in every
 * build, so every build rounds the activations alike. */
#ifndef SERVESCOPE_QUANT_ACTS_H
#define SERVESCOPE_QUANT_ACTS_H

/* A group's step dx = max|x| / levels and its sum sx (Q4_1's minimum term); returns levels / max|x|, what maps
 * the group onto its codes (0 for a group of zeros). */
static inline float group_scale(const float *xg, float levels, float *dx, float *sx) {
    float m = 0.0f, s = 0.0f;
    for (int k = 0; k < GROUP; k++) {
        const float a = fabsf(xg[k]);
        m = a > m ? a : m;
        s += xg[k];
    }
    *dx = m * (1.0f / levels); /* NOTE: as written: the build's -freciprocal-math would make a division this
                                * multiplication anyway, the tests' reference does it */
    *sx = s;
    return m > 0.0f ? levels / m : 0.0f;
}

static void quantize_row16(const float *x, int64_t K, int16_t *xq, float *dx, float *sx) {
    for (int64_t g = 0; g < K / GROUP; g++) {
        const float *xg = x + g * GROUP;
        const float inv = group_scale(xg, 32767.0f, dx + g, sx + g);
        for (int k = 0; k < GROUP; k++) xq[g * GROUP + k] = (int16_t)nearbyintf(xg[k] * inv);
    }
}

#if defined(QG_BYTE_VNNI)
/* Offset of activation k of a group in its 128 bytes of 8-bit codes: in order, the first 32 bytes. */
static inline int a8_offset(int k) { return k; }
#else
/* Offset of activation k of a group in its 128 bytes of 8-bit codes (the first of its four copies). */
static inline int a8_offset(int k) { return 16 * (k / 4) + (k % 4 >= 2 ? 8 : 0) + (k % 2); }
#endif

/* 8-bit codes of one row in the 8-bit tile's layout, 128 bytes a group: in order (AVX-512 VNNI), or 4 copies of
 * each code in the weights' pair order (AVX2 and C). */
static void quantize_row8(const float *x, int64_t K, int8_t *x8, float *dx, float *sx) {
    for (int64_t g = 0; g < K / GROUP; g++) {
        const float *xg = x + g * GROUP;
        const float inv = group_scale(xg, 127.0f, dx + g, sx + g);
        int8_t codes[GROUP];
        for (int k = 0; k < GROUP; k++) codes[k] = (int8_t)nearbyintf(xg[k] * inv);
        int8_t *out = x8 + g * 4 * GROUP;
#if defined(QG_BYTE_VNNI)
        memcpy(out, codes, GROUP);
#else
        for (int b = 0; b < GROUP / 4; b++)
            for (int r = 0; r < 4; r++) {
                out[16 * b + 2 * r] = codes[4 * b];
                out[16 * b + 2 * r + 1] = codes[4 * b + 1];
                out[16 * b + 8 + 2 * r] = codes[4 * b + 2];
                out[16 * b + 8 + 2 * r + 1] = codes[4 * b + 3];
            }
#endif
    }
}

#if defined(QG_BYTE_VNNI)
/* A row's 16-bit codes again as two byte planes, 256 bytes a group: hi = xq >> 8 (-128 .. 127) in order in the
 * first 32 bytes, then lo = xq & 255 (0 .. 255) in order from byte 128, so xq = 256 * hi + lo. */
static void quantize_planes(const int16_t *xq, int64_t K, int8_t *x16) {
    for (int64_t g = 0; g < K / GROUP; g++) {
        const __m512i codes = _mm512_loadu_si512(xq + g * GROUP);
        int8_t *hi = x16 + g * 8 * GROUP, *lo = hi + 4 * GROUP;
        _mm256_storeu_si256((__m256i *)hi, _mm512_cvtepi16_epi8(_mm512_srai_epi16(codes, 8)));
        _mm256_storeu_si256((__m256i *)lo, _mm512_cvtepi16_epi8(codes));
    }
}
#elif defined(QG_A16_PLANES)
/* A row's 16-bit codes again as two byte planes, 256 bytes a group: hi = xq >> 8 (-128 .. 127), then
 * lo = xq & 255 (0 .. 255), so xq = 256 * hi + lo; each plane in the 8-bit tile's layout (a8_offset). The
 * codes' own bytes are (lo, hi) pairs, so each plane of two quads is one byte shuffle of the quads' 16 bytes. */
static void quantize_planes(const int16_t *xq, int64_t K, int8_t *x16) {
    /* per 128-bit lane (one quad): hi of codes 0, 1 four times, then of codes 2, 3; lo likewise */
    const __m256i pick_hi = _mm256_setr_epi8(1, 3, 1, 3, 1, 3, 1, 3, 5, 7, 5, 7, 5, 7, 5, 7,
                                             9, 11, 9, 11, 9, 11, 9, 11, 13, 15, 13, 15, 13, 15, 13, 15);
    const __m256i pick_lo = _mm256_setr_epi8(0, 2, 0, 2, 0, 2, 0, 2, 4, 6, 4, 6, 4, 6, 4, 6,
                                             8, 10, 8, 10, 8, 10, 8, 10, 12, 14, 12, 14, 12, 14, 12, 14);
    for (int64_t g = 0; g < K / GROUP; g++) {
        int8_t *hi = x16 + g * 8 * GROUP, *lo = hi + 4 * GROUP;
        for (int b = 0; b < GROUP / 4; b += 2) {
            const __m128i two = _mm_loadu_si128((const __m128i *)(xq + g * GROUP + 4 * b));
            const __m256i quads = _mm256_broadcastsi128_si256(two);
            _mm256_storeu_si256((__m256i *)(hi + 16 * b), _mm256_shuffle_epi8(quads, pick_hi));
            _mm256_storeu_si256((__m256i *)(lo + 16 * b), _mm256_shuffle_epi8(quads, pick_lo));
        }
    }
}
#endif

/* Row m of x (float32 or bfloat16) into QuantActs, in act_bits (and the byte planes where the build's tile for
 * `bits` reads them); `row` is K floats of scratch. */
static void quantize_one(const void *x, int x_bf16, int64_t m, int64_t K, int bits, int act_bits,
                         const QuantActs *a, float *row) {
    const float *src;
    if (x_bf16) {
        const uint16_t *xb = (const uint16_t *)x + m * K;
        for (int64_t k = 0; k < K; k++) row[k] = bf16_to_f32(xb[k]);
        src = row;
    } else {
        src = (const float *)x + m * K;
    }
    const int64_t G = K / GROUP;
    if (act_bits == 8) quantize_row8(src, K, a->x8 + m * 4 * K, a->dx + m * G, a->sx + m * G);
    else quantize_row16(src, K, a->xq + m * K, a->dx + m * G, a->sx + m * G);
#if defined(QG_A16_PLANES)
    if (act_bits == 16 && bits == 4 && a->x16 && m >= a->x16_row)
        quantize_planes(a->xq + m * K, K, a->x16 + (m - a->x16_row) * 8 * K);
#endif
}

#endif
