/* A step's whole forward, every layer, in one call (fp32, CPU), for a step of decodes and prefill
 * chunks of up to MAX_ROWS rows in all: the embedding, then per layer RMSNorm (with the residual
 * add), the fused q/k/v projection, rotary, the K/V write into the paged cache, paged decode
 * attention for the single-token rows and paged prefill attention for each chunk, the output
 * projection, RMSNorm, the fused gate/up projection, SiLU * up and the down projection; then the
 * final norm. The logits and sampling stay with the caller.
 *
 * Why: each of those stretches was already one C call (skinny_linear.c, fused_elementwise.c,
 * paged_decode_attention.c), but from Python: per layer ten ctypes calls, the tensors each
 * allocates and the views between them. On the 2-vCPU Xeon (`100m`, 12 layers, 2 threads) that
 * glue was ~4 ms of a 19 ms B=1 step beside 15 ms of weights streamed, the fixed cost per step
 * that `plan calibrate` fits (engine/model/kernels/step_forward.py keeps the numbers). A mixed
 * step (decodes beside a bulk prefill chunk, what a chat decodes in under a backlog) paid the
 * same glue per layer, and more: the layers' attention split its output rows into a fresh tensor.
 *
 * The kernels are called through the addresses of the very functions the layer-by-layer path
 * calls (the caller hands them in), not compiled again here: built into this file, gcc inlined
 * them and, under -ffast-math, vectorized them differently (hidden states 1 ulp apart). So the
 * same machine code runs in the same order on the same inputs, and the outputs are the same
 * bits (tests/engine/test_step_forward.py holds both paths to that). Scratch buffers are the
 * caller's, reused from step to step.
 */
#include <stdint.h>
#include <string.h>

/* Rows a call takes at most: the scratch buffers' (step_forward.py's MAX_ROWS, the skinny
 * kernel's bound with AVX-512; the caller holds a call to its build's bound). */
#define MAX_ROWS 128

/* The entry points of fused_elementwise.c, skinny_linear.c and paged_decode_attention.c. */
typedef void (*rms_norm_fn)(const float *, const float *, float *, const float *, float *,
                            int64_t, int64_t, int64_t, float, int);
typedef void (*silu_mul_fn)(const float *, float *, int64_t, int64_t, int);
typedef void (*rotary_fn)(const float *, int64_t, const float *, const float *, float *, int64_t,
                          int64_t, int64_t, int);
typedef int (*linear_fn)(const float *, int64_t, const float *, const float *, float *, int64_t,
                         int64_t, int64_t, int);
typedef int (*attention_fn)(const float *, const float *, const float *, const int64_t *, int64_t,
                            const int64_t *, float *, int64_t, int64_t, int64_t, int64_t, int64_t,
                            float, int);
typedef int (*prefill_attention_fn)(const float *, int64_t, const float *, const float *,
                                    const int64_t *, int64_t, int64_t, float *, int64_t, int64_t,
                                    int64_t, int64_t, int64_t, float, int);

typedef struct {
    rms_norm_fn rms_norm;
    silu_mul_fn silu_mul;
    rotary_fn rotary;
    linear_fn linear;
    attention_fn attention;
    prefill_attention_fn prefill_attention; /* NULL where no prefill kernel runs: spans refused */
} mixgate_step_kernels;

/* One layer's weights (skinny-packed panels; NULL biases where the model has none) and its
 * K/V caches [num_blocks, block_size, kv_heads, head_dim]. */
typedef struct {
    const float *input_norm;
    const float *post_attention_norm;
    const float *qkv_panels;
    const float *qkv_bias;
    const float *o_panels;
    const float *o_bias;
    const float *gate_up_panels;
    const float *gate_up_bias;
    const float *down_panels;
    const float *down_bias;
    float *k_cache;
    float *v_cache;
} mixgate_step_layer;

/* The model's shape and its non-layer weights. */
typedef struct {
    int64_t layers, hidden, heads, kv_heads, head_dim, intermediate, block_size;
    float eps;
    float attention_scale; /* the layers' 1 / sqrt(head_dim), rounded as they round it */
    const float *embedding; /* [vocab, hidden] */
    const float *cos_table; /* [max_positions, head_dim] */
    const float *sin_table; /* [max_positions, head_dim] */
    const float *final_norm;
} mixgate_step_model;

/* Per-row buffers, each of at least rows x the width named (floats). */
typedef struct {
    float *residual;    /* hidden */
    float *stream;      /* hidden: a layer's output, added to the residual by the next norm */
    float *normed;      /* hidden */
    float *qkv;         /* (heads + 2 kv_heads) head_dim */
    float *qk;          /* (heads + kv_heads) head_dim: q and k rotated */
    float *q;           /* heads head_dim: q alone, rows contiguous (the attention kernel's) */
    float *attended;    /* heads head_dim */
    float *gate_up;     /* 2 intermediate */
    float *activated;   /* intermediate */
    float *cos_rows;    /* head_dim */
    float *signed_sin;  /* head_dim */
} mixgate_step_scratch;

/* The step's rows: `decode_rows` single-token rows first (block_tables int64 [decode_rows,
 * table_stride], context_lens int64 [decode_rows], attended by the decode kernel), then
 * `span_count` prefill chunks laid end to end (spans int64 [span_count, 2]: each chunk's rows and
 * its first position; span_tables int64 [span_count, span_table_stride]: its block table; each
 * attended causally by the prefill kernel). input_ids, positions, slot_mapping int64 [rows];
 * out [rows, hidden]: the final norm's output. Returns 0, or -1 where the shapes are refused
 * (the caller then runs the layer-by-layer path). */
