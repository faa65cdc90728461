/* GEMV/GEMM of float activations with weights stored as 4-bit or 8-bit codes in groups of 32 inputs (the
 * GGUF's Q4_1 and Q8_0), for the CPU's quantized path. Built and loaded by engine/cpu_kernels/build.py.
 *
 * out[m, n] = sum_k x[m, k] * w[n, k], with per group g of 32 inputs:
 *   Q4:  w = d[n, g] * code + mn[n, g]     (code 0..15, Q4_1)
 *   Q8:  w = d[n, g] * code                (code -127..127, Q8_0)
 * The activations are quantized per row and group to int16 (xq = round(x * (32767 / max|x|)), step
 * dx = max|x| * (1 / 32767)), so the dot products run on integer instructions (AVX-512 VNNI vpdpwssd: two
 * 16-bit products per 32-bit lane; AVX2 pmaddwd; or plain C) and sum exactly in int32:
 *   Q4:  d * dx * sum(code * xq) + mn * sum(x)      (sum(x) unquantized: the min term adds no error)
 *   Q8:  d * dx * sum(code * xq)
 * NOTE: 16-bit by default, not llama.cpp's 8-bit activations: each activation moves by at most 1/65534 of its
 * group's largest, 258 times less than with int8, for the same weight bytes. With AVX-512 VNNI a decode step
 * is bound by reading the weights, so the extra instructions cost no time there; on AVX2 they do (below).
 *
 * Packed weight layout (engine/cpu_kernels/quant_pack.py writes it): output rows in tiles of 16 (rows padded
 * with zeros to a multiple of 16), one record per (tile, group), records ordered tile-major so one thread
 * streams its tiles' bytes in order. Codes sit so that widening a 64-byte block with unpacklo/unpackhi (which
 * work per 128-bit lane) leaves each 32-bit lane holding one output row's two 16-bit codes k, k + 1: for row
 * r = 4L + i, byte 16L + 2i + e holds code pair 0 of the block, byte 16L + 8 + 2i + e pair 1 (e = 0, 1).
 *   Q4 record (320 bytes = 16 rows x 20, Q4_1's own size): 4 blocks p of 64 bytes whose bytes are Q4_1's own
 *     (low nibble code c, high nibble code c + 16), c = 4p + e in pair 0 and c = 4p + 2 + e in pair 1;
 *     then d[16] float16, mn[16] float16.
 *   Q8 record (544 bytes = 16 rows x 34, Q8_0's own size): 8 blocks q of 64 signed codes, k = 4q + e in pair 0,
 *     k = 4q + 2 + e in pair 1; then d[16] float16.
 * The AVX2 and C builds read the same layout (AVX2 as two halves of 8 rows).
 *
 * 8-bit activations (act_bits 8, Q4 weights only): xq = round(x * (127 / max|x|)), dx = max|x| * (1 / 127), as
 * llama.cpp's Q8_1; each activation moves by up to 1/254 of its group's largest. The dot products take one
 * vpmaddubsw per 32 codes (unsigned 4-bit code times signed 8-bit activation, pairs summed in int16: at most
 * 8 x 2 x 15 x 127 = 30480 over a group, no saturation) where the 16-bit path takes two vpmaddwd after widening
 * the codes to 16 bits: about half the instructions per weight byte, which is what a one-row GEMV on AVX2 is
 * bound by (studies/quant_gemm.py: 1.4-1.8x the 16-bit GEMV's rate from cache, 2-core AVX2 EPYC, 2026-12-07).
 * A row's activations are stored 128 bytes a group: per quad b (activations 4b .. 4b + 3) 16 bytes in the
 * weights' pair order, (x[4b], x[4b + 1]) four times, then (x[4b + 2], x[4b + 3]) four times, so that one
 * 16-byte broadcast meets the four rows of a 128-bit lane of nibbles as they lie.
 * The AVX-512 VNNI build takes vpdpbusd instead (four byte products summed into each 32-bit lane: one per 64
 * bytes of codes after a byte shuffle puts each row's four codes in one lane) and stores the 8-bit codes in
 * order, 32 bytes at the start of each group's 128.
 *
 * 16-bit activations of one row (gemm_tile_planes, AVX2 and AVX-512 VNNI): each code xq is also stored as two
 * byte planes, hi = xq >> 8 and lo = xq & 255 (xq = 256 * hi + lo), each in the build's 8-bit layout, and the
 * tile runs the 8-bit tile's instructions on both: on AVX2 16 per row and 64 bytes of weights where widening
 * the codes to 16 bits took 30 (the integer sums, and so the outputs, are the same).
 *
 * NOTE: the activations' quantization is the same in every build (the same float operations rounded the same
 * way) and the integer sums are exact, so every build gives the same outputs.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
static inline int omp_team_size(void) { return omp_get_num_threads(); }
#else
static inline int omp_team_size(void) { return 1; }
#endif

#include "kernels.h"

#if defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define QG_AVX512_VNNI 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define QG_AVX2 1
#endif
#if defined(QG_AVX512_VNNI)
#define QG_BYTE_VNNI 1 /* the Q4 byte tiles (8-bit activations, 16-bit as byte planes) in AVX-512 vpdpbusd */
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define QG_A8_AVX2 1 /* the 8-bit-activation tile in AVX2 */
#endif
#if defined(QG_AVX2) || defined(QG_BYTE_VNNI)
#define QG_A16_PLANES 1 /* 16-bit activations also as byte planes, for the Q4 tile of few rows */
#endif

