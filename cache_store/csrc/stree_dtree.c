/* The best-first draft tree over the suffix tree: a priority queue of candidate loci ordered
 * by path score (ties: pushed first), a locus's children pushed in the greedy order (higher
 * count, then lower token), exactly the rules of the token tree (docs/cache.md, "Drafting"). */
#include "stree.h"

typedef struct { double score, c; uint64_t seq; int32_t node, depth, parent, tok; } Cand;

static inline int cand_before(const Cand *a, const Cand *b) {
    return a->score > b->score || (a->score == b->score && a->seq < b->seq);
}

static void heap_push(Cand *h, Py_ssize_t *n, Cand x) {
    Py_ssize_t i = (*n)++;
    while (i > 0) {
        Py_ssize_t p = (i - 1) / 2;
        if (!cand_before(&x, &h[p])) break;
        h[i] = h[p]; i = p;
    }
    h[i] = x;
}

static Cand heap_pop(Cand *h, Py_ssize_t *n) {
    Cand top = h[0], x = h[--(*n)];
    Py_ssize_t i = 0;
    for (;;) {
        Py_ssize_t l = 2 * i + 1, r = l + 1, b = i;
        const Cand *cb = &x;
        if (l < *n && cand_before(&h[l], cb)) { b = l; cb = &h[l]; }
        if (r < *n && cand_before(&h[r], cb)) { b = r; }
        if (b == i) break;
        h[i] = h[b]; i = b;
    }
    if (*n > 0) h[i] = x;
    return top;
}

static const STree *sort_tree; /* qsort has no context argument; the GIL serialises its use */
static int by_count_then_token(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    double fx = st_F(sort_tree, x), fy = st_F(sort_tree, y);
    if (fx != fy) return fx > fy ? -1 : 1;
    int32_t tx = sort_tree->nodes[x].ftok, ty = sort_tree->nodes[y].ftok;
    return (tx > ty) - (tx < ty);
}

typedef struct { Cand *h; Py_ssize_t hn, hcap; int32_t *kids; Py_ssize_t kcap; uint64_t seq; } Queue;

static int grow(void **p, Py_ssize_t *cap, Py_ssize_t need, size_t size) {
    if (need <= *cap) return 0;
    Py_ssize_t c = need * 2 + 16;
    void *q = PyMem_RawRealloc(*p, size * (size_t)c);
    if (!q) { PyErr_NoMemory(); return -1; }
    *p = q; *cap = c;
    return 0;
}

/* Push the children of locus (v, d) whose path score stays >= min_prob, best first, at most
 * `limit` (a child ranked below `limit` siblings can never be emitted within the budget). */
static int push_children(const STree *t, int32_t v, int32_t d, double score, int32_t parent,
                         double min_prob, Py_ssize_t limit, Queue *q) {
    const SNode *nd = t->nodes;
    if (d < st_dep(t, v)) { /* inside an edge: one child, C = 1 */
        if (score < min_prob || limit < 1) return 0;
        if (grow((void **)&q->h, &q->hcap, q->hn + 1, sizeof(Cand)) < 0) return -1;
        Cand x = {score, 1.0, q->seq++, v, d + 1, parent, st_tok(t, v, d)};
        heap_push(q->h, &q->hn, x);
        return 0;
    }
    int only = nd[v].first_child >= 0 && nd[nd[v].first_child].next_sibling < 0;
    Py_ssize_t nk = 0;
    for (int32_t c = nd[v].first_child; c >= 0; c = nd[c].next_sibling) {
        double cc = only ? 1.0 : st_F(t, c) / nd[v].childsum;
        if (score * cc < min_prob) continue;
        if (grow((void **)&q->kids, &q->kcap, nk + 1, sizeof(int32_t)) < 0) return -1;
        q->kids[nk++] = c;
    }
    if (nk == 0) return 0;
    sort_tree = t;
    qsort(q->kids, (size_t)nk, sizeof(int32_t), by_count_then_token);
    if (nk > limit) nk = limit;
    if (grow((void **)&q->h, &q->hcap, q->hn + nk, sizeof(Cand)) < 0) return -1;
    for (Py_ssize_t i = 0; i < nk; i++) {
        int32_t c = q->kids[i];
        double cc = only ? 1.0 : st_F(t, c) / nd[v].childsum;
        Cand x = {score * cc, cc, q->seq++, c, d + 1, parent, nd[c].ftok};
        heap_push(q->h, &q->hn, x);
    }
    return 0;
}

