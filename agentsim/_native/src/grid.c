/* Grid kernels (agentsim/_native/kernels.py: periodic_grid_sum; agentsim.space.grid.Grid.neighbor_sum).
   Integer sums: exact, so the result of any order of the torch ops. */
#include "agentsim_kernels.h"

/* Periodic grid sums of int64 layers: out[b, i, j] = sum_k x[b, (i + dr[k]) mod h, (j + dc[k]) mod w]
   for the output rows r0 <= b * h + i < r1 of [*, h, w] (0 <= |dr| < h, 0 <= |dc| < w). Each
   offset is a pass over a row held in cache, split where the columns wrap so the loops vectorize. */
void agentsim_grid_sum64(const int64_t *x, int64_t r0, int64_t r1, int64_t h, int64_t w,
                         const int64_t *dr, const int64_t *dc, int64_t k, int64_t *out) {
    for (int64_t row = r0; row < r1; row++) {
        int64_t b = row / h, i = row % h;
        int64_t *o = out + row * w;
        for (int64_t j = 0; j < w; j++) o[j] = 0;
        for (int64_t q = 0; q < k; q++) {
            int64_t r = ((i + dr[q]) % h + h) % h, c = (dc[q] % w + w) % w;
            const int64_t *s = x + (b * h + r) * w;
            for (int64_t j = 0; j < w - c; j++) o[j] += s[j + c];
            for (int64_t j = w - c; j < w; j++) o[j] += s[j + c - w];
        }
    }
}

