/* A whole decode step of a Llama-family decoder whose projections are packed Q4_1 codes, in one call on one
 * thread team: every layer's norms, projections (quant_gemm_team), rotary embedding, KV store, attention
 * (paged_decode_team_*), SiLU and residual adds. Built and loaded by engine/cpu_kernels/build.py; driven
 * by engine/cpu_kernels/decode_step.py for steps whose every row is a decode row.
 *
 * Why one call: a decode step of a small model is ~300 small ops (30 layers of ~10), and per op the Python
 * dispatch and a fresh OpenMP fork cost as much as the op's arithmetic. Here each phase is an orphaned
 * omp for of one parallel region, separated by the team's barriers.
 *
 * Every intermediate is stored in the model's dtype where the per-op torch path (engine/model/llama.py)
 * stores it, and computed in float32 between, so both paths round alike (not bit for bit: expf, sqrtf and
 * the sums' order differ from torch's).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#ifdef _OPENMP
#include <omp.h>
#endif

#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* Everything a step reads besides its batch; built once per model (engine/cpu_kernels/decode_step.py). */
typedef struct {
    int64_t num_layers, hidden, num_heads, num_kv_heads, head_dim, intermediate, block_size;
    float eps, scale;
    int32_t is_bf16; /* activations, norm weights and KV cache in bfloat16; else float32 */
    int32_t act_bits; /* the projections' activations in 8 or 16 bits (quant_gemv.c) */
    const uint8_t *const *qkv, *const *o, *const *gate_up, *const *down; /* [num_layers] packed Q4 weights */
    const void *const *input_norm, *const *post_norm;                    /* [num_layers] [hidden] */
    const void *final_norm;                                              /* [hidden] */
    void *const *k_cache, *const *v_cache; /* [num_layers] [blocks, block_size, KVH, D] */
    const float *cos, *sin;                /* [positions, D / 2] float32 */
    const void *embed;                     /* [vocab, hidden]: the token embeddings */
    const uint8_t *head;                   /* the packed LM head [vocab, hidden]; NULL: the step stops at hidden */
    int64_t vocab;
    int32_t head_bits, head_act_bits;      /* the head's code and activation widths (quant_gemv.c) */
} DecodeModel;

ALWAYS_INLINE float ld(const void *p, int64_t i, int bf) {
    return bf ? bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

ALWAYS_INLINE void st(void *p, int64_t i, float v, int bf) {
    if (bf) ((uint16_t *)p)[i] = f32_to_bf16(v);
    else ((float *)p)[i] = v;
}

ALWAYS_INLINE float rnd(float v, int bf) { return bf ? bf16_to_f32(f32_to_bf16(v)) : v; }

/* NOTE: each phase below is written once with the dtype `bf` a parameter and inlined twice, with bf a
 * constant (the *_rows wrappers): with the dtype known at compile time the loops vectorize; with it tested
 * per element they ran scalar and took a quarter of a single-stream step's time outside the GEMVs. */
/* residual[m] += add[m] (when add), then normed[m] = weight * (residual[m] / rms(residual[m])). */
ALWAYS_INLINE void add_rms_norm_row(const DecodeModel *md, int64_t m, const void *add, void *residual, void *normed,
                                    const void *weight, const int bf) {
    const int64_t n = md->hidden;
    float sq = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        float r = ld(residual, m * n + i, bf);
        if (add) {
            r = rnd(r + ld(add, m * n + i, bf), bf);
            st(residual, m * n + i, r, bf);
        }
        sq += r * r;
    }
    const float inv = 1.0f / sqrtf(sq / (float)n + md->eps);
    for (int64_t i = 0; i < n; i++)
        st(normed, m * n + i, ld(weight, i, bf) * rnd(ld(residual, m * n + i, bf) * inv, bf), bf);
}

static void add_rms_norm_one(const DecodeModel *md, int64_t m, const void *add, void *residual, void *normed,
                             const void *weight) {
    if (md->is_bf16) add_rms_norm_row(md, m, add, residual, normed, weight, 1);
    else add_rms_norm_row(md, m, add, residual, normed, weight, 0);
}