#define TILE 16
#define GROUP 32
#define Q4_RECORD 320
#define Q8_RECORD 544

/* Bytes ahead of the record being multiplied that the tiles ask the cache for. NOTE: the hardware prefetcher
 * alone left a one-row step of SmolLM2 (120 GEMVs of 0.2 to 1.1 MB, each a fresh stream it must learn) at
 * 2.84 ms; asking 1, 2 or 4 KB ahead gave 2.46, 2.44 and 2.52 (2-core AVX2 EPYC, 8-bit activations,
 * 2026-12-07). A thread's tiles are consecutive records, so ahead is where it reads next; past a weight's
 * end the hint only costs a line. */
#ifndef PREFETCH_BYTES
#define PREFETCH_BYTES 2048
#endif

/* Activation rows from which a tile asks for its records ahead (below it leaves them to the hardware prefetcher).
 * NOTE: on AVX-512 (Zen 4) a one-row tile is faster without the hints, a tile of several rows slower. A fused
 * step without them: one row 0.85-0.89x on one thread, 0.91-1.00x on two (weights on huge pages; 0.88x and 0.96x
 * on 4 KiB pages), eight rows 1.12-1.25x; with them from two rows on, two and eight rows 0.99-1.02x (a16, a8,
 * bf16; interleaved builds, 2026-12-08). There the hardware prefetcher keeps up with a one-row stream and the
 * hints only take load slots; eight rows read slowly enough that it falls behind. On the AVX2 EPYC the hints
 * paid at one row (above). Intel's AVX-512 not measured. */
#ifndef PREFETCH_MIN_ROWS
#if defined(QG_AVX512_VNNI)
#define PREFETCH_MIN_ROWS 2
#else
#define PREFETCH_MIN_ROWS 1
#endif
#endif

/* `rows`: the tile's activation rows (a constant at every call site, so the test compiles away). */
static inline __attribute__((always_inline)) void prefetch_ahead(const uint8_t *rec, int bytes, int rows) {
    if (rows < PREFETCH_MIN_ROWS) return;
    for (int line = 0; line < bytes; line += 64) __builtin_prefetch(rec + PREFETCH_BYTES + line, 0, 3);
}
/* Activation rows sharing one widened tile group: its 16 registers plus one accumulator per row stay in
 * registers (AVX-512 has 32; AVX2's 16 spill anyway, so it keeps blocks small). */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define MBLOCK 8
#else
#define MBLOCK 4
#endif
/* Activation rows up to which the Q4 tile reads the byte planes (gemm_tile_planes). NOTE: one: on AVX2 with two
 * rows its sums no longer fit the 16 registers, and a fused step of two or four rows took 1.05x and 1.19x the
 * widening tile's time (2-core AVX2 EPYC, 2026-12-07); on AVX-512 VNNI a fused step of one row took 0.96-0.97x
 * the widening vpdpwssd tile's time, of four 1.00x, of eight 1.075x with the planes for every row block
 * (2-core AVX-512 EPYC, Zen 4, 2026-12-07). */
