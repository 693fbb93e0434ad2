/* Decode attention over the paged KV cache in place (CPU): no gathered copy of K/V.
 *
 * Why by hand: every torch path attends over a contiguous K/V, so a paged cache must first be
 * gathered into a copy (read the cache, write the copy, read the copy again), and torch's CPU
 * SDPA kernel for a single query with GQA runs far below the memory bandwidth. The packages that
 * ship CPU paged attention (vLLM's _C ops, intel-extension-for-pytorch) are built for their own
 * torch versions and not for this one. This kernel reads each sequence's K and V blocks once,
 * where they lie, and handles a GQA group of query heads per K/V head in one pass.
 *
 * Layout (one layer): k_cache/v_cache [num_blocks, block_size, kv_heads, head_dim], q and out
 * [rows, heads, head_dim], block_tables int64 [rows, table_stride], context_lens int64 [rows]
 * (keys 0 .. context_len-1 of a row are attended; the caller has written the row's own K/V).
 *
 * Per (row, kv head) task, two passes: scores of every key for the group's query heads (a
 * scratch of group x context floats), then softmax and the weighted sum of V. Exactly the
 * softmax(q.K^T * scale).V that SDPA computes, in another summation order.
 *
 * Two entry points, one body: an fp32 cache, and a bf16 cache (bf16 K/V widened to fp32 as they
 * are read, q and out in fp32: what SDPA over fp32 copies of the gathered bf16 K/V computed,
 * without the gather, the copies or the second read).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_GROUP 64
#define MAX_HEAD_DIM 512
/* Floats of one task's output accumulator (on the stack): heads x head_dim at most. */
#define MAX_ACC (64 * 128)

/* Ask for [p, p + bytes) ahead of use. A row's blocks lie anywhere in the cache, so the hardware
 * prefetcher, which follows sequential runs, starts every block cold: each token asks for the
 * token PREFETCH_AHEAD_BYTES ahead of it in the row's own order (through the block table, so
 * across block edges), into L1. Against the previous scheme (each token fetching the same token
 * of the next block, into L2), 100m's shapes, 12 layers from memory, 2 threads, interleaved, on
 * the 2-vCPU Zen 5: while a streaming read reached 52-58 GB/s, 34-41 -> 47-52 GB/s (B=32 x 128
 * keys 7.7-8.8 -> 6.4 ms, B=64 14.6-15.7 -> 11.8, B=32 x 512 28.9-31.8 -> 23.3); while a
 * neighbour held it to 40-47, 31.5-36 -> 33-37 GB/s. 4 and 6 KiB ahead measured the same as 12,
 * 24 KiB 2-4% slower, 12 KiB into L2 42-44 GB/s (quiet), no prefetch 25-30. The small preset's
 * shapes (4 kv heads of 32) were even, ~35 GB/s. */
#define PREFETCH_AHEAD_BYTES 12288

/* always_inline: a prefetch has no effect that gcc can see, so an out-of-line call to a function
 * that only prefetches is "pure" to it, and its call is deleted as dead code. */
#define ALWAYS_INLINE static inline __attribute__((always_inline))

ALWAYS_INLINE void prefetch_span(const void *p, int64_t bytes) {
    const char *c = (const char *)p;
    for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(c + off, 0, 3);
}

/* The record (this task's kv heads, at element offset head_offset in a token) of token `pos` of
 * a row, when the row has one: strides in elements of elem_bytes each. */
ALWAYS_INLINE void prefetch_token(const void *cache, const int64_t *table, int64_t pos,
                                 int64_t context_len, int64_t block_size, int64_t block_stride,
                                 int64_t token_stride, int64_t head_offset, int64_t elem_bytes,
                                 int64_t record_bytes) {
    if (pos >= context_len) return;
    const int64_t element =
        table[pos / block_size] * block_stride + (pos % block_size) * token_stride + head_offset;
    prefetch_span((const char *)cache + element * elem_bytes, record_bytes);
}

/* Keys of block b that lie inside a context of context_len (the last block may be partial). */
static inline int64_t tokens_in_block(int64_t context_len, int64_t b, int64_t block_size) {
    const int64_t left = context_len - b * block_size;
    return left < block_size ? left : block_size;
}

/* Query heads of kv heads [kv_first, kv_first + kv_count) of one row; q and out point at the
 * row's first query head of kv_first, scores holds kv_count x group x context_len floats. */
