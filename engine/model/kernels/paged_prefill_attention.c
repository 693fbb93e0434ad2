/* Causal prefill attention over the paged KV cache in place (CPU, fp32): a chunk of one
 * sequence's queries against every key of that sequence up to each query's own position.
 *
 * Why by hand: torch's CPU SDPA (its flash kernel) ran a causal 2,048-token prompt of the 100m
 * preset at ~140 GFLOP/s on a 2-vCPU Zen 5 whose GEMMs reach ~450: a third of a prompt's
 * prefill time was attention, and vLLM's CPU build prefilled 2,048-token prompts 1.18x faster.
 * A later chunk also had to gather the sequence's blocks into a copy and build a [chunk,
 * context] mask before SDPA could see them. This kernel reads K and V where they lie in the
 * cache, masks by position, and keeps every tile's work in registers and L1.
 *
 * Layout (one layer): k_cache/v_cache [num_blocks, block_size, kv_heads, head_dim]; q and out
 * are rows of [rows, heads, head_dim] with a row stride (in floats) each; block_table int64
 * holds the sequence's blocks in order. Query row i sits at position start_pos + i and attends
 * keys 0 .. start_pos + i (the caller has written the chunk's own K/V into the cache).
 *
 * One task is (query head, tile of QT query rows); flash attention (online softmax) over key
 * tiles of KT keys, on transposed tiles so that every inner loop is a broadcast and a vector
 * FMA and no tile of K is ever transposed:
 *   S^T[j][i] = sum_d K[j][d] * (scale * Q)^T[d][i]        (4 keys x QT queries in registers)
 *   P^T = exp(S^T - running max), per query column
 *   O^T[d][i] = alpha[i] * O^T[d][i] + sum_j V[j][d] * P^T[j][i]   (4 dims x QT in registers)
 * Q is transposed once per task and O^T once at its end. Exactly softmax(q.K^T * scale).V with
 * the causal mask, in another summation order.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX512F__)
#define VW 16 /* floats per vector register */
#else
#define VW 8
#endif
/* Vectors of queries per tile: a 4 x NV block of accumulators plus the NV vectors it multiplies
 * and a broadcast stay in registers (21 of AVX-512's 32 zmm; 11 of AVX2's 16 ymm). */
#if defined(__AVX512F__)
#define NV 4
#else
#define NV 2
#endif
#define QT (NV * VW)
/* Keys per tile: a multiple of 4 (the register block's key rows). 128 measured fastest on the
 * 2-vCPU Zen 5 (2,048-token causal prompt, 12 heads of 64: 22-25 ms a layer against 24-28 at
 * 64, 25 at 32 and 256; interleaved, noisy). A -DKT= build times another. */
#ifndef KT
#define KT 128
#endif
#define MAX_HEAD_DIM 256
/* A masked score. Finite: -ffast-math lets the compiler assume no infinities. */
#define MASKED (-1e30f)

typedef float vf __attribute__((vector_size(VW * sizeof(float))));

/* gcc folds a vector that four FMAs share into each FMA as a memory operand: four loads of it
 * instead of one, and AVX-512 loads (two a cycle) then bound the loop, not the FMAs. An empty
 * asm that claims to change the register keeps it loaded once: 2,048-token prompt, 64-key
 * tiles, 24.2-26.9 ms a layer against 28.6-33.9 without it (a -DNO_KEEP build). */
#ifdef NO_KEEP
#define KEEP_IN_REGISTER(x) ((void)0)
#else
#define KEEP_IN_REGISTER(x) __asm__("" : "+v"(x))
#endif

static inline vf broadcast(float x) { return (vf){0} + x; }

#ifdef LIBM_EXP
#define exp_nonpositive expf
#else
/* e^x for the softmax's x <= 0 (a score less its running max; MASKED less a max), inline in the
 * loops that call it, which gcc vectorizes: 2^(x log2 e) as 2^n (exponent bits) times a
 * degree-5 polynomial for 2^f, f in [-0.5, 0.5] (a relative-error fit: 7.7e-8, about one ulp;
 * tests/engine/test_paged_prefill_kernel.py holds the kernel to float64 attention). Why: libmvec's
 * expf was a call per 16 scores, and at head_dim 32 (`small`) a build with exp made free ran the
 * kernel 25-33% faster: the exp, not the FMAs, was a third of its time. Below 2^-126 (masked
 * keys) it returns 2^-126, not 0: ~1e-38 of a weight beside the row maximum's 1. */