/* Every row, split over the team (shared: `residual` and `normed` are the team's), or all on the calling thread
 * (its own copies; see decode_step). */
static void add_rms_norm_rows(const DecodeModel *md, int64_t M, const void *add, void *residual, void *normed,
                              const void *weight, int shared) {
    if (shared) {
        #pragma omp for schedule(static)
        for (int64_t m = 0; m < M; m++) add_rms_norm_one(md, m, add, residual, normed, weight);
    } else {
        for (int64_t m = 0; m < M; m++) add_rms_norm_one(md, m, add, residual, normed, weight);
    }
}

/* One head's rotate-half by a position's cos and sin: src[s0 ..] into dst[d0 ..]. */
ALWAYS_INLINE void rope_head(const void *src, int64_t s0, void *dst, int64_t d0, const float *cs, const float *sn,
                             int64_t half, const int bf) {
    for (int64_t i = 0; i < half; i++) {
        const float a = ld(src, s0 + i, bf), b = ld(src, s0 + half + i, bf);
        st(dst, d0 + i, a * cs[i] - b * sn[i], bf);
        st(dst, d0 + half + i, b * cs[i] + a * sn[i], bf);
    }
}

/* One row's K or V (kv_row values of `elem` bytes at src) into its slot of a layer's cache. */
ALWAYS_INLINE void to_slot(void *cache, int64_t slot, const void *src, int64_t kv_row, size_t elem) {
    memcpy((char *)cache + (size_t)(slot * kv_row) * elem, src, (size_t)kv_row * elem);
}

/* Rotate Q and K of each row by its position (rotate-half), Q into q [M, H, D], K and V into the cache slot. */
ALWAYS_INLINE void rope_and_store_impl(const DecodeModel *md, int64_t layer, int64_t M, const void *qkv, void *q,
                                       const int64_t *positions, const int64_t *slots, const int bf) {
    const int64_t H = md->num_heads, KVH = md->num_kv_heads, D = md->head_dim, half = D / 2;
    const int64_t width = (H + 2 * KVH) * D, kv_row = KVH * D;
    #pragma omp for schedule(static)
    for (int64_t m = 0; m < M; m++) {
        const float *cs = md->cos + positions[m] * half, *sn = md->sin + positions[m] * half;
        for (int64_t h = 0; h < H + KVH; h++) {
            void *dst = h < H ? q : md->k_cache[layer];
            const int64_t at = h < H ? (m * H + h) * D : slots[m] * kv_row + (h - H) * D;
            rope_head(qkv, m * width + h * D, dst, at, cs, sn, half, bf);
        }
        const size_t elem = bf ? 2 : 4;
        to_slot(md->v_cache[layer], slots[m], (const char *)qkv + (size_t)(m * width + (H + KVH) * D) * elem, kv_row,
                elem);
    }
}

/* A thread's own rows (see decode_step): every row's Q into q [M, H, D] and K into k [M, KVH, D], rotated; then,
 * without a barrier, the team's share of the rows' K (from k) and V (from qkv) into the cache, which no one reads
 * in this step (the attention reads the new token's K and V from k and qkv). */
ALWAYS_INLINE void rope_own_impl(const DecodeModel *md, int64_t layer, int64_t M, const void *qkv, void *q, void *k,
                                 const int64_t *positions, const int64_t *slots, const int bf) {
    const int64_t H = md->num_heads, KVH = md->num_kv_heads, D = md->head_dim, half = D / 2;
    const int64_t width = (H + 2 * KVH) * D, kv_row = KVH * D;
    const size_t elem = bf ? 2 : 4;
    for (int64_t m = 0; m < M; m++) {
        const float *cs = md->cos + positions[m] * half, *sn = md->sin + positions[m] * half;
        for (int64_t h = 0; h < H + KVH; h++)
            rope_head(qkv, m * width + h * D, h < H ? q : k, h < H ? (m * H + h) * D : (m * KVH + h - H) * D, cs, sn,
                      half, bf);
    }
    #pragma omp for schedule(static) nowait
    for (int64_t m = 0; m < M; m++) {
        to_slot(md->k_cache[layer], slots[m], (const char *)k + (size_t)(m * kv_row) * elem, kv_row, elem);
        to_slot(md->v_cache[layer], slots[m], (const char *)qkv + (size_t)(m * width + (H + KVH) * D) * elem, kv_row,
                elem);
    }
}