#define DEFINE_PAGED_DECODE(SUFFIX, KV_T, LOAD) \
static void attend_row_heads_##SUFFIX(const float *q, const KV_T *k_cache, const KV_T *v_cache,          \
                             const int64_t *table, int64_t context_len, float *out,                      \
                             int64_t group, int64_t kv_heads, int64_t kv_first, int64_t kv_count,        \
                             int64_t head_dim, int64_t block_size, float scale, float *scores) {         \
    const int64_t heads = kv_count * group;                                                              \
    const int64_t token_stride = kv_heads * head_dim;                                                    \
    const int64_t block_stride = block_size * token_stride;                                              \
    const int64_t num_blocks = (context_len + block_size - 1) / block_size;                              \
    /* bytes of one token's K (or V) for this task's kv heads */                                          \
    const int64_t record_bytes = kv_count * head_dim * (int64_t)sizeof(KV_T);                            \
    /* tokens between a token and the one it prefetches */                                               \
    const int64_t ahead = (PREFETCH_AHEAD_BYTES + record_bytes - 1) / record_bytes;                      \
    /* pass 1: scores[h * context_len + t] = q_h . k_t * scale */                                        \
    for (int64_t b = 0; b < num_blocks; ++b) {                                                           \
        const KV_T *k_block = k_cache + table[b] * block_stride + kv_first * head_dim;                   \
        const int64_t first = b * block_size, count = tokens_in_block(context_len, b, block_size);       \
        for (int64_t t = 0; t < count; ++t) {                                                            \
            prefetch_token(k_cache, table, first + t + ahead, context_len, block_size, block_stride,     \
                           token_stride, kv_first * head_dim, sizeof(KV_T), record_bytes);               \
            for (int64_t h = 0; h < heads; ++h) {                                                        \
                /* query head h of this task reads the keys of its kv head, h / group */                 \
                const KV_T *k = k_block + t * token_stride + (h / group) * head_dim;                     \
                const float *qh = q + h * head_dim;                                                      \
                float dot = 0.0f;                                                                        \
_Pragma("omp simd reduction(+ : dot)")                                                                   \
                for (int64_t d = 0; d < head_dim; ++d) dot += qh[d] * LOAD(k[d]);                        \
                scores[h * context_len + first + t] = dot * scale;                                       \
            }                                                                                            \
        }                                                                                                \
    }                                                                                                    \
    /* softmax per query head, in place */                                                               \
    for (int64_t h = 0; h < heads; ++h) {                                                                \
        float *s = scores + h * context_len;                                                             \
        float top = s[0];                                                                                \
        for (int64_t t = 1; t < context_len; ++t) top = s[t] > top ? s[t] : top;                         \
        float total = 0.0f;                                                                              \
_Pragma("omp simd reduction(+ : total)")                                                                 \
        for (int64_t t = 0; t < context_len; ++t) {                                                      \
            s[t] = expf(s[t] - top);                                                                     \
            total += s[t];                                                                               \
        }                                                                                                \
        const float inv = 1.0f / total;                                                                  \
_Pragma("omp simd")                                                                                      \
        for (int64_t t = 0; t < context_len; ++t) s[t] *= inv;                                           \
    }                                                                                                    \
    /* pass 2: out_h = sum_t p_h,t * v_t */                                                              \
    float acc[MAX_ACC];                                                                                  \
    memset(acc, 0, sizeof(float) * heads * head_dim);                                                    \
    for (int64_t b = 0; b < num_blocks; ++b) {                                                           \
        const KV_T *v_block = v_cache + table[b] * block_stride + kv_first * head_dim;                   \
        const int64_t first = b * block_size, count = tokens_in_block(context_len, b, block_size);       \
        for (int64_t t = 0; t < count; ++t) {                                                            \
            prefetch_token(v_cache, table, first + t + ahead, context_len, block_size, block_stride,     \
                           token_stride, kv_first * head_dim, sizeof(KV_T), record_bytes);               \
            for (int64_t h = 0; h < heads; ++h) {                                                        \
                const KV_T *v = v_block + t * token_stride + (h / group) * head_dim;                     \
                const float p = scores[h * context_len + first + t];                                     \
                float *a = acc + h * head_dim;                                                           \
_Pragma("omp simd")                                                                                      \
                for (int64_t d = 0; d < head_dim; ++d) a[d] += p * LOAD(v[d]);                           \
            }                                                                                            \
        }                                                                                                \
    }                                                                                                    \
    memcpy(out, acc, sizeof(float) * heads * head_dim);                                                  \
}                                                                                                        \
                                                                                                         \
