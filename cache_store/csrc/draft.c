/* Drafting from the token tree: the match of the context's tail, the greedy draft and the
 * best-first draft tree (rules in docs/cache.md, "Drafting"). */
#include "trie.h"

/* The node to draft from: the longest tail of the context, at most `cap` tokens, whose node has
 * children. "Tail of length k is a node with children" is monotone in k in a suffix-closed trie
 * (every suffix of an inserted path is inserted too), so binary search finds it. */
static int32_t match(const Tree *t, const int32_t *ctx, Py_ssize_t len, Py_ssize_t cap) {
    Py_ssize_t lo = 0, hi = cap < len ? cap : len;
    int32_t best = -1;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi + 1) / 2;
        int32_t u = trie_walk(t, ctx + len - mid, mid);
        if (u >= 0 && t->nodes[u].first_child >= 0) { lo = mid; best = u; }
        else hi = mid - 1;
    }
    return lo > 0 ? best : -1;
}

static Py_ssize_t match_cap(const Tree *t, Py_ssize_t budget) {
    Py_ssize_t half = t->max_depth / 2, room = budget < half ? budget : half;
    if (room < 1) room = 1;
    return t->max_depth - room;
}

/* The common start of both drafts: parse (context, budget, min_prob) and find the node of the
   longest matched tail of the context (-1: none). Returns -1 with an exception set on bad input. */
static int draft_start(Tree *t, PyObject *args, PyObject *kw, Py_ssize_t *budget, double *min_prob,
                       int32_t *u) {
    static char *kwlist[] = {"context", "budget", "min_prob", NULL};
    PyObject *ctxo; Py_ssize_t len, k;
    *budget = 16; *min_prob = 0.1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|nd", kwlist, &ctxo, budget, min_prob)) return -1;
    if (*budget < 0) { PyErr_SetString(PyExc_ValueError, "budget must be >= 0"); return -1; }
    if (isnan(*min_prob)) { PyErr_SetString(PyExc_ValueError, "min_prob must not be NaN"); return -1; }
    int32_t *ctx = trie_read_tokens(ctxo, match_cap(t, *budget), &len, &k);
    if (!ctx) return -1;
    *u = match(t, ctx, k, k);
    PyMem_Free(ctx);
    return 0;
}

/* Greedy draft: from the matched node follow the best child while the product of C stays >= min_prob. */
PyObject *Tree_draft(Tree *t, PyObject *args, PyObject *kw) {
    Py_ssize_t budget; double min_prob; int32_t u;
    if (draft_start(t, args, kw, &budget, &min_prob, &u) < 0) return NULL;
    PyObject *toks = PyList_New(0), *probs = PyList_New(0);
    if (!toks || !probs) goto fail;
    int32_t m = u >= 0 ? t->nodes[u].depth : 0;
    double score = 1.0;
    for (Py_ssize_t i = 0; u >= 0 && i < budget && t->nodes[u].first_child >= 0; i++) {
        const Node *nu = &t->nodes[u], *nv = &t->nodes[nu->best];
        double c = nv->count / nu->childsum;
        score *= c;
        if (score < min_prob) break;
        PyObject *a = PyLong_FromLong(nv->token), *b = PyFloat_FromDouble(c);
        int bad = !a || !b || PyList_Append(toks, a) < 0 || PyList_Append(probs, b) < 0;
        Py_XDECREF(a); Py_XDECREF(b);
        if (bad) goto fail;
        u = nu->best;
    }
    return Py_BuildValue("(NNi)", toks, probs, m);
fail:
    Py_XDECREF(toks); Py_XDECREF(probs);
    return NULL;
}

/* ---------- the draft tree: best-first by path score ---------- */

typedef struct { double score, c; uint64_t seq; int32_t node, parent; } Cand;

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

static const Node *sort_base;
static int by_count_then_token(const void *a, const void *b) {
    const Node *x = &sort_base[*(const int32_t *)a], *y = &sort_base[*(const int32_t *)b];
    if (x->count != y->count) return x->count > y->count ? -1 : 1;
    return (x->token > y->token) - (x->token < y->token);
}

