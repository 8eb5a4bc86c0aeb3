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
    void *q = PyMem_Realloc(*p, size * (size_t)c);
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

/* The best-first draft tree from locus (v, m); m = 0: nothing matched. */
PyObject *st_draft_tree(STree *t, int32_t v, Py_ssize_t m, Py_ssize_t budget, double min_prob) {
    PyObject *toks = PyList_New(0), *pars = PyList_New(0), *probs = PyList_New(0);
    Queue q = {0};
    Py_ssize_t emitted = 0;
    if (!toks || !pars || !probs) goto fail;
    if (m > 0 && budget > 0 && push_children(t, v, (int32_t)m, 1.0, -1, min_prob, budget, &q) < 0) goto fail;
    while (q.hn > 0 && emitted < budget) {
        Cand x = heap_pop(q.h, &q.hn);
        PyObject *a = PyLong_FromLong(x.tok), *b = PyLong_FromLong(x.parent), *c = PyFloat_FromDouble(x.c);
        int bad = !a || !b || !c || PyList_Append(toks, a) < 0 || PyList_Append(pars, b) < 0 ||
                  PyList_Append(probs, c) < 0;
        Py_XDECREF(a); Py_XDECREF(b); Py_XDECREF(c);
        if (bad) goto fail;
        emitted++;
        if (emitted < budget &&
            push_children(t, x.node, x.depth, x.score, (int32_t)(emitted - 1), min_prob, budget - emitted, &q) < 0)
            goto fail;
    }
    PyMem_Free(q.h); PyMem_Free(q.kids);
    return Py_BuildValue("(NNNn)", toks, pars, probs, m);
fail:
    PyMem_Free(q.h); PyMem_Free(q.kids);
    Py_XDECREF(toks); Py_XDECREF(pars); Py_XDECREF(probs);
    return NULL;
}

