/* Putting windows into the suffix tree: whole finished sequences (every window walked from
 * the root once, its weight added to each edge it enters), and live streams (each window of
 * the last max_depth positions advances one token per appended token; a window on its own
 * growing leaf costs nothing). */
#include "stree.h"

static inline int open_live(const STree *t, int32_t v) {
    return st_open(t, v) && t->seqs[t->nodes[v].seq].stream >= 0 && st_dep(t, v) < t->max_depth;
}

/* The window seq[i .. i+L) of a finished sequence, weight w. */
static int insert_window(STree *t, int32_t s, int32_t i, int32_t L, double w) {
    const int32_t *tk = t->seqs[s].tok + i;
    int32_t u = 0, k = 0;
    for (;;) {
        if (k == L) return 0; /* ended at u, already counted there */
        int32_t c = st_child(t, u, tk[k]);
        if (c < 0) return st_new_leaf(t, u, s, i, tk[k], w, 0) < 0 ? -1 : 0;
        int32_t dc = st_dep(t, c);
        if (open_live(t, c) && L >= dc) st_close_leaf(t, c); /* it will need c's end point */
        const int32_t *et = t->seqs[t->nodes[c].seq].tok + t->nodes[c].off;
        int32_t lim = dc < L ? dc : L, j = k + 1;
        while (j < lim && et[j] == tk[j]) j++;
        if (j < dc) { /* ends or leaves the edge at depth j */
            int32_t m = st_split(t, c, j);
            if (m < 0) return -1;
            t->nodes[m].F += w;
            st_enter(t, m, w);
            if (j == L) return 0;
            return st_new_leaf(t, m, s, i, tk[j], w, 0) < 0 ? -1 : 0;
        }
        t->nodes[c].F += w;
        st_enter(t, c, w);
        u = c; k = dc;
    }
}

/* Every window of the finished sequence s (its tokens already pushed). */
int st_add_windows(STree *t, int32_t s) {
    int32_t n = t->seqs[s].len, D = t->max_depth;
    double w = t->seqs[s].weight;
    for (int32_t i = 0; i < n; i++) {
        if (st_reserve(t, 2) < 0) return -1;
        if (insert_window(t, s, i, n - i < D ? n - i : D, w) < 0) return -1;
    }
    t->tokens += n;
    return 0;
}

/* ---------- live streams ---------- */

int st_stream_open(STree *t, int32_t s) {
    int32_t D = t->max_depth, b = t->freeblock;
    if (b >= 0) {
        t->freeblock = t->wins[(size_t)b * D].next;
    } else {
        if (t->nblocks == t->blockcap) {
            int32_t cap = t->blockcap < 4 ? 4 : t->blockcap * 2;
            Win *w = PyMem_RawRealloc(t->wins, sizeof(Win) * (size_t)cap * D);
            if (!w) { PyErr_NoMemory(); return -1; }
            t->wins = w; t->blockcap = cap;
        }
        b = t->nblocks++;
    }
    if (st_flight_room(t, (int64_t)(t->live + 1) * D) < 0) return -1;
    memset(&t->wins[(size_t)b * D], 0, sizeof(Win) * (size_t)D);
    t->seqs[s].stream = b;
    t->live++;
    return 0;
}

/* Create the owner leaf of window `slot` under u (the window is at u's end). */
static int grow_leaf(STree *t, int32_t slot, int32_t u, int32_t x) {
    Win *w = &t->wins[slot];
    int32_t leaf = st_new_leaf(t, u, w->seq, w->start, x, 1.0, 1);
    if (leaf < 0) return -1;
    w = &t->wins[slot];
    w->state = W_OWNER; w->node = leaf; w->depth++;
    return 0;
}

/* Window `slot` (a walker) takes the next token x. */
static int walk_step(STree *t, int32_t slot, int32_t x) {
    Win *w = &t->wins[slot];
    int32_t v = w->node, d = w->depth, dv = st_dep(t, v), D = t->max_depth;
    if (d < dv) { /* inside the edge into v */
        if (st_tok(t, v, d) != x) {
            int32_t m = st_split(t, v, d); /* the window now ends at m */
            return m < 0 ? -1 : grow_leaf(t, slot, m, x);
        }
        w->depth = ++d;
        if (d == dv) {
            if (open_live(t, v)) st_close_leaf(t, v);
            st_flight_remove(t, v, slot); /* at v's end now: F[v] counted it already */
        }
        return 0;
    }
    int32_t c = st_child(t, v, x);
    if (c < 0) return grow_leaf(t, slot, v, x);
    int32_t dc = st_dep(t, c);
    if (dc == d + 1) {
        if (open_live(t, c) && dc < D) st_close_leaf(t, c);
    } else {
        st_flight_push(t, c, slot);
    }
    t->nodes[c].F += 1.0;
    st_enter(t, c, 1.0);
    w = &t->wins[slot];
    w->node = c; w->depth = d + 1;
    return 0;
}

/* The last token of live sequence s was just pushed: advance every open window by it. */
int st_stream_step(STree *t, int32_t s) {
    int32_t D = t->max_depth, N = t->seqs[s].len, x = t->seqs[s].tok[N - 1];
    size_t base = (size_t)t->seqs[s].stream * D;
    if (st_reserve(t, 2 * D + 2) < 0) return -1; /* so nothing below can fail half-way */
    int32_t first = N - D > 0 ? N - D : 0;
    for (int32_t i = first; i < N; i++) {
        int32_t slot = (int32_t)(base + i % D);
        Win *w = &t->wins[slot];
        if (i == N - 1) {
            w->state = W_WALK; w->node = 0; w->depth = 0; w->prev = w->next = -1;
            w->seq = s; w->start = i;
        }
        if (w->state == W_WALK && walk_step(t, slot, x) < 0) return -1;
        w = &t->wins[slot];
        if (N - i == D) w->state = W_FREE; /* full length: this window is complete */
    }
    t->tokens++;
    return 0;
}

/* Append k tokens to a live stream, every window ending at each of them put in at once. */
int st_stream_append(Stream *s, const int32_t *toks, Py_ssize_t k) {
    for (Py_ssize_t i = 0; i < k; i++)
        if (st_seq_push(s->tree, s->seq, toks + i, 1) < 0 || st_stream_step(s->tree, s->seq) < 0) return -1;
    return 0;
}

/* The live sequence s is finished: windows ending inside an edge get a node of their own. */
int st_stream_close(STree *t, int32_t s) {
    int32_t D = t->max_depth, b = t->seqs[s].stream;
    if (b < 0) return 0;
    size_t base = (size_t)b * D;
    if (st_reserve(t, D) < 0) return -1;
    for (int32_t k = 0; k < D; k++) {
        Win *w = &t->wins[base + k];
        if (w->state == W_WALK && w->depth < st_dep(t, w->node) && st_split(t, w->node, w->depth) < 0)
            return -1;
        t->wins[base + k].state = W_FREE;
    }
    t->seqs[s].stream = -1;
    t->wins[base].next = t->freeblock;
    t->freeblock = b;
    t->live--;
    return 0;
}