#ifndef PLANE_ROWS
#define PLANE_ROWS 1
#endif

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
#if defined(__F16C__)
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

#include "quant_acts.h"

/* Byte of row r's pair-ordered code k within a block of 64 (k < 4: pair 0 at e = k, pair 1 at e = k - 2). */
static inline int code_byte(int r, int k) {
    return 16 * (r / 4) + (k < 2 ? 0 : 8) + 2 * (r % 4) + (k % 2);
}

static inline int32_t code_at(const uint8_t *rec, int bits, int r, int k) {
    if (bits == 8) return (int8_t)rec[64 * (k / 4) + code_byte(r, k % 4)];
    const int c = k % 16;
    const uint8_t byte = rec[64 * (c / 4) + code_byte(r, c % 4)];
    return k < 16 ? (byte & 0x0f) : (byte >> 4);
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

#include "quant_tiles.h"
#include "quant_byte_tiles.h"

#define TILE_CASE(BITS, ROWS) \
    case ROWS: gemm_tile(rec, BITS, G, acts, K, m0, ROWS, acc); break;
#define TILE_CASE_A8(ROWS) \
    case ROWS: gemm_tile_a8(rec, G, acts, K, m0, ROWS, acc); break;
#if defined(QG_A16_PLANES)
#define TILE_CASE_Q4(ROWS) \
    case ROWS: if (ROWS <= PLANE_ROWS) gemm_tile_planes(rec, G, acts, K, m0, ROWS, acc); \
               else gemm_tile(rec, 4, G, acts, K, m0, ROWS, acc); break;
#else
#define TILE_CASE_Q4(ROWS) TILE_CASE(4, ROWS)
#endif
#if MBLOCK == 8
#define TILE_CASES(BITS) TILE_CASE(BITS, 8) TILE_CASE(BITS, 7) TILE_CASE(BITS, 6) TILE_CASE(BITS, 5) \
    TILE_CASE(BITS, 4) TILE_CASE(BITS, 3) TILE_CASE(BITS, 2) TILE_CASE(BITS, 1)
#define TILE_CASES_Q4 TILE_CASE_Q4(8) TILE_CASE_Q4(7) TILE_CASE_Q4(6) TILE_CASE_Q4(5) \
    TILE_CASE_Q4(4) TILE_CASE_Q4(3) TILE_CASE_Q4(2) TILE_CASE_Q4(1)
#define TILE_CASES_A8 TILE_CASE_A8(8) TILE_CASE_A8(7) TILE_CASE_A8(6) TILE_CASE_A8(5) \
    TILE_CASE_A8(4) TILE_CASE_A8(3) TILE_CASE_A8(2) TILE_CASE_A8(1)
#else
#define TILE_CASES(BITS) TILE_CASE(BITS, 4) TILE_CASE(BITS, 3) TILE_CASE(BITS, 2) TILE_CASE(BITS, 1)
#define TILE_CASES_Q4 TILE_CASE_Q4(4) TILE_CASE_Q4(3) TILE_CASE_Q4(2) TILE_CASE_Q4(1)
#define TILE_CASES_A8 TILE_CASE_A8(4) TILE_CASE_A8(3) TILE_CASE_A8(2) TILE_CASE_A8(1)
#endif

/* `rows` (1 .. MBLOCK) activation rows from m0 through one tile. NOTE: each case passes constants, so it
 * compiles to its own unrolled tile with its accumulators in registers. */
static void tile_rows(const uint8_t *rec, int bits, int act_bits, int64_t G, const QuantActs *acts, int64_t K,
                      int64_t m0, int rows, float *acc) {
    if (act_bits == 8) {
        switch (rows) { TILE_CASES_A8 default: break; }
    } else if (bits == 4) {
        switch (rows) { TILE_CASES_Q4 default: break; }
    } else {
        switch (rows) { TILE_CASES(8) default: break; }
    }
}

/* Inside a running team: whether each thread quantizes M rows into its own copy (see PRIVATE_ROWS). */
int quant_rows_private(int64_t M) { return M <= PRIVATE_ROWS && omp_team_size() > 1; }

/* How many copies of the quantized activations a team keeps: one per thread for a few rows, else one. */
static size_t acts_copies(int64_t M, int threads) { return M <= PRIVATE_ROWS ? (size_t)threads : 1; }

/* Rows of M that the byte-plane tile multiplies: the last row block's, when it has at most PLANE_ROWS rows. */
static int64_t plane_rows(int64_t M) {
#if defined(QG_A16_PLANES) && PLANE_ROWS >= MBLOCK
    return M;
#elif defined(QG_A16_PLANES)
    return M % MBLOCK <= PLANE_ROWS ? M % MBLOCK : 0;
#else
    (void)M;
    return 0;
#endif
}

/* Bytes of one copy of M rows' quantized activations: the codes (4 bytes per activation: the 8-bit layout's
 * four copies, twice the 16-bit codes), the byte planes of the rows that need them (8 bytes per activation),
 * then dx and sx. */
static size_t acts_stride(int64_t M, int64_t K) {
    return align64(4 * (size_t)(M * K)) + align64(8 * (size_t)(plane_rows(M) * K)) +
           align64(2 * sizeof(float) * (size_t)(M * (K / GROUP)));
}

static QuantActs acts_at(char *base, int64_t M, int64_t K) {
    QuantActs a;
    const size_t codes = align64(4 * (size_t)(M * K)), planes = align64(8 * (size_t)(plane_rows(M) * K));
    a.xq = (int16_t *)base;
    a.x8 = (int8_t *)base;
    a.x16 = planes ? (int8_t *)(base + codes) : NULL;
    a.x16_row = M - plane_rows(M);
    a.dx = (float *)(base + codes + planes);
    a.sx = a.dx + M * (K / GROUP);
    return a;
}

/* Inside a running thread team (orphaned omp for): quantize x's rows into `acts` in act_bits (8 only for
 * bits 4), or, for a few rows, each thread into its own copy after it; then every tile. `rows` is K floats
 * of scratch per thread of the team. Ends on the team's barrier: `out` is complete on return. */
void quant_gemm_team(const void *x, int x_bf16, int64_t M, int64_t K, const uint8_t *packed, int bits, int act_bits,
                     int64_t N, void *out, int out_bf16, const QuantActs *acts, float *rows) {
    const int64_t G = K / GROUP, num_tiles = (N + TILE - 1) / TILE;
    const size_t record = bits == 4 ? Q4_RECORD : Q8_RECORD;
#ifdef _OPENMP
    const int thread = omp_get_thread_num();
#else
    const int thread = 0;
#endif
    float *row = rows + (int64_t)thread * K;
    const int num_threads = omp_team_size();
    QuantActs own;
    const QuantActs *use = acts;
    if (quant_rows_private(M)) {
        own = acts_at((char *)acts->xq + (size_t)thread * acts_stride(M, K), M, K);
        for (int64_t m = 0; m < M; m++) quantize_one(x, x_bf16, m, K, bits, act_bits, &own, row);
        use = &own;
    } else {
        #pragma omp for schedule(static)
        for (int64_t m = 0; m < M; m++) quantize_one(x, x_bf16, m, K, bits, act_bits, acts, row);
    }
    /* NOTE: guided: each thread first takes a long run of consecutive tiles (half of them, then half of the
     * rest), so it reads one contiguous stream the hardware prefetcher follows; then ever smaller runs, so a
     * thread the OS preempts (on a 2-core machine the HTTP server and anything else compete with the team)
     * leaves what is left to the others. Dynamic chunks of one or a few tiles interleaved the threads' reads:
     * two threads read the 120 small weights of a SmolLM2 decode step no faster than one (19.7 against
     * 19.8 GB/s; guided 36.8 GB/s; a whole one-row step 3.6-3.9 ms against 2.2-2.3 ms, 2026-12-06). */
    const int64_t chunk = num_tiles / (num_threads * 16) > 1 ? num_tiles / (num_threads * 16) : 1;
    #pragma omp for schedule(guided, chunk)
    for (int64_t t = 0; t < num_tiles; t++) {
        const uint8_t *rec = packed + (size_t)(t * G) * record;
        float acc[MBLOCK * TILE] __attribute__((aligned(64)));
        for (int64_t m0 = 0; m0 < M; m0 += MBLOCK) {
            const int64_t left = M - m0;
            tile_rows(rec, bits, act_bits, G, use, K, m0, left >= MBLOCK ? MBLOCK : (int)left, acc);
            store_rows(acc, left >= MBLOCK ? MBLOCK : (int)left, m0, t * TILE, N, out, out_bf16);
        }
    }
}

/* Bytes of scratch quant_gemm_team needs for M rows of K inputs on `threads` threads: the quantized
 * activations (one copy per thread for a few rows), then K floats per thread. */
size_t quant_scratch_bytes(int64_t M, int64_t K, int threads) {
    const size_t copies = acts_copies(M, threads);
    return copies * acts_stride(M, K) + sizeof(float) * (size_t)(threads * K);
}

/* Carve `scratch` (quant_scratch_bytes of it for `threads`, 64-byte aligned) into the activations and the
 * per-thread rows. */
void quant_scratch_split(void *scratch, int64_t M, int64_t K, int threads, QuantActs *a, float **rows) {
    const size_t copies = acts_copies(M, threads);
    *a = acts_at(scratch, M, K);
    *rows = (float *)((char *)scratch + copies * acts_stride(M, K));
}

/* The activations' scratch of quant_gemm, per calling thread, grown on demand and kept (a step calls it often). */
static __thread void *scratch;
static __thread size_t scratch_bytes;

/* Whether a call's weight and activation bits are ones the kernel multiplies. */
static int bits_ok(int bits, int act_bits) {
    return (bits == 4 && act_bits == 8) || ((bits == 4 || bits == 8) && act_bits == 16);
}

/* x [M, K] (float32, or bfloat16 when x_bf16) times the packed [N, K] weight (bits 4 or 8) into out [M, N]
 * (float32, or bfloat16 when out_bf16), the activations quantized to act_bits (16, or 8 for bits 4). Threads
 * quantize rows, then take whole tiles. Returns 0, or -1 when the scratch cannot be allocated, -2 for a bad
 * argument. */
int quant_gemm(const void *x, int x_bf16, int64_t M, int64_t K, const uint8_t *packed, int bits, int act_bits,
               int64_t N, void *out, int out_bf16, int num_threads) {
    if (K % GROUP || !bits_ok(bits, act_bits) || M < 0 || N < 0) return -2;
    if (M == 0 || N == 0) return 0;
    if (num_threads < 1) num_threads = 1;
    const size_t need = quant_scratch_bytes(M, K, num_threads);
    if (need > scratch_bytes) {
        free(scratch);
        scratch = aligned_alloc(64, align64(need));
        scratch_bytes = scratch ? need : 0;
        if (!scratch) return -1;
    }
    QuantActs acts;
    float *rows;
    quant_scratch_split(scratch, M, K, num_threads, &acts, &rows);
    #pragma omp parallel num_threads(num_threads)
    quant_gemm_team(x, x_bf16, M, K, packed, bits, act_bits, N, out, out_bf16, &acts, rows);
    return 0;
}

/* The activation quantization alone, for tests: codes [M, K] int16 (8-bit codes widened, in order), dx and sx
 * [M, K / 32] float32. Returns 0, -1 out of memory, -2 for a bad argument. */
int quant_activations(const void *x, int x_bf16, int64_t M, int64_t K, int act_bits, int16_t *codes, float *dx,
                      float *sx) {
    if (K % GROUP || (act_bits != 8 && act_bits != 16)) return -2;
    float *row = malloc(sizeof(float) * (size_t)(K > 0 ? K : 1));
    int8_t *x8 = act_bits == 8 ? malloc(4 * (size_t)(K > 0 ? K : 1)) : NULL;
    if (!row || (act_bits == 8 && !x8)) {
        free(row);
        free(x8);
        return -1;
    }
    for (int64_t m = 0; m < M; m++) {
        /* one row at a time, as row 0 of a one-row QuantActs pointed at this row's outputs */
        const QuantActs a = {codes + m * K, x8, NULL, 0, dx + m * (K / GROUP), sx + m * (K / GROUP)};
        const void *xm = x_bf16 ? (const void *)((const uint16_t *)x + m * K)
                                : (const void *)((const float *)x + m * K);
        quantize_one(xm, x_bf16, 0, K, 4, act_bits, &a, row);
        if (act_bits == 8)
            for (int64_t k = 0; k < K; k++)
                codes[m * K + k] = x8[(k / GROUP) * 4 * GROUP + a8_offset((int)(k % GROUP))];
    }
    free(row);
    free(x8);
    return 0;
}