static void rope_own(const DecodeModel *md, int64_t layer, int64_t M, const void *qkv, void *q, void *k,
                     const int64_t *positions, const int64_t *slots) {
    if (md->is_bf16) rope_own_impl(md, layer, M, qkv, q, k, positions, slots, 1);
    else rope_own_impl(md, layer, M, qkv, q, k, positions, slots, 0);
}

static void rope_and_store(const DecodeModel *md, int64_t layer, int64_t M, const void *qkv, void *q,
                           const int64_t *positions, const int64_t *slots) {
    if (md->is_bf16) rope_and_store_impl(md, layer, M, qkv, q, positions, slots, 1);
    else rope_and_store_impl(md, layer, M, qkv, q, positions, slots, 0);
}

/* act[m, i] = silu(gate) * up of the fused [M, 2I] gate/up output (gate first), each rounded as torch does. */
static void silu_mul_row(const DecodeModel *md, int64_t m, const void *gate_up, void *act) {
    const int64_t I = md->intermediate;
    if (md->is_bf16) {
        const uint16_t *gate = (const uint16_t *)gate_up + m * 2 * I, *up = gate + I;
        uint16_t *out = (uint16_t *)act + m * I;
        for (int64_t i = 0; i < I; i++) {
            const float g = bf16_to_f32(gate[i]);
            out[i] = f32_to_bf16(rnd(g / (1.0f + exp_f32(-g)), 1) * bf16_to_f32(up[i]));
        }
    } else {
        const float *gate = (const float *)gate_up + m * 2 * I, *up = gate + I;
        float *out = (float *)act + m * I;
        for (int64_t i = 0; i < I; i++) out[i] = gate[i] / (1.0f + exp_f32(-gate[i])) * up[i];
    }
}

/* Every row, shared over the team or all on the calling thread, as add_rms_norm_rows. */
static void silu_mul_rows(const DecodeModel *md, int64_t M, const void *gate_up, void *act, int shared) {
    if (shared) {
        #pragma omp for schedule(static)
        for (int64_t m = 0; m < M; m++) silu_mul_row(md, m, gate_up, act);
    } else {
        for (int64_t m = 0; m < M; m++) silu_mul_row(md, m, gate_up, act);
    }
}

static __thread void *scratch;
static __thread size_t scratch_bytes;

static char *carve(char **p, size_t bytes) {
    char *at = *p;
    *p += align64(bytes);
    return at;
}

/* The LM head over the final norm's output, into float32 logits [M, vocab] rounded as the model's dtype
 * rounds them (the per-op path's head writes that dtype and the sampler widens it). */
static void head_logits(const DecodeModel *md, int64_t M, const void *hidden, float *logits, const QuantActs *acts,
                        float *rows) {
    quant_gemm_team(hidden, md->is_bf16, M, md->hidden, md->head, md->head_bits, md->head_act_bits, md->vocab,
                    logits, 0, acts, rows);
    if (md->is_bf16) {
        #pragma omp for schedule(static)
        for (int64_t i = 0; i < M * md->vocab; i++) logits[i] = rnd(logits[i], 1);
    }
}

/* One decode step for M sequences. input_ids [M] (each below vocab), positions, slots [M]; tables
 * [M, table_stride]; seq_lens [M] (context including this token). residual [M, hidden]: scratch, out the last
 * residual. hidden [M, hidden]: out, the final norm's output (the LM head's input). logits [M, vocab]: out, the
 * head's float32 logits, when both it and md->head are given. Returns 0, -1 when out of memory, -2 for a token
 * id outside the vocabulary. */
