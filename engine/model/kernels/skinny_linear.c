/* y = x W^T + b for the few rows of a decode step (fp32, CPU), over a weight packed in panels.
 *
 * Why by hand: oneDNN's prepacked inner product (engine/model/prepacked_linear.py) pays a fixed
 * ~70 us per call here, which is most of a call for the `small` preset's matrices (256 x 256 to
 * 256 x 1536, cache-resident), and over weights streamed from memory (100m's 768-wide ones) at
 * 8-32 rows it reached a third of this CPU's arithmetic rate and half its bandwidth. This loop
 * is the register-blocked kernel of a GEMM with few rows: engine/model/kernels/skinny.py keeps
 * the numbers.
 *
 * Layout: the weight W [n, k] is packed once at load time into panels of PANEL output features,
 * packed[p][j][c] = W[p * PANEL + c][j] (n padded with zero rows up to a multiple of PANEL), so
 * one panel is one contiguous run of k * PANEL floats.
 *
 * Blocking: GROUP adjacent panels (48 outputs with AVX-512, 16 with AVX2) are one unit of work.
 * Their weights go through in chunks of K_CHUNK inputs (12 or 4 KiB, L1-resident); every block
 * of up to ROW_BLOCK rows takes the chunk before the next is read, so each weight is read from
 * memory once per call while the memory stream never waits on the rows (a panel read whole for
 * each row block left memory idle while later blocks computed). ROW_BLOCK rows x GROUP panels
 * of accumulators in registers, fed by GROUP weight loads and ROW_BLOCK broadcasts per input:
 * the fused multiply-adds, not the loads, set the pace.
 * Partial sums cross chunks in a small buffer, in fp32, unchanged.
 *
 * Each output is a sum over j in ascending order, the same for every row whatever the other
 * rows of the step are: a row's result does not depend on its batch or the thread count.
 */
#include <stdint.h>
#include <string.h>

/* The register block follows the vector registers this CPU has (-march=native). AVX-512: 32
 * registers of 16 floats, so a panel is one register and 8 rows x 3 panels = 24 accumulators.
 * Otherwise (AVX2: 16 registers of 8 floats) a panel of 16 is two registers and that block
 * needs 48 accumulators: it spilled to memory on every multiply-add, and on a 2-vCPU AMD EPYC
 * without AVX-512 a 100m decode step at B=8 took 299 ms against 44 ms through oneDNN. There,
 * a panel of 8 and 6 rows x 2 panels (BLIS's 6 x 16 for AVX2): 12 accumulators, 2 weight
 * vectors and a broadcast, one register to spare. 4 rows x 3 panels (also 12 accumulators, a
 * weight load fewer per input) measured slower on that EPYC: the linears of a 100m step at 32
 * rows 62 -> 47 ms, 16 rows 34 -> 28, 8 rows 19 -> 17, even at 1-4; 6 x 3 spills.
 * engine/model/kernels/skinny.py packs with the PANEL this file reports. */
#if defined(__AVX512F__)
#define PANEL 16
#define ROW_BLOCK 8
#define GROUP 3
#else
#define PANEL 8
#define ROW_BLOCK 6
#define GROUP 2
#endif
#define GROUP_WIDTH (PANEL * GROUP)
#define K_CHUNK 64
/* Rows whose partial sums one pass keeps (the buffer below); more rows take another pass. */
#define ROW_PASS 32

typedef float panel_vec __attribute__((vector_size(PANEL * sizeof(float))));