static inline float exp_nonpositive(float x) {
    float t = x * 1.44269504088896341f;
    t = t > -126.0f ? t : -126.0f;
    const float n = __builtin_rintf(t);
    const float f = t - n;
    float p = 1.3266970636323094e-3f;
    p = p * f + 9.675459936261177e-3f;
    p = p * f + 5.550742521882057e-2f;
    p = p * f + 2.4022121727466583e-1f;
    p = p * f + 6.931469440460205e-1f;
    p = p * f + 1.0000001192092896f;
    const uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}
#endif

/* Per-thread scratch, 64-byte aligned: transposed queries and output, one score tile. */
struct scratch {
    float *qt;    /* [head_dim][QT] */
    float *ot;    /* [head_dim][QT] */
    float *s;     /* [KT][QT] */
    float *m;     /* [QT] running max per query */
    float *l;     /* [QT] running sum per query */
    float *alpha; /* [QT] */
};

/* S^T rows j .. j+3 of a tile: 4 keys against QT queries. */
static inline void scores_block(const float *const *kp, const float *qt, int64_t head_dim,
                                float *s) {
    vf acc[4][NV];
    for (int r = 0; r < 4; ++r)
        for (int c = 0; c < NV; ++c) acc[r][c] = (vf){0};
    for (int64_t d = 0; d < head_dim; ++d) {
        const vf *qrow = (const vf *)(qt + d * QT);
        vf qv[NV];
        for (int c = 0; c < NV; ++c) {
            qv[c] = qrow[c];
            KEEP_IN_REGISTER(qv[c]);
        }
        for (int r = 0; r < 4; ++r) {
            const vf kb = broadcast(kp[r][d]);
            for (int c = 0; c < NV; ++c) acc[r][c] += kb * qv[c];
        }
    }
    for (int r = 0; r < 4; ++r)
        for (int c = 0; c < NV; ++c) ((vf *)(s + r * QT))[c] = acc[r][c];
}

/* O^T rows d .. d+3 += sum over the tile's keys of V[j][d..d+3] * P^T[j]. */
static inline void output_block(const float *const *vp, const float *s, int64_t keys, int64_t d,
                                float *ot) {
    vf acc[4][NV];
    for (int r = 0; r < 4; ++r)
        for (int c = 0; c < NV; ++c) acc[r][c] = ((const vf *)(ot + (d + r) * QT))[c];
    for (int64_t j = 0; j < keys; ++j) {
        const vf *prow = (const vf *)(s + j * QT);
        vf pv[NV];
        for (int c = 0; c < NV; ++c) {
            pv[c] = prow[c];
            KEEP_IN_REGISTER(pv[c]);
        }
        for (int r = 0; r < 4; ++r) {
            const vf vb = broadcast(vp[j][d + r]);
            for (int c = 0; c < NV; ++c) acc[r][c] += vb * pv[c];
        }
    }
    for (int r = 0; r < 4; ++r)
        for (int c = 0; c < NV; ++c) ((vf *)(ot + (d + r) * QT))[c] = acc[r][c];
}

