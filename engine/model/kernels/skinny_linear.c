/* y = x W^T + b for the few rows of a decode step (fp32, CPU), over a small weight packed in
 * panels.
 *
 * Why by hand: oneDNN's prepacked inner product (engine/model/prepacked_linear.py) pays a fixed
 * ~70 us per call here, which is most of a call for the `small` preset's matrices (256 x 256 to
 * 256 x 1536, cache-resident): this loop does the four matrices of a small layer 2-3x faster
 * at 1-24 rows. For matrices streamed from memory (100m's) it is no faster than oneDNN, so the
 * caller keeps oneDNN for those (engine/model/kernels/skinny.py keeps the numbers).
 *
 * Layout: the weight W [n, k] is packed once at load time into panels of PANEL output features,
 * packed[p][j][c] = W[p * PANEL + c][j] (n padded with zero rows up to a multiple of PANEL), so
 * one panel is one contiguous run of k * PANEL floats: every weight is read once per block of up
 * to ROW_BLOCK rows, in order, and a panel stays in L2 for the next row block.
 *
 * Each output is a sum over j in ascending order, the same for every row whatever the other
 * rows of the step are: a row's result does not depend on its batch.
 */
#include <stdint.h>
#include <string.h>

#define PANEL 16
#define ROW_BLOCK 8

typedef float panel_vec __attribute__((vector_size(PANEL * sizeof(float))));

static inline panel_vec load_panel(const float *p) {
    panel_vec v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* One panel times `ROWS` rows (a compile-time constant after inlining, so that the
 * accumulators live in registers). */
static inline __attribute__((always_inline)) void panel_rows(
    const float *x, int64_t x_stride, const float *panel, int64_t k, const float *bias,
    float *y, int64_t y_stride, int64_t columns, const int ROWS) {
    panel_vec acc[ROW_BLOCK];
    for (int r = 0; r < ROWS; ++r) acc[r] = (panel_vec){0};
    for (int64_t j = 0; j < k; ++j) {
        const panel_vec w = load_panel(panel + j * PANEL);
        for (int r = 0; r < ROWS; ++r) acc[r] += x[r * x_stride + j] * w;
    }
    for (int r = 0; r < ROWS; ++r) {
        float out[PANEL];
        memcpy(out, &acc[r], sizeof out);
        float *row = y + r * y_stride;
        for (int64_t c = 0; c < columns; ++c) row[c] = bias ? out[c] + bias[c] : out[c];
    }
}

static void panel_times_rows(const float *x, int64_t x_stride, const float *panel, int64_t k,
                             const float *bias, float *y, int64_t y_stride, int64_t columns,
                             int64_t rows) {
    switch (rows) {
        case 1: panel_rows(x, x_stride, panel, k, bias, y, y_stride, columns, 1); break;
        case 2: panel_rows(x, x_stride, panel, k, bias, y, y_stride, columns, 2); break;
        case 3: panel_rows(x, x_stride, panel, k, bias, y, y_stride, columns, 3); break;
        case 4: panel_rows(x, x_stride, panel, k, bias, y, y_stride, columns, 4); break;
        case 5: panel_rows(x, x_stride, panel, k, bias, y, y_stride, columns, 5); break;
        case 6: panel_rows(x, x_stride, panel, k, bias, y, y_stride, columns, 6); break;
        case 7: panel_rows(x, x_stride, panel, k, bias, y, y_stride, columns, 7); break;
        default: panel_rows(x, x_stride, panel, k, bias, y, y_stride, columns, 8); break;
    }
}

/* x [rows, k] (rows x_stride apart), packed [ceil(n / PANEL), k, PANEL], bias [n] or NULL,
 * y [rows, n] contiguous. Returns 0, or -1 for shapes it does not take. */
int mixgate_skinny_linear_f32(const float *x, int64_t x_stride, const float *packed,
                              const float *bias, float *y, int64_t rows, int64_t n, int64_t k,
                              int num_threads) {
    if (rows < 1 || n < 1 || k < 1 || x_stride < k) return -1;
    const int64_t panels = (n + PANEL - 1) / PANEL;
    const int threads = num_threads > 0 ? num_threads : 1;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1 && panels > 1)
    for (int64_t p = 0; p < panels; ++p) {
        const float *panel = packed + p * k * PANEL;
        const int64_t first = p * PANEL;
        const int64_t columns = n - first < PANEL ? n - first : PANEL;
        const float *panel_bias = bias ? bias + first : NULL;
        for (int64_t r0 = 0; r0 < rows; r0 += ROW_BLOCK) {
            const int64_t count = rows - r0 < ROW_BLOCK ? rows - r0 : ROW_BLOCK;
            panel_times_rows(x + r0 * x_stride, x_stride, panel, k, panel_bias, y + r0 * n + first,
                             n, columns, count);
        }
    }
    return 0;
}