static inline panel_vec load_vec(const float *p) {
    panel_vec v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void store_vec(float *p, panel_vec v) { memcpy(p, &v, sizeof v); }

/* Rows [0, ROWS) of one row block times the inputs [j0, j1) of NP panels (ROWS and NP are
 * compile-time constants after inlining, so the accumulators live in registers). `sums` holds
 * the rows' partial sums, GROUP_WIDTH floats a row; `first`: start from zero instead. */
static inline __attribute__((always_inline)) void block_chunk(
    const float *x, int64_t x_stride, const float *const *panels, int64_t j0, int64_t j1,
    float *sums, int first, const int ROWS, const int NP) {
    panel_vec acc[ROW_BLOCK][GROUP];
    for (int r = 0; r < ROWS; ++r)
        for (int q = 0; q < NP; ++q)
            acc[r][q] = first ? (panel_vec){0} : load_vec(sums + r * GROUP_WIDTH + q * PANEL);
    for (int64_t j = j0; j < j1; ++j) {
        panel_vec w[GROUP];
        for (int q = 0; q < NP; ++q) w[q] = load_vec(panels[q] + j * PANEL);
        /* The next chunk's weights, toward L2 while this one computes: without it the first
         * row block of every chunk waited on memory (32 rows of 100m: 2.85 -> 2.60 ms a layer). */
        for (int q = 0; q < NP; ++q) __builtin_prefetch(panels[q] + (j + K_CHUNK) * PANEL, 0, 2);
        for (int r = 0; r < ROWS; ++r) {
            const float xr = x[r * x_stride + j];
            for (int q = 0; q < NP; ++q) acc[r][q] += xr * w[q];
        }
    }
    for (int r = 0; r < ROWS; ++r)
        for (int q = 0; q < NP; ++q) store_vec(sums + r * GROUP_WIDTH + q * PANEL, acc[r][q]);
}

#define ROWS_CASES(NP)                                                                   \
    switch (rows) {                                                                      \
        case 1: block_chunk(x, x_stride, panels, j0, j1, sums, first, 1, NP); break;     \
        case 2: block_chunk(x, x_stride, panels, j0, j1, sums, first, 2, NP); break;     \
        case 3: block_chunk(x, x_stride, panels, j0, j1, sums, first, 3, NP); break;     \
        MORE_ROWS_CASES(NP)                                                              \
        default: block_chunk(x, x_stride, panels, j0, j1, sums, first, ROW_BLOCK, NP);   \
    }

#if ROW_BLOCK != 6 && ROW_BLOCK != 8
#error "ROW_BLOCK must be 6 or 8"
#endif
#if ROW_BLOCK == 8
#define ROWS_6_7_CASES(NP)                                                               \
        case 6: block_chunk(x, x_stride, panels, j0, j1, sums, first, 6, NP); break;     \
        case 7: block_chunk(x, x_stride, panels, j0, j1, sums, first, 7, NP); break;
#else
#define ROWS_6_7_CASES(NP)
#endif
#define MORE_ROWS_CASES(NP)                                                              \
        case 4: block_chunk(x, x_stride, panels, j0, j1, sums, first, 4, NP); break;     \
        case 5: block_chunk(x, x_stride, panels, j0, j1, sums, first, 5, NP); break;     \
        ROWS_6_7_CASES(NP)

static void rows_chunk(const float *x, int64_t x_stride, const float *const *panels,
                       int64_t np, int64_t j0, int64_t j1, float *sums, int first,
                       int64_t rows) {
    switch (np) {
        case 1: ROWS_CASES(1) break;
#if GROUP == 3
        case 2: ROWS_CASES(2) break;
#endif
        default: ROWS_CASES(GROUP) break;
    }
}

/* Up to ROW_PASS rows times one group of `np` panels, all of k; outputs to y with the bias. */
static void group_rows(const float *x, int64_t x_stride, const float *const *panels, int64_t np,
                       int64_t k, const float *bias, float *y, int64_t y_stride, int64_t columns,
                       int64_t rows) {
    float sums[ROW_PASS * GROUP_WIDTH];
    for (int64_t j0 = 0; j0 < k; j0 += K_CHUNK) {
        const int64_t j1 = k - j0 < K_CHUNK ? k : j0 + K_CHUNK;
        for (int64_t r0 = 0; r0 < rows; r0 += ROW_BLOCK) {
            const int64_t count = rows - r0 < ROW_BLOCK ? rows - r0 : ROW_BLOCK;
            rows_chunk(x + r0 * x_stride, x_stride, panels, np, j0, j1,
                       sums + r0 * GROUP_WIDTH, j0 == 0, count);
        }
    }
    for (int64_t r = 0; r < rows; ++r) {
        const float *row_sums = sums + r * GROUP_WIDTH;
        float *row = y + r * y_stride;
        for (int64_t c = 0; c < columns; ++c) row[c] = bias ? row_sums[c] + bias[c] : row_sums[c];
    }
}

/* Output features per panel of the packed weight (the packing must use the same). */
int mixgate_skinny_panel(void) { return PANEL; }

/* x [rows, k] (rows x_stride apart), packed [ceil(n / PANEL), k, PANEL], bias [n] or NULL,
 * y [rows, n] contiguous. Returns 0, or -1 for shapes it does not take. */
int mixgate_skinny_linear_f32(const float *x, int64_t x_stride, const float *packed,
                              const float *bias, float *y, int64_t rows, int64_t n, int64_t k,
                              int num_threads) {
    if (rows < 1 || n < 1 || k < 1 || x_stride < k) return -1;
    const int64_t panels = (n + PANEL - 1) / PANEL;
    const int64_t groups = (panels + GROUP - 1) / GROUP;
    const int threads = num_threads > 0 ? num_threads : 1;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1 && groups > 1)
    for (int64_t g = 0; g < groups; ++g) {
        const int64_t first_panel = g * GROUP;
        const int64_t np = panels - first_panel < GROUP ? panels - first_panel : GROUP;
        const float *group_panels[GROUP];
        for (int64_t q = 0; q < GROUP; ++q)
            group_panels[q] = packed + (first_panel + (q < np ? q : 0)) * k * PANEL;
        const int64_t first = first_panel * PANEL;
        const int64_t columns = n - first < GROUP_WIDTH ? n - first : GROUP_WIDTH;
        const float *group_bias = bias ? bias + first : NULL;
        for (int64_t r0 = 0; r0 < rows; r0 += ROW_PASS) {
            const int64_t count = rows - r0 < ROW_PASS ? rows - r0 : ROW_PASS;
            group_rows(x + r0 * x_stride, x_stride, group_panels, np, k, group_bias,
                       y + r0 * n + first, n, columns, count);
        }
    }
    return 0;
}