void st_dtree_free(DTree *d) {
    PyMem_RawFree(d->tok); PyMem_RawFree(d->par); PyMem_RawFree(d->c); PyMem_RawFree(d->ph);
}

/* The best-first draft tree from locus (v, m), at most `budget` nodes; m = 0: nothing matched. */
int st_dtree_build(const STree *t, int32_t v, Py_ssize_t m, Py_ssize_t budget, double min_prob, DTree *d) {
    Queue q = {0};
    int rc = -1;
    d->n = 0;
    d->tok = PyMem_RawMalloc(sizeof(int32_t) * (size_t)(budget + 1));
    d->par = PyMem_RawMalloc(sizeof(int32_t) * (size_t)(budget + 1));
    d->c = PyMem_RawMalloc(sizeof(double) * (size_t)(budget + 1));
    d->ph = PyMem_RawMalloc(sizeof(float) * (size_t)(budget + 1));
    if (!d->tok || !d->par || !d->c || !d->ph) { PyErr_NoMemory(); goto done; }
    if (m > 0 && budget > 0 && push_children(t, v, (int32_t)m, 1.0, -1, min_prob, budget, &q) < 0) goto done;
    while (q.hn > 0 && d->n < budget) {
        Cand x = heap_pop(q.h, &q.hn);
        d->tok[d->n] = x.tok; d->par[d->n] = x.parent; d->c[d->n] = x.c;
        d->ph[d->n] = st_prob(t, x.node, x.depth);
        d->n++;
        if (d->n < budget &&
            push_children(t, x.node, x.depth, x.score, (int32_t)(d->n - 1), min_prob, budget - d->n, &q) < 0)
            goto done;
    }
    rc = 0;
done:
    PyMem_RawFree(q.h); PyMem_RawFree(q.kids);
    return rc;
}

PyObject *st_draft_tree(STree *t, int32_t v, Py_ssize_t m, Py_ssize_t budget, double min_prob) {
    DTree d;
    PyObject *toks = NULL, *pars = NULL, *probs = NULL;
    if (st_dtree_build(t, v, m, budget, min_prob, &d) < 0) goto fail;
    toks = PyList_New(d.n); pars = PyList_New(d.n); probs = PyList_New(d.n);
    if (!toks || !pars || !probs) goto fail;
    for (Py_ssize_t i = 0; i < d.n; i++) {
        PyObject *a = PyLong_FromLong(d.tok[i]), *b = PyLong_FromLong(d.par[i]), *c = PyFloat_FromDouble(d.c[i]);
        if (!a || !b || !c) { Py_XDECREF(a); Py_XDECREF(b); Py_XDECREF(c); goto fail; }
        PyList_SET_ITEM(toks, i, a); PyList_SET_ITEM(pars, i, b); PyList_SET_ITEM(probs, i, c);
    }
    st_dtree_free(&d);
    return Py_BuildValue("(NNNn)", toks, pars, probs, m);
fail:
    st_dtree_free(&d);
    Py_XDECREF(toks); Py_XDECREF(pars); Py_XDECREF(probs);
    return NULL;
}

/* ---------- a row's draft trees: its streams, the picked one first ---------- */

/* 0 if `streams` is a non-empty tuple of streams, `size` (budget, nodes) >= 0 and min_prob not
 * NaN; -1 with a ValueError naming `fn` otherwise. */
int st_check_row(PyObject *streams, Py_ssize_t size, double min_prob, const char *fn) {
    if (!st_is_streams(streams) || PyTuple_GET_SIZE(streams) == 0) {
        PyErr_Format(PyExc_ValueError, "%s needs a non-empty tuple of streams", fn);
        return -1;
    }
    if (size < 0 || isnan(min_prob)) {
        PyErr_Format(PyExc_ValueError, "%s: the size must be >= 0 and min_prob not NaN", fn);
        return -1;
    }
    return 0;
}