/* Push u's children whose path score stays >= min_prob, best first, at most `limit` of them
 * (a child ranked below `limit` siblings can never be emitted within the budget). */
static int push_children(const Tree *t, int32_t u, double score, int32_t parent, double min_prob,
                         Py_ssize_t limit, Cand **h, Py_ssize_t *hn, Py_ssize_t *hcap,
                         int32_t **kids, Py_ssize_t *kcap, uint64_t *seq) {
    const Node *nd = t->nodes;
    Py_ssize_t nk = 0;
    for (int32_t v = nd[u].first_child; v >= 0; v = nd[v].next_sibling) {
        if (score * (nd[v].count / nd[u].childsum) < min_prob) continue;
        if (nk == *kcap) {
            Py_ssize_t cap = *kcap * 2 + 16;
            int32_t *k2 = PyMem_Realloc(*kids, sizeof(int32_t) * (size_t)cap);
            if (!k2) { PyErr_NoMemory(); return -1; }
            *kids = k2; *kcap = cap;
        }
        (*kids)[nk++] = v;
    }
    if (nk == 0) return 0;
    sort_base = nd;
    qsort(*kids, (size_t)nk, sizeof(int32_t), by_count_then_token);
    if (nk > limit) nk = limit;
    if (*hn + nk > *hcap) {
        Py_ssize_t cap = (*hn + nk) * 2 + 16;
        Cand *h2 = PyMem_Realloc(*h, sizeof(Cand) * (size_t)cap);
        if (!h2) { PyErr_NoMemory(); return -1; }
        *h = h2; *hcap = cap;
    }
    for (Py_ssize_t i = 0; i < nk; i++) {
        int32_t v = (*kids)[i];
        double c = nd[v].count / nd[u].childsum;
        Cand x = {score * c, c, (*seq)++, v, parent};
        heap_push(*h, hn, x);
    }
    return 0;
}

PyObject *Tree_draft_tree(Tree *t, PyObject *args, PyObject *kw) {
    Py_ssize_t budget; double min_prob; int32_t u;
    if (draft_start(t, args, kw, &budget, &min_prob, &u) < 0) return NULL;
    PyObject *toks = PyList_New(0), *pars = PyList_New(0), *probs = PyList_New(0);
    Cand *h = NULL; int32_t *kids = NULL;
    Py_ssize_t hn = 0, hcap = 0, kcap = 0, emitted = 0;
    uint64_t seq = 0;
    if (!toks || !pars || !probs) goto fail;
    int32_t m = u >= 0 ? t->nodes[u].depth : 0;
    if (u >= 0 && budget > 0 &&
        push_children(t, u, 1.0, -1, min_prob, budget, &h, &hn, &hcap, &kids, &kcap, &seq) < 0)
        goto fail;
    while (hn > 0 && emitted < budget) {
        Cand x = heap_pop(h, &hn);
        PyObject *a = PyLong_FromLong(t->nodes[x.node].token), *b = PyLong_FromLong(x.parent),
                 *c = PyFloat_FromDouble(x.c);
        int bad = !a || !b || !c || PyList_Append(toks, a) < 0 || PyList_Append(pars, b) < 0 ||
                  PyList_Append(probs, c) < 0;
        Py_XDECREF(a); Py_XDECREF(b); Py_XDECREF(c);
        if (bad) goto fail;
        emitted++;
        if (emitted < budget &&
            push_children(t, x.node, x.score, (int32_t)(emitted - 1), min_prob, budget - emitted,
                          &h, &hn, &hcap, &kids, &kcap, &seq) < 0)
            goto fail;
    }
    PyMem_Free(h); PyMem_Free(kids);
    return Py_BuildValue("(NNNi)", toks, pars, probs, m);
fail:
    PyMem_Free(h); PyMem_Free(kids);
    Py_XDECREF(toks); Py_XDECREF(pars); Py_XDECREF(probs);
    return NULL;
}

