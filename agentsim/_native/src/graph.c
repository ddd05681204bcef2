/* Graph kernels (agentsim/_native/kernels.py: push_count, csr_from_pair_chunks): the push of a
   node list along a CSR graph's edges, and the lean CSR build from pair chunks. Integer work only:
   the results are those of the torch ops on any number of threads. */
#include <stdlib.h>
#include <string.h>

#include "agentsim_kernels.h"

#define BUF 4096

/* counts[v] += 1 for every neighbor v of every node in nodes; 0, or 1 + the position of the first
   node outside [0, n_nodes) (nothing is counted then). counts must be zeroed by the caller.
   The loads of the CSR runs (random rows of a large array) are prefetched a few nodes ahead and
   their ids gathered into a small buffer before the increments: the two kinds of cache misses
   no longer wait on each other (3-4x faster than the plain double loop here). */
int64_t agentsim_push_count(const int64_t *indptr, const int32_t *indices, int64_t n_nodes,
                            const int64_t *nodes, int64_t m, int32_t *counts) {
    for (int64_t i = 0; i < m; i++)
        if (nodes[i] < 0 || nodes[i] >= n_nodes) return i + 1;
    int32_t buf[BUF];
    int64_t k = 0;
    for (int64_t i = 0; i < m; i++) {
        if (i + 16 < m) __builtin_prefetch(&indptr[nodes[i + 16]]);
        if (i + 8 < m) {
            const int32_t *p = &indices[indptr[nodes[i + 8]]];
            __builtin_prefetch(p);
            __builtin_prefetch(p + 16);
        }
        int64_t a = indptr[nodes[i]], b = indptr[nodes[i] + 1];
        if (k + (b - a) > BUF) {
            for (int64_t j = 0; j < k; j++) counts[buf[j]]++;
            k = 0;
        }
        if (b - a > BUF) {
            for (int64_t e = a; e < b; e++) counts[indices[e]]++;
            continue;
        }
        for (int64_t e = a; e < b; e++) buf[k++] = indices[e];
    }
    for (int64_t j = 0; j < k; j++) counts[buf[j]]++;
    return 0;
}


/* The CSR of an undirected graph from pairs given in chunks, without a sorted edge list: count,
   then place, then sort and deduplicate each row in place. Self-loops are skipped.
   1. agentsim_csr_count(u, v, m, counts): counts[u] += 1, counts[v] += 1 per pair.
   2. the caller turns counts into row starts (rows[r] = start of row r; rows has n + 1 entries);
   3. agentsim_csr_place(u, v, m, rows, indices): indices[rows[u]++] = v, indices[rows[v]++] = u
      (afterwards rows[r] is the end of row r, i.e. the start of row r + 1);
   4. agentsim_csr_sort_rows(rows, r0, r1, indices, lengths): rows r0 <= r < r1 sorted in place,
      their distinct entries moved to the front of the row, lengths[r] = how many;
   5. agentsim_csr_compact(rows, n, indices, lengths): the rows moved down over the gaps;
      rows[r] = the new starts, rows[n] the number of entries.
   Steps 1, 3 and 4 may run on several threads at once (disjoint pairs, disjoint rows): the
   increments are atomic, and the order in which a row is filled does not matter since it is
   sorted afterwards, so the graph is the same on any number of threads. */
/* Both loops are random accesses into arrays larger than the cache: the rows (and, placing, the
   slots they point to) of pairs a few ahead are prefetched. */
/* u[e * stride], v[e * stride]: the pair e (the columns of an [m, 2] tensor have stride 2) */
void agentsim_csr_count(const int64_t *u, const int64_t *v, int64_t stride, int64_t m, int64_t *counts) {
    for (int64_t e = 0; e < m; e++) {
        int64_t a = u[e * stride], b = v[e * stride];
        if (e + 16 < m) {
            __builtin_prefetch(&counts[u[(e + 16) * stride]], 1);
            __builtin_prefetch(&counts[v[(e + 16) * stride]], 1);
        }
        if (a != b) {
            __atomic_fetch_add(&counts[a], 1, __ATOMIC_RELAXED);
            __atomic_fetch_add(&counts[b], 1, __ATOMIC_RELAXED);
        }
    }
}

void agentsim_csr_place(const int64_t *u, const int64_t *v, int64_t stride, int64_t m, int64_t *rows,
                        int32_t *indices) {
    for (int64_t e = 0; e < m; e++) {
        int64_t a = u[e * stride], b = v[e * stride];
        if (e + 16 < m) {
            __builtin_prefetch(&rows[u[(e + 16) * stride]], 1);
            __builtin_prefetch(&rows[v[(e + 16) * stride]], 1);
        }
        if (e + 8 < m) {
            __builtin_prefetch(&indices[rows[u[(e + 8) * stride]]], 1);
            __builtin_prefetch(&indices[rows[v[(e + 8) * stride]]], 1);
        }
        if (a != b) {
            indices[__atomic_fetch_add(&rows[a], 1, __ATOMIC_RELAXED)] = (int32_t)b;
            indices[__atomic_fetch_add(&rows[b], 1, __ATOMIC_RELAXED)] = (int32_t)a;
        }
    }
}