/* The stream `draft_many` would draft from for a row with room for `room` tokens
 * (`st_best_stream`); -1 with an exception set. */
Py_ssize_t st_pick_stream(PyObject *streams, Py_ssize_t room, double min_prob) {
    int32_t *toks = PyMem_RawMalloc(sizeof(int32_t) * 2 * (size_t)room);
    double *probs = PyMem_RawMalloc(sizeof(double) * 2 * (size_t)room);
    Py_ssize_t n, pick = -1;
    if (!toks || !probs) PyErr_NoMemory();
    else pick = st_best_stream(streams, room, min_prob, toks, probs, &n);
    PyMem_RawFree(toks); PyMem_RawFree(probs);
    return pick;
}

/* pick_stream(streams, room, min_prob) -> the index of the stream a row drafts from: the one
 * rule every draft uses (`st_best_stream`), for the greedy drafts Python makes one stream at a
 * time; 0 when there is no room. */
PyObject *st_pick_stream_py(PyObject *self, PyObject *args) {
    PyObject *streams;
    Py_ssize_t room;
    double min_prob;
    if (!PyArg_ParseTuple(args, "O!nd", &PyTuple_Type, &streams, &room, &min_prob)) return NULL;
    if (st_check_row(streams, room, min_prob, "pick_stream") < 0) return NULL;
    Py_ssize_t pick = room == 0 ? 0 : st_pick_stream(streams, room, min_prob);
    return pick < 0 ? NULL : PyLong_FromSsize_t(pick);
}

/* The best-first draft trees of a row's first `nt` streams, of at most `budget` nodes each, in
 * the order its drafts use them (`st_picked_first`); -1 with an exception set, nothing left to
 * free. */
int st_row_dtrees(PyObject *streams, Py_ssize_t pick, Py_ssize_t nt, Py_ssize_t budget, double min_prob, DTree *d) {
    for (Py_ssize_t k = 0; k < nt; k++) {
        const Stream *s = st_picked_first(streams, pick, k);
        int32_t v = 0;
        Py_ssize_t m = st_stream_locus(s, budget, &v);
        if (st_dtree_build(s->tree, v, m, budget, min_prob, &d[k]) < 0) {
            for (Py_ssize_t i = 0; i <= k; i++) st_dtree_free(&d[i]);
            return -1;
        }
    }
    return 0;
}

/* ---------- a draft sampled from the tree ---------- */

/* The children of `node` (their indices into kid, nk of them; kid has room for d->n), their
 * weights in w and the running sums in cum: their frequencies, or with `stop` their p-hats when
 * every child's is known (*by_p set). Children of p-hat 0 (tool output) are left out then. */
static Py_ssize_t children(const DTree *d, Py_ssize_t node, int stop, int32_t *kid, double *w, double *cum,
                           int *by_p) {
    Py_ssize_t nk = 0;
    *by_p = stop;
    for (Py_ssize_t i = node + 1; i < d->n; i++)
        if (d->par[i] == node) {
            kid[nk++] = (int32_t)i;
            if (isnan(d->ph[i])) *by_p = 0;
        }
    double acc = 0.0;
    Py_ssize_t kept = 0;
    for (Py_ssize_t j = 0; j < nk; j++) {
        double x = *by_p ? (double)d->ph[kid[j]] : d->c[kid[j]];
        if (*by_p && x <= 0.0) continue;
        acc += x;
        kid[kept] = kid[j]; w[kept] = x; cum[kept++] = acc;
    }
    return kept;
}

/* Which of nk children to take, drawn as Python's random.choices draws (one random() per pick
 * against the running sums scaled to `total`, bisect right); nk when the draw falls past the
 * children (stop: total > their sum); -1 with an exception set if random() fails. */
static Py_ssize_t draw(PyObject *random, const double *cum, Py_ssize_t nk, double total) {
    PyObject *u = PyObject_CallNoArgs(random);
    if (!u) return -1;
    double x = PyFloat_AsDouble(u) * total;
    Py_DECREF(u);
    if (PyErr_Occurred()) return -1;
    if (x >= cum[nk - 1]) return total > cum[nk - 1] ? nk : nk - 1;
    Py_ssize_t lo = 0, hi = nk - 1;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (x < cum[mid]) hi = mid; else lo = mid + 1;
    }
    return lo;
}