static void attend_tile(const float *q, int64_t q_row_stride, float *out, int64_t out_row_stride,
                        const float *k_cache, const float *v_cache, const int64_t *table,
                        int64_t block_size, int64_t token_stride, int64_t head, int64_t kv_head,
                        int64_t head_dim, int64_t start_pos, int64_t q_first, int64_t q_count,
                        float scale, struct scratch *w) {
    float *qt = w->qt, *ot = w->ot, *s = w->s, *m = w->m, *l = w->l, *alpha = w->alpha;
    for (int64_t d = 0; d < head_dim; ++d) {
        for (int64_t i = 0; i < QT; ++i) {
            qt[d * QT + i] = i < q_count
                ? q[(q_first + i) * q_row_stride + head * head_dim + d] * scale : 0.0f;
        }
    }
    memset(ot, 0, sizeof(float) * head_dim * QT);
    for (int64_t i = 0; i < QT; ++i) {
        m[i] = MASKED;
        l[i] = 0.0f;
    }
    const int64_t first_pos = start_pos + q_first;
    const int64_t keys_end = first_pos + q_count; /* the last query sees keys < keys_end */
    const float *kp[KT], *vp[KT];
    for (int64_t k0 = 0; k0 < keys_end; k0 += KT) {
        const int64_t keys = keys_end - k0 < KT ? keys_end - k0 : KT;
        const int64_t keys4 = (keys + 3) & ~(int64_t)3;
        for (int64_t j = 0; j < keys4; ++j) {
            /* rows past the last key read key k0 (a real row) and are masked below */
            const int64_t key = j < keys ? k0 + j : k0;
            const int64_t offset =
                (table[key / block_size] * block_size + key % block_size) * token_stride +
                kv_head * head_dim;
            kp[j] = k_cache + offset;
            vp[j] = v_cache + offset;
        }
        for (int64_t j = 0; j < keys4; j += 4) scores_block(kp + j, qt, head_dim, s + j * QT);
        /* a key past some query of the tile (the diagonal tile, or padding rows): mask */
        if (k0 + keys4 - 1 > first_pos) {
            for (int64_t j = 0; j < keys4; ++j) {
                float *row = s + j * QT;
                for (int64_t i = 0; i < QT; ++i) {
                    if (j >= keys || k0 + j > first_pos + i) row[i] = MASKED;
                }
            }
        }
        /* online softmax, per query column */
        for (int64_t i = 0; i < QT; ++i) alpha[i] = m[i];
        for (int64_t j = 0; j < keys4; ++j) {
            const float *row = s + j * QT;
#pragma omp simd
            for (int64_t i = 0; i < QT; ++i) m[i] = row[i] > m[i] ? row[i] : m[i];
        }
#pragma omp simd
        for (int64_t i = 0; i < QT; ++i) alpha[i] = exp_nonpositive(alpha[i] - m[i]);
        for (int64_t j = 0; j < keys4; ++j) {
            float *row = s + j * QT;
#pragma omp simd
            for (int64_t i = 0; i < QT; ++i) row[i] = exp_nonpositive(row[i] - m[i]);
        }
#pragma omp simd
        for (int64_t i = 0; i < QT; ++i) l[i] *= alpha[i];
        for (int64_t j = 0; j < keys4; ++j) {
            const float *row = s + j * QT;
#pragma omp simd
            for (int64_t i = 0; i < QT; ++i) l[i] += row[i];
        }
        if (k0 > 0) { /* the first tile's alpha scales a zero O^T */
            for (int64_t d = 0; d < head_dim; ++d) {
                float *orow = ot + d * QT;
#pragma omp simd
                for (int64_t i = 0; i < QT; ++i) orow[i] *= alpha[i];
            }
        }
        for (int64_t d = 0; d < head_dim; d += 4) output_block(vp, s, keys4, d, ot);
    }
    for (int64_t i = 0; i < q_count; ++i) {
        const float inv = 1.0f / l[i];
        float *o = out + (q_first + i) * out_row_stride + head * head_dim;
        for (int64_t d = 0; d < head_dim; ++d) o[d] = ot[d * QT + i] * inv;
    }
}

/* Returns 0, or -1 when a shape is outside what the kernel supports (the caller falls back). */
int mixgate_paged_prefill_attention_f32(const float *q, int64_t q_row_stride,
                                        const float *k_cache, const float *v_cache,
                                        const int64_t *block_table, int64_t start_pos,
                                        int64_t rows, float *out, int64_t out_row_stride,
                                        int64_t heads, int64_t kv_heads, int64_t head_dim,
                                        int64_t block_size, float scale, int num_threads) {
    if (kv_heads < 1 || heads % kv_heads != 0 || head_dim < 4 || head_dim % 4 != 0 ||
        head_dim > MAX_HEAD_DIM || rows < 1 || start_pos < 0 || block_size < 1)
        return -1;
    const int64_t group = heads / kv_heads;
    const int64_t tiles = (rows + QT - 1) / QT;
    const int64_t token_stride = kv_heads * head_dim;
    int failed = 0;
#pragma omp parallel num_threads(num_threads)
    {
        struct scratch w;
        const size_t tile_bytes = sizeof(float) * (size_t)head_dim * QT;
        float *arena = aligned_alloc(64, 2 * tile_bytes + sizeof(float) * (KT + 3) * QT);
        if (arena == NULL) {
#pragma omp atomic write
            failed = 1;
        } else {
            w.qt = arena;
            w.ot = w.qt + head_dim * QT;
            w.s = w.ot + head_dim * QT;
            w.m = w.s + KT * QT;
            w.l = w.m + QT;
            w.alpha = w.l + QT;
        }
        /* The last tiles see the most keys: handed out first, so that no thread is left
         * with a long tile at the end while the other idles. */
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < tiles * heads; ++task) {
            if (arena == NULL) continue;
            const int64_t tile = tiles - 1 - task / heads, head = task % heads;
            const int64_t q_first = tile * QT;
            const int64_t q_count = rows - q_first < QT ? rows - q_first : QT;
            attend_tile(q, q_row_stride, out, out_row_stride, k_cache, v_cache, block_table,
                        block_size, token_stride, head, head / group, head_dim, start_pos,
                        q_first, q_count, scale, &w);
        }
        free(arena);
    }
    return failed ? -1 : 0;
}