/* Returns 0, or -1 when a shape is outside what the kernel supports (the caller falls back). */         \
int mixgate_paged_decode_attention_##SUFFIX(const float *q, const KV_T *k_cache,                         \
                                       const KV_T *v_cache, const int64_t *block_tables,                 \
                                       int64_t table_stride, const int64_t *context_lens,                \
                                       float *out, int64_t rows, int64_t heads, int64_t kv_heads,        \
                                       int64_t head_dim, int64_t block_size, float scale,                \
                                       int num_threads) {                                                \
    if (kv_heads < 1 || heads % kv_heads != 0) return -1;                                                \
    const int64_t group = heads / kv_heads;                                                              \
    if (group > MAX_GROUP || head_dim > MAX_HEAD_DIM || heads * head_dim > MAX_ACC) return -1;           \
    int64_t longest = 1;                                                                                 \
    for (int64_t r = 0; r < rows; ++r) {                                                                 \
        if (context_lens[r] < 1) return -1;                                                              \
        longest = context_lens[r] > longest ? context_lens[r] : longest;                                 \
    }                                                                                                    \
    /* A task is a whole row (every head: each token's K/V record is read in one sweep) when             \
     * there are rows enough to keep the threads busy; else a (row, kv head) pair. */                    \
    const int64_t split = rows >= 2 * (int64_t)num_threads ? 1 : kv_heads;                               \
    const int64_t per_task = kv_heads / split;                                                           \
    int failed = 0;                                                                                      \
    /* Rows longest context first: handed out in that order, no thread is left with a long row at   \
     * the end while the other idles (30 rows of 100-1,500 tokens, `small`: 0.94-0.95x the time;    \
     * even rows unchanged). An insertion sort: a decode batch is tens of rows. */                   \
    int64_t *longest_first = (int64_t *)malloc(sizeof(int64_t) * rows);                                  \
    if (longest_first == NULL) return -1;                                                                \
    for (int64_t r = 0; r < rows; ++r) {                                                                 \
        int64_t i = r;                                                                                   \
        for (; i > 0 && context_lens[longest_first[i - 1]] < context_lens[r]; --i)                       \
            longest_first[i] = longest_first[i - 1];                                                     \
        longest_first[i] = r;                                                                            \
    }                                                                                                    \
_Pragma("omp parallel num_threads(num_threads)")                                                         \
    {                                                                                                    \
        float *scores = (float *)malloc(sizeof(float) * heads * longest);                                \
        if (scores == NULL) {                                                                            \
_Pragma("omp atomic write")                                                                              \
            failed = 1;                                                                                  \
        }                                                                                                \
_Pragma("omp for collapse(2) schedule(dynamic, 1)")                                                      \
        for (int64_t nth = 0; nth < rows; ++nth) {                                                       \
            for (int64_t part = 0; part < split; ++part) {                                               \
                const int64_t r = longest_first[nth];                                                    \
                if (scores == NULL) continue;                                                            \
                const int64_t offset = (r * heads + part * per_task * group) * head_dim;                 \
                attend_row_heads_##SUFFIX(q + offset, k_cache, v_cache, block_tables + r * table_stride, \
                                 context_lens[r], out + offset, group, kv_heads,                         \
                                 part * per_task, per_task, head_dim, block_size, scale, scores);        \
            }                                                                                            \
        }                                                                                                \
        free(scores);                                                                                    \
    }                                                                                                    \
    free(longest_first);                                                                                 \
    return failed ? -1 : 0;                                                                              \
}                                                                                                        \

static inline float load_f32(float x) { return x; }

/* bf16 is the high half of an fp32: widening is a 16-bit shift (vectorized by the compiler). */
static inline float load_bf16(uint16_t x) {
    const uint32_t bits = (uint32_t)x << 16;
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

DEFINE_PAGED_DECODE(f32, float, load_f32)
DEFINE_PAGED_DECODE(bf16, uint16_t, load_bf16)