/* {token: weight / total} over the nk tokens offered. */
static PyObject *token_dist(const int32_t *tok, const double *w, Py_ssize_t nk, double total) {
    PyObject *dist = PyDict_New();
    for (Py_ssize_t j = 0; dist && j < nk; j++) {
        PyObject *k = PyLong_FromLong(tok[j]), *q = PyFloat_FromDouble(w[j] / total);
        if (!k || !q || PyDict_SetItem(dist, k, q) < 0) Py_CLEAR(dist);
        Py_XDECREF(k); Py_XDECREF(q);
    }
    return dist;
}

/* The child of `node` in d holding token x, or -1. */
static Py_ssize_t child_with(const DTree *d, Py_ssize_t node, int32_t x) {
    for (Py_ssize_t c = node + 1; c < d->n; c++)
        if (d->par[c] == node && d->tok[c] == x) return c;
    return -1;
}

#define WALK_TREES 4 /* streams walked at most (a row has two: its prompt's tree and the run-wide one) */

/* With `stop`, the mass `rest` the leading tree's p-hats leave goes to the other trees still on
 * the drawn path: their children at their nodes with a known p-hat > 0 and a token not offered
 * yet, by p-hat, scaled down together if they would pass `rest`. Appended to tok/w/cum. */
static Py_ssize_t offer_rest(const DTree *d, const Py_ssize_t *node, const int *on, Py_ssize_t nt,
                             Py_ssize_t lead, int32_t *tok, double *w, double *cum, Py_ssize_t nk, double rest) {
    Py_ssize_t first = nk;
    double sum = 0.0;
    for (Py_ssize_t i = 0; i < nt; i++) {
        if (i == lead || !on[i]) continue;
        for (Py_ssize_t c = node[i] + 1; c < d[i].n; c++) {
            if (d[i].par[c] != node[i] || !(d[i].ph[c] > 0.0f)) continue; /* NaN fails too */
            Py_ssize_t k = 0;
            while (k < nk && tok[k] != d[i].tok[c]) k++;
            if (k < nk) continue;
            tok[nk] = d[i].tok[c]; w[nk] = d[i].ph[c]; sum += w[nk]; nk++;
        }
    }
    double scale = sum > rest ? rest / sum : 1.0;
    for (Py_ssize_t k = first; k < nk; k++) { w[k] *= scale; cum[k] = cum[k - 1] + w[k]; }
    return nk;
}

/* Walk draft trees of 4 x budget nodes from their roots, sampling each token: the picked
 * stream's tree (tree 0) leads; with `stop`, the row's other streams' trees (in order) are
 * walked along the same tokens, offer their children for the mass tree 0's p-hats leave, and
 * lead once tree 0 is off the drawn path or has no children there. */