static int cmp_int32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

void agentsim_csr_sort_rows(const int64_t *rows, int64_t r0, int64_t r1, int32_t *indices, int32_t *lengths) {
    int64_t start = r0 == 0 ? 0 : rows[r0 - 1];  /* after placing, rows[r] is the end of row r */
    for (int64_t r = r0; r < r1; r++) {
        int64_t end = rows[r], len = end - start;
        int32_t *a = indices + start;
        if (len <= 32) {
            for (int64_t i = 1; i < len; i++) {
                int32_t x = a[i];
                int64_t j = i - 1;
                while (j >= 0 && a[j] > x) { a[j + 1] = a[j]; j--; }
                a[j + 1] = x;
            }
        } else {
            qsort(a, (size_t)len, sizeof(int32_t), cmp_int32);
        }
        int64_t kept = 0;
        for (int64_t i = 0; i < len; i++)
            if (i == 0 || a[i] != a[kept - 1]) a[kept++] = a[i];
        lengths[r] = (int32_t)kept;
        start = end;
    }
}

void agentsim_csr_compact(int64_t *rows, int64_t n, int32_t *indices, const int32_t *lengths) {
    int64_t written = 0, start = 0;
    for (int64_t r = 0; r < n; r++) {
        int64_t end = rows[r];
        if (written != start) memmove(indices + written, indices + start, (size_t)lengths[r] * sizeof(int32_t));
        rows[r] = written;
        written += lengths[r];
        start = end;
    }
    rows[n] = written;
}



/* The co-member lists of a group field of k memberships per agent (agentsim/_native/kernels.py:
   co_members, for GroupIndex.co_members): for each agent, the rows of the other memberships of its
   groups, so that a contribution reaches its group-mates in one pass over a short run (a push),
   without a table of every group. The memberships are first listed group by group; the groups
   are then read in turn (sequential reads), each member's row filled at its cursor.
   1. agentsim_group_members(of, m, groups, cursor, k, order): the memberships group by group in
      membership order (a counting sort: cursor[g] starts at group g's first place and is moved
      on; order[cursor[of[p]]++] = p / k; of[p] >= groups: no group, skipped);
   2. agentsim_co_member_degrees(start, groups, order, degree): degree[a] += m - 1 for each
      membership of agent a of a group of m members (degree zeroed by the caller);
   3. the caller makes the rows' starts (indptr) and a copy of them as cursors (rows, n + 1);
   4. agentsim_co_member_place(start, groups, order, rows, indices): for each group, each
      membership's row gets the other memberships' agents (an agent with two memberships of a
      group gets itself once per other membership). A row's entries come group by group.
   One thread each: the lists are the same on every run. */
void agentsim_group_members(const int32_t *of, int64_t m, int64_t groups, int64_t *cursor, int64_t k,
                            int32_t *order) {
    for (int64_t p = 0; p < m; p++) {
        int64_t g = of[p];
        if (p + 16 < m && of[p + 16] < groups) __builtin_prefetch(&cursor[of[p + 16]], 1);
        if (g < groups) order[cursor[g]++] = (int32_t)(p / k);
    }
}

void agentsim_co_member_degrees(const int64_t *start, int64_t groups, const int32_t *order, int64_t *degree) {
    for (int64_t g = 0; g < groups; g++) {
        int64_t a = start[g], b = start[g + 1];
        for (int64_t q = a; q < b; q++) degree[order[q]] += b - a - 1;
    }
}

void agentsim_co_member_place(const int64_t *start, int64_t groups, const int32_t *order, int64_t *rows,
                              int32_t *indices) {
    for (int64_t g = 0; g < groups; g++) {
        int64_t a = start[g], b = start[g + 1];
        if (b - a < 2) continue;
        if (g + 8 < groups && start[g + 9] - start[g + 8] > 1) {
            __builtin_prefetch(&rows[order[start[g + 8]]], 1);
            __builtin_prefetch(&rows[order[start[g + 8] + 1]], 1);
        }
        for (int64_t q = a; q < b; q++) {
            int32_t *out = indices + rows[order[q]];
            for (int64_t r = a; r < b; r++)
                if (r != q) *out++ = order[r];
            rows[order[q]] += b - a - 1;
        }
    }
}

static int strictly_increasing(const int64_t *x, int64_t m) {
    for (int64_t i = 1; i < m; i++)
        if (x[i] <= x[i - 1]) return 0;
    return 1;
}

/* A push kept up to date (GroupIndex.push): `out` holds the push of (old_nodes, old_values) and gets
   that of (new_nodes, new_values), by pushing only each node's change (new minus old), once: to
   itself self_count[node] times, and to each neighbor (int64 wrapping on overflow, as torch's adds:
   exact in any order), so that `out` ends as a push of the new values into zeros would make it.
   The changes are listed first: by merging the node lists where both are strictly increasing (rows
   found by nonzero: a node in both lists gives one entry, new minus old, 0 if unchanged), else
   through scratch (n_nodes, zero on entry and on return), which adds up each node's entries
   (repeats too) so that each node pushes once; then they are pushed, prefetched as
   agentsim_push_count.
   Returns 0; 1 + the position of the first node outside [0, n_nodes), the old nodes first, then
   m_old + the new ones' (nothing is changed then); -1 without memory for the list of changes; or
   -2 where scratch is needed and NULL (nothing is changed). */