int mixgate_step_forward_f32(const mixgate_step_kernels *k, const mixgate_step_model *model,
                             const mixgate_step_layer *layers, const mixgate_step_scratch *scratch,
                             const int64_t *input_ids, const int64_t *positions,
                             const int64_t *slot_mapping, const int64_t *block_tables,
                             int64_t table_stride, const int64_t *context_lens,
                             int64_t decode_rows, const int64_t *spans, const int64_t *span_tables,
                             int64_t span_table_stride, int64_t span_count, int64_t rows,
                             float *out, int num_threads) {
    const int64_t hidden = model->hidden, d = model->head_dim, half = d / 2;
    const int64_t heads = model->heads, kv_heads = model->kv_heads;
    const int64_t q_size = heads * d, kv_size = kv_heads * d, qkv_n = q_size + 2 * kv_size;
    const int64_t inter = model->intermediate;
    if (rows < 1 || rows > MAX_ROWS || d % 2 != 0 || decode_rows < 0 || span_count < 0) return -1;
    if (span_count > 0 && k->prefill_attention == NULL) return -1;
    int64_t span_rows = 0;
    for (int64_t s = 0; s < span_count; ++s) {
        if (spans[2 * s] < 1 || spans[2 * s + 1] < 0) return -1;
        span_rows += spans[2 * s];
    }
    if (decode_rows + span_rows != rows) return -1;
    for (int64_t r = 0; r < rows; ++r) {
        memcpy(scratch->stream + r * hidden, model->embedding + input_ids[r] * hidden,
               sizeof(float) * hidden);
        /* engine/model/rotary.py's tables: cos, and sin with its first half negated. */
        const float *c = model->cos_table + positions[r] * d;
        const float *s = model->sin_table + positions[r] * d;
        memcpy(scratch->cos_rows + r * d, c, sizeof(float) * d);
        for (int64_t i = 0; i < d; ++i) scratch->signed_sin[r * d + i] = i < half ? -s[i] : s[i];
    }
    for (int64_t l = 0; l < model->layers; ++l) {
        const mixgate_step_layer *w = &layers[l];
        if (l == 0) {
            /* The first layer's residual is the embeddings themselves. */
            memcpy(scratch->residual, scratch->stream, sizeof(float) * rows * hidden);
            k->rms_norm(scratch->stream, NULL, NULL, w->input_norm, scratch->normed, rows, hidden,
                        hidden, model->eps, num_threads);
        } else {
            /* The last layer's MLP output joins the residual stream here, in the norm's pass. */
            k->rms_norm(scratch->stream, scratch->residual, scratch->residual, w->input_norm,
                        scratch->normed, rows, hidden, hidden, model->eps, num_threads);
        }
        if (k->linear(scratch->normed, hidden, w->qkv_panels, w->qkv_bias, scratch->qkv, rows,
                      qkv_n, hidden, num_threads))
            return -1;
        /* q and k rotated side by side, read straight from the qkv rows. */
        k->rotary(scratch->qkv, qkv_n, scratch->cos_rows, scratch->signed_sin, scratch->qk, rows,
                  heads + kv_heads, d, num_threads);
        for (int64_t r = 0; r < rows; ++r) {
            const float *qk_row = scratch->qk + r * (q_size + kv_size);
            const float *v_row = scratch->qkv + r * qkv_n + q_size + kv_size;
            memcpy(scratch->q + r * q_size, qk_row, sizeof(float) * q_size);
            memcpy(w->k_cache + slot_mapping[r] * kv_size, qk_row + q_size,
                   sizeof(float) * kv_size);
            memcpy(w->v_cache + slot_mapping[r] * kv_size, v_row, sizeof(float) * kv_size);
        }
        /* A refusal past this point leaves this and earlier layers' K/V written: the caller's
         * layer-by-layer rerun writes the same values to the same slots. */
        if (decode_rows > 0 &&
            k->attention(scratch->q, w->k_cache, w->v_cache, block_tables, table_stride,
                         context_lens, scratch->attended, decode_rows, heads, kv_heads, d,
                         model->block_size, model->attention_scale, num_threads))
            return -1;
        /* Each chunk after the decodes, over its own blocks (its K/V written just above). */
        for (int64_t s = 0, first = decode_rows; s < span_count; first += spans[2 * s], ++s) {
            if (k->prefill_attention(scratch->q + first * q_size, q_size, w->k_cache, w->v_cache,
                                     span_tables + s * span_table_stride, spans[2 * s + 1],
                                     spans[2 * s], scratch->attended + first * q_size, q_size,
                                     heads, kv_heads, d, model->block_size,
                                     model->attention_scale, num_threads))
                return -1;
        }
        if (k->linear(scratch->attended, q_size, w->o_panels, w->o_bias, scratch->stream, rows,
                      hidden, q_size, num_threads))
            return -1;
        k->rms_norm(scratch->stream, scratch->residual, scratch->residual, w->post_attention_norm,
                    scratch->normed, rows, hidden, hidden, model->eps, num_threads);
        if (k->linear(scratch->normed, hidden, w->gate_up_panels, w->gate_up_bias,
                      scratch->gate_up, rows, 2 * inter, hidden, num_threads))
            return -1;
        k->silu_mul(scratch->gate_up, scratch->activated, rows, inter, num_threads);
        if (k->linear(scratch->activated, inter, w->down_panels, w->down_bias, scratch->stream,
                      rows, hidden, inter, num_threads))
            return -1;
    }
    k->rms_norm(scratch->stream, scratch->residual, scratch->residual, model->final_norm, out,
                rows, hidden, hidden, model->eps, num_threads);
    return 0;
}