static PyObject *sample_walk(PyObject *streams, Py_ssize_t pick, Py_ssize_t budget, double min_prob, int stop,
                             PyObject *random) {
    Py_ssize_t nt = stop ? PyTuple_GET_SIZE(streams) : 1, room = 1, built = 0;
    if (nt > WALK_TREES) nt = WALK_TREES;
    DTree d[WALK_TREES];
    Py_ssize_t node[WALK_TREES];
    int on[WALK_TREES];
    int32_t *kid = NULL, *tok = NULL;
    double *cum = NULL, *w = NULL;
    PyObject *toks = PyList_New(0), *qs = PyList_New(0), *dists = PyList_New(0);
    if (!toks || !qs || !dists || st_row_dtrees(streams, pick, nt, 4 * budget, min_prob, d) < 0) goto fail;
    for (; built < nt; built++) {
        node[built] = -1; on[built] = 1;
        room += d[built].n;
    }
    kid = PyMem_RawMalloc(sizeof(int32_t) * (size_t)room);
    tok = PyMem_RawMalloc(sizeof(int32_t) * (size_t)room);
    cum = PyMem_RawMalloc(sizeof(double) * (size_t)room);
    w = PyMem_RawMalloc(sizeof(double) * (size_t)room);
    if (!kid || !tok || !cum || !w) { PyErr_NoMemory(); goto fail; }
    for (Py_ssize_t got = 0; got < budget; got++) {
        Py_ssize_t nk = 0, lead = 0;
        int by_p = 0;
        for (; lead < nt; lead++) /* the first tree on the path with children there leads */
            if (on[lead] && (nk = children(&d[lead], node[lead], stop, kid, w, cum, &by_p)) > 0) break;
        if (nk == 0) break;
        for (Py_ssize_t j = 0; j < nk; j++) tok[j] = d[lead].tok[kid[j]];
        if (by_p && cum[nk - 1] < 1.0) nk = offer_rest(d, node, on, nt, lead, tok, w, cum, nk, 1.0 - cum[nk - 1]);
        double total = by_p && cum[nk - 1] < 1.0 ? 1.0 : cum[nk - 1]; /* 1 - the sum: stop */
        Py_ssize_t j = draw(random, cum, nk, total);
        if (j < 0) goto fail;
        PyObject *dist = token_dist(tok, w, nk, total);
        if (!dist || PyList_Append(dists, dist) < 0) { Py_XDECREF(dist); goto fail; }
        Py_DECREF(dist);
        if (j == nk) break; /* drew the stop: the dist above is the last, with no token */
        PyObject *tk = PyLong_FromLong(tok[j]), *q = PyFloat_FromDouble(w[j] / total);
        int bad = !tk || !q || PyList_Append(toks, tk) < 0 || PyList_Append(qs, q) < 0;
        Py_XDECREF(tk); Py_XDECREF(q);
        if (bad) goto fail;
        for (Py_ssize_t i = 0; i < nt; i++) /* every tree on the path follows the token or leaves it */
            if (on[i]) on[i] = (node[i] = child_with(&d[i], node[i], tok[j])) >= 0;
    }
    for (Py_ssize_t i = 0; i < built; i++) st_dtree_free(&d[i]);
    PyMem_RawFree(kid); PyMem_RawFree(tok); PyMem_RawFree(cum); PyMem_RawFree(w);
    return Py_BuildValue("(NNN)", toks, qs, dists);
fail:
    for (Py_ssize_t i = 0; i < built; i++) st_dtree_free(&d[i]);
    PyMem_RawFree(kid); PyMem_RawFree(tok); PyMem_RawFree(cum); PyMem_RawFree(w);
    Py_XDECREF(toks); Py_XDECREF(qs); Py_XDECREF(dists);
    return NULL;
}

/* sample_draft(streams, budget, min_prob, random, stop=False): the stream `draft_many` would
 * pick for this row drafts; its draft tree of 4 x budget nodes is walked from the root, each
 * child drawn in proportion to its frequency among its siblings with `random()` (Python's
 * random.choices rule), for at most `budget` tokens. With `stop`, a node whose children all
 * have a known p-hat draws them by p-hat instead, the row's other streams' draft trees offer
 * theirs for the mass those leave (`offer_rest`), and what is still left ends the draft.
 * Returns (tokens, q of each, the distribution each was drawn from as {token: q}); a draft
 * that ended by drawing the stop has one distribution more than tokens. */
PyObject *st_sample_draft(PyObject *self, PyObject *args) {
    PyObject *streams, *random;
    Py_ssize_t budget;
    double min_prob;
    int stop = 0;
    if (!PyArg_ParseTuple(args, "O!ndO|p", &PyTuple_Type, &streams, &budget, &min_prob, &random, &stop)) return NULL;
    if (st_check_row(streams, budget, min_prob, "sample_draft") < 0) return NULL;
    if (!PyCallable_Check(random)) {
        PyErr_SetString(PyExc_ValueError, "sample_draft needs a callable");
        return NULL;
    }
    if (budget == 0) return Py_BuildValue("([][][])");
    Py_ssize_t pick = st_pick_stream(streams, budget, min_prob);
    return pick < 0 ? NULL : sample_walk(streams, pick, budget, min_prob, stop, random);
}