int64_t agentsim_push_changes(const int64_t *indptr, const int32_t *indices, int64_t n_nodes,
                              const int64_t *old_nodes, const int64_t *old_values, int64_t m_old,
                              const int64_t *new_nodes, const int64_t *new_values, int64_t m_new,
                              const int64_t *self_count, int64_t *scratch, int64_t *out) {
    for (int64_t i = 0; i < m_old; i++)
        if (old_nodes[i] < 0 || old_nodes[i] >= n_nodes) return i + 1;
    for (int64_t i = 0; i < m_new; i++)
        if (new_nodes[i] < 0 || new_nodes[i] >= n_nodes) return m_old + i + 1;
    int merge = strictly_increasing(old_nodes, m_old) && strictly_increasing(new_nodes, m_new);
    if (!merge && scratch == NULL) return -2;
    int64_t *nodes = (int64_t *)malloc((size_t)(m_old + m_new + 1) * 2 * sizeof(int64_t));
    if (nodes == NULL) return -1;
    uint64_t *changes = (uint64_t *)(nodes + m_old + m_new + 1), v;
    int64_t c = 0;
    if (merge) {
        int64_t i = 0, j = 0;
        while (i < m_old || j < m_new) {
            if (j == m_new || (i < m_old && old_nodes[i] < new_nodes[j])) {
                nodes[c] = old_nodes[i];
                v = 0 - (uint64_t)old_values[i++];
            } else if (i == m_old || new_nodes[j] < old_nodes[i]) {
                nodes[c] = new_nodes[j];
                v = (uint64_t)new_values[j++];
            } else {
                nodes[c] = new_nodes[j];
                v = (uint64_t)new_values[j++] - (uint64_t)old_values[i++];
            }
            changes[c] = v;
            c += v != 0;
        }
    } else {
        uint64_t *change = (uint64_t *)scratch;
        for (int64_t i = 0; i < m_old; i++) change[old_nodes[i]] -= (uint64_t)old_values[i];
        for (int64_t i = 0; i < m_new; i++) change[new_nodes[i]] += (uint64_t)new_values[i];
        for (int64_t pass = 0; pass < 2; pass++) {
            const int64_t *list = pass ? new_nodes : old_nodes;
            int64_t m = pass ? m_new : m_old;
            for (int64_t i = 0; i < m; i++) {
                nodes[c] = list[i];
                changes[c] = change[list[i]];  /* 0: unchanged, or listed already */
                change[list[i]] = 0;
                c += changes[c] != 0;
            }
        }
    }
    for (int64_t i = 0; i < c; i++) {
        if (i + 16 < c) __builtin_prefetch(&indptr[nodes[i + 16]]);
        if (i + 8 < c) {
            const int32_t *p = &indices[indptr[nodes[i + 8]]];
            __builtin_prefetch(p);
            __builtin_prefetch(p + 16);
        }
        int64_t node = nodes[i];
        v = changes[i];
        out[node] = (int64_t)((uint64_t)out[node] + v * (uint64_t)self_count[node]);
        for (int64_t e = indptr[node], b = indptr[node + 1]; e < b; e++)
            out[indices[e]] = (int64_t)((uint64_t)out[indices[e]] + v);
    }
    free(nodes);
    return 0;
}

/* out[i] = src[i], or 0 where only[i] is 0 (src may be out: a pass that vectorizes, where masked_fill_
   takes 5 times as long) */
void agentsim_keep_only(int64_t *out, const int64_t *src, const uint8_t *only, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = src[i] & -(int64_t)(only[i] != 0);
}

/* out[i] = sum over c < k, in order from 0.0, of (double)srcs[c][i] * scales[c] (each product and
   addition rounded in float64), or 0.0 where only (may be NULL) is 0: several [n] int64 sums as one
   float64 total (GroupSums.weighted). Column by column over blocks that stay in the cache, so that
   each pass vectorizes; each row's terms are still added in column order. */
void agentsim_scaled_total(double *out, const int64_t *const *srcs, const double *scales, int64_t k,
                           const uint8_t *only, int64_t n) {
    for (int64_t a = 0; a < n; a += 1024) {
        const int64_t b = a + 1024 < n ? a + 1024 : n;
        for (int64_t i = a; i < b; i++) out[i] = 0.0;
        for (int64_t c = 0; c < k; c++) {
            const int64_t *x = srcs[c];
            const double w = scales[c];
            for (int64_t i = a; i < b; i++) out[i] = out[i] + (double)x[i] * w;
        }
        if (only)
            for (int64_t i = a; i < b; i++) out[i] = only[i] ? out[i] : 0.0;
    }
}
