/* Reading the suffix tree: locating a path, counts, the match of the context's tail, the
 * greedy draft and the best-first draft tree (the rules of docs/cache.md, "Drafting").
 * A locus is (node v, depth d) with dep(parent) < d <= dep(v): the end of v when d == dep(v),
 * else a point inside the edge into v, whose only continuation is the edge's next token. */
#include "stree.h"

/* The locus of toks[0..k) (node in *v, depth k); 0 when the path is absent. */
static int locate(const STree *t, const int32_t *toks, Py_ssize_t k, int32_t *v) {
    int32_t u = 0;
    Py_ssize_t d = 0;
    while (d < k) {
        int32_t c = st_child(t, u, toks[d]);
        if (c < 0) return 0;
        Py_ssize_t dc = st_dep(t, c), lim = dc < k ? dc : k;
        const int32_t *et = t->seqs[t->nodes[c].seq].tok + t->nodes[c].off;
        for (Py_ssize_t j = d + 1; j < lim; j++)
            if (et[j] != toks[j]) return 0;
        u = c; d = lim;
    }
    *v = u;
    return 1;
}

static inline int has_children(const STree *t, int32_t v, Py_ssize_t d) {
    return d < st_dep(t, v) || t->nodes[v].first_child >= 0;
}

double st_count(const STree *t, const int32_t *toks, Py_ssize_t k) {
    if (k == 0) return t->nodes[0].childsum;
    int32_t v;
    if (k > t->max_depth || !locate(t, toks, k, &v)) return 0.0;
    double c = t->nodes[v].F;
    const Flight *e = st_flight(t, v); /* less the live windows ending above this point (all of
                                        * those in flight, at v's end) */
    for (int32_t w = e ? e->head : -1; w >= 0; w = t->wins[w].next)
        if (t->wins[w].depth < k) c -= 1.0;
    return c;
}

Py_ssize_t st_match_cap(const STree *t, Py_ssize_t budget) {
    Py_ssize_t half = t->max_depth / 2, room = budget < half ? budget : half;
    if (room < 1) room = 1;
    return t->max_depth - room;
}

/* The longest tail of ctx[0..k), at most `cap` tokens, whose locus has children (monotone in
 * the length: every suffix of a stored path is stored), by binary search. Depth 0: none. */
Py_ssize_t st_match(const STree *t, const int32_t *ctx, Py_ssize_t k, Py_ssize_t cap, int32_t *node) {
    Py_ssize_t lo = 0, hi = cap < k ? cap : k;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi + 1) / 2;
        int32_t v;
        if (locate(t, ctx + k - mid, mid, &v) && has_children(t, v, mid)) { lo = mid; *node = v; }
        else hi = mid - 1;
    }
    return lo;
}

/* C of child c under node v: 1 for an only child (as count / itself), else F / child sum. */
static inline double cond(const STree *t, int32_t v, int32_t c) {
    const SNode *nd = t->nodes;
    if (nd[v].first_child == c && nd[c].next_sibling < 0) return 1.0;
    return st_F(t, c) / nd[v].childsum;
}

/* The match of a live stream's own sequence, read off its windows: the window starting L
 * tokens before the end holds the locus of the tail of length L, so no lookups are needed. */
Py_ssize_t st_stream_match(const STree *t, int32_t s, Py_ssize_t cap, int32_t *node) {
    int32_t D = t->max_depth, N = t->seqs[s].len;
    const Win *base = t->wins + (size_t)t->seqs[s].stream * D;
    Py_ssize_t lo = 0, hi = cap < N ? cap : N;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi + 1) / 2;
        const Win *w = &base[(N - mid) % D];
        if (has_children(t, w->node, mid)) { lo = mid; *node = w->node; }
        else hi = mid - 1;
    }
    return lo;
}

/* The match of a stream's own sequence for a draft of `budget`: read off its windows while it
 * is live, matched the ordinary way after close. */
Py_ssize_t st_stream_locus(const Stream *s, Py_ssize_t budget, int32_t *node) {
    const STree *t = s->tree;
    const Seq *q = &t->seqs[s->seq];
    Py_ssize_t cap = st_match_cap(t, budget);
    if (!s->closed) return st_stream_match(t, s->seq, cap, node);
    Py_ssize_t k = q->len < cap ? q->len : cap;
    return k ? st_match(t, q->tok + q->len - k, k, cap, node) : 0;
}

/* The greedy draft from locus (v, m) into toks/probs (room for `budget`); how many tokens.
 * m = 0: nothing matched. */
Py_ssize_t st_draft_path(const STree *t, int32_t v, Py_ssize_t m, Py_ssize_t budget, double min_prob,
                         int32_t *toks, double *probs) {
    Py_ssize_t d = m, i = 0;
    double score = 1.0;
    for (; m > 0 && i < budget && has_children(t, v, d); i++) {
        int32_t tok, next = v;
        double c = 1.0;
        if (d < st_dep(t, v)) {
            tok = st_tok(t, v, (int32_t)d);
        } else {
            next = t->nodes[v].best;
            c = cond(t, v, next);
            tok = t->nodes[next].ftok;
        }
        score *= c;
        if (score < min_prob) break;
        toks[i] = tok; probs[i] = c;
        v = next; d++;
    }
    return i;
}

/* The greedy draft from locus (v, m) as (tokens, probs, match_len). */
PyObject *st_draft(STree *t, int32_t v, Py_ssize_t m, Py_ssize_t budget, double min_prob) {
    Py_ssize_t room = m > 0 ? budget : 0;
    int32_t *toks = PyMem_RawMalloc(sizeof(int32_t) * (size_t)(room ? room : 1));
    double *probs = PyMem_RawMalloc(sizeof(double) * (size_t)(room ? room : 1));
    PyObject *tl = NULL, *pl = NULL;
    if (!toks || !probs) { PyErr_NoMemory(); goto done; }
    Py_ssize_t n = st_draft_path(t, v, m, room, min_prob, toks, probs);
    tl = PyList_New(n); pl = PyList_New(n);
    for (Py_ssize_t i = 0; tl && pl && i < n; i++) {
        PyObject *x = PyLong_FromLong(toks[i]), *y = PyFloat_FromDouble(probs[i]);
        if (!x || !y) { Py_XDECREF(x); Py_XDECREF(y); Py_CLEAR(tl); break; }
        PyList_SET_ITEM(tl, i, x); PyList_SET_ITEM(pl, i, y);
    }
done:
    PyMem_RawFree(toks); PyMem_RawFree(probs);
    if (!tl || !pl) { Py_XDECREF(tl); Py_XDECREF(pl); return NULL; }
    return Py_BuildValue("(NNn)", tl, pl, m);
}