int decode_step(const DecodeModel *md, int64_t M, const int64_t *input_ids, const int64_t *positions,
                const int64_t *slots, const int64_t *tables, int64_t table_stride, const int64_t *seq_lens,
                void *residual, void *hidden, float *logits, int num_threads) {
    if (M <= 0) return 0;
    if (num_threads < 1) num_threads = 1;
    const int bf = md->is_bf16;
    const size_t elem = bf ? 2 : 4;
    for (int64_t m = 0; m < M; m++) {
        if (input_ids[m] < 0 || input_ids[m] >= md->vocab) return -2;
        memcpy((char *)residual + (size_t)(m * md->hidden) * elem,
               (const char *)md->embed + (size_t)(input_ids[m] * md->hidden) * elem, (size_t)md->hidden * elem);
    }
    const int64_t H = md->num_heads, KVH = md->num_kv_heads, D = md->head_dim, I = md->intermediate;
    const int64_t n = md->hidden, width = (H + 2 * KVH) * D, chunk = 4 * md->block_size;
    int64_t max_len, num_items;
    paged_decode_plan(seq_lens, M, md->block_size, &max_len, &num_items);
    const int64_t max_chunks = (max_len + chunk - 1) / chunk;
    /* NOTE: a batch of a few rows (M <= PRIVATE_ROWS) on several threads keeps its residual, normed hidden rows
     * and SiLU output in each thread's own copy, every thread computing them all, instead of one thread of the
     * team computing them into shared rows behind a barrier: then each GEMV's output is the only thing the
     * threads exchange, three barriers a layer fewer. One row on two threads: 0.91-0.99x the step's time (median
     * 0.94x) while the host ran this 2-vCPU machine's threads apart (a barrier 0.3 us, a plain read 60-74 GB/s),
     * 0.95-1.02x while it ran them as if on one core (a barrier 0.05 us, a read 36 GB/s; interleaved builds,
     * Zen 4, 2026-12-08). Each thread also rotates every row's Q and K into its own rows and the attention reads
     * the new token's K and V from there (rope_own), so no barrier waits for the cache store: 0.96-1.02x (median
     * 0.97x) with the threads apart, 0.95-1.06x (median 1.00x) otherwise. */
    const int own = M <= PRIVATE_ROWS && num_threads > 1;
    const size_t rows_bytes = align64((size_t)(M * n) * elem), act_bytes = align64((size_t)(M * I) * elem);
    const size_t q_bytes = align64((size_t)(M * H * D) * elem);
    const size_t mine = own ? 2 * rows_bytes + act_bytes + q_bytes + align64((size_t)(M * KVH * D) * elem) : 0;
    int64_t widest = n > I ? n : I;
    widest = widest > H * D ? widest : H * D;
    const size_t sizes[] = {
        (size_t)(M * width) * elem,                        /* qkv */
        (size_t)(M * H * D) * elem,                        /* q */
        (size_t)(M * H * D) * elem,                        /* attention output */
        (size_t)(M * n) * elem,                            /* o / down output */
        (size_t)(M * 2 * I) * elem,                        /* gate_up */
        (size_t)(M * I) * elem,                            /* act */
        sizeof(int64_t) * (size_t)(2 * num_items),         /* attention items */
        sizeof(float) * (size_t)(M * H * max_len),         /* attention scores */
        sizeof(float) * (size_t)(M * max_chunks * H * D),  /* attention partial sums */
        quant_scratch_bytes(M, widest, num_threads),       /* quantized activations */
        (size_t)num_threads * mine,                        /* each thread's own residual, hidden, act, Q, K */
    };
    size_t need = 0;
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) need += align64(sizes[i]);
    if (need > scratch_bytes) {
        free(scratch);
        scratch = aligned_alloc(64, need);
        scratch_bytes = scratch ? need : 0;
        if (!scratch) return -1;
    }
    char *p = scratch;
    void *qkv = carve(&p, sizes[0]), *q = carve(&p, sizes[1]), *attn = carve(&p, sizes[2]);
    void *tmp = carve(&p, sizes[3]), *gate_up = carve(&p, sizes[4]), *act = carve(&p, sizes[5]);
    int64_t *items = (int64_t *)carve(&p, sizes[6]);
    float *scores = (float *)carve(&p, sizes[7]), *partial = (float *)carve(&p, sizes[8]);
    void *quant = carve(&p, sizes[9]);
    char *own_rows = carve(&p, sizes[10]);

    #pragma omp parallel num_threads(num_threads)
    {
        QuantActs acts_n, acts_i, acts_hd; /* the same scratch, split for each input width */
        float *rows_n, *rows_i, *rows_hd;
        quant_scratch_split(quant, M, n, num_threads, &acts_n, &rows_n);
        quant_scratch_split(quant, M, I, num_threads, &acts_i, &rows_i);
        quant_scratch_split(quant, M, H * D, num_threads, &acts_hd, &rows_hd);
        void *res = residual, *hid = hidden, *act_in = act; /* the team's rows, or this thread's own */
        void *q_own = NULL, *k_own = NULL;
        const int mine_here = quant_rows_private(M); /* as quant_gemm_team decides, on the team the runtime gave */
#ifdef _OPENMP
        char *at = own_rows + (size_t)omp_get_thread_num() * mine;
#else
        char *at = own_rows;
#endif
        if (mine_here) {
            res = at;
            hid = at + rows_bytes;
            act_in = at + 2 * rows_bytes;
            q_own = at + 2 * rows_bytes + act_bytes;
            k_own = at + 2 * rows_bytes + act_bytes + q_bytes;
            memcpy(res, residual, (size_t)(M * n) * elem);
        }
        add_rms_norm_rows(md, M, NULL, res, hid, md->input_norm[0], !mine_here);
        for (int64_t l = 0; l < md->num_layers; l++) {
            quant_gemm_team(hid, bf, M, n, md->qkv[l], 4, md->act_bits, width, qkv, bf, &acts_n, rows_n);
            const void *q_in = q;
            const NewTokens fresh = {k_own, KVH * D, (const char *)qkv + (size_t)((H + KVH) * D) * elem, width};
            if (mine_here) {
                rope_own(md, l, M, qkv, q_own, k_own, positions, slots);
                q_in = q_own;
            } else {
                rope_and_store(md, l, M, qkv, q, positions, slots);
            }
            if (bf)
                paged_decode_team_bf16(q_in, md->k_cache[l], md->v_cache[l], tables, table_stride, seq_lens, attn,
                                       M, H, KVH, D, md->block_size, md->scale, items, num_items, scores, max_len,
                                       partial, mine_here ? &fresh : NULL);
            else
                paged_decode_team_f32(q_in, md->k_cache[l], md->v_cache[l], tables, table_stride, seq_lens, attn,
                                      M, H, KVH, D, md->block_size, md->scale, items, num_items, scores, max_len,
                                      partial, mine_here ? &fresh : NULL);
            quant_gemm_team(attn, bf, M, H * D, md->o[l], 4, md->act_bits, n, tmp, bf, &acts_hd, rows_hd);
            add_rms_norm_rows(md, M, tmp, res, hid, md->post_norm[l], !mine_here);
            quant_gemm_team(hid, bf, M, n, md->gate_up[l], 4, md->act_bits, 2 * I, gate_up, bf, &acts_n, rows_n);
            silu_mul_rows(md, M, gate_up, act_in, !mine_here);
            quant_gemm_team(act_in, bf, M, I, md->down[l], 4, md->act_bits, n, tmp, bf, &acts_i, rows_i);
            const void *next = l + 1 < md->num_layers ? md->input_norm[l + 1] : md->final_norm;
            add_rms_norm_rows(md, M, tmp, res, hid, next, !mine_here);
        }
        if (logits && md->head) head_logits(md, M, hid, logits, &acts_n, rows_n);
        if (mine_here) {
            /* NOTE: a thread reads the shared tmp and gate_up into its own rows after a GEMV's barrier, while
             * another may already run the next GEMV: that writes neither (each is next written a barrier later).
             * This barrier: every thread has copied `residual` (a model without layers) before one writes it. */
            #pragma omp barrier
            #pragma omp single
            {
                memcpy(residual, res, (size_t)(M * n) * elem);
                memcpy(hidden, hid, (size_t)(M * n) * elem);
            }
        }
    }
    return 0;
}
