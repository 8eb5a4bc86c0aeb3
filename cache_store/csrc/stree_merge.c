/* One draft tree from a row's streams (its prompt's tree and the run-wide one): each stream's
 * best-first draft tree, every node of every tree ranked by its path score (the product of C
 * along its path; ties: the earlier tree, the picked stream's first, then the earlier node),
 * a path already taken kept once. A node's score is at most its parent's, so parents rank
 * first and the merged tree lists parents before children. */
#include "stree.h"

typedef struct { double score; int32_t tree, node; } Ranked;

static int rank_order(const void *a, const void *b) {
    const Ranked *x = a, *y = b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    if (x->tree != y->tree) return x->tree < y->tree ? -1 : 1;
    return (x->node > y->node) - (x->node < y->node);
}

/* Every node of the nt trees with its path score, ranked; off[k] is where tree k's nodes start
 * in a per-node array (its n nodes follow). */
static Ranked *rank_nodes(const DTree *d, Py_ssize_t nt, Py_ssize_t *off, Py_ssize_t *total) {
    *total = 0;
    for (Py_ssize_t k = 0; k < nt; k++) { off[k] = *total; *total += d[k].n; }
    Ranked *r = PyMem_RawMalloc(sizeof(Ranked) * (size_t)(*total + 1));
    if (!r) { PyErr_NoMemory(); return NULL; }
    for (Py_ssize_t k = 0; k < nt; k++) /* in tree order first: a parent's score is already there */
        for (Py_ssize_t i = 0; i < d[k].n; i++) {
            double parent = d[k].par[i] >= 0 ? r[off[k] + d[k].par[i]].score : 1.0;
            Ranked x = {parent * d[k].c[i], (int32_t)k, (int32_t)i};
            r[off[k] + i] = x;
        }
    qsort(r, (size_t)*total, sizeof(Ranked), rank_order);
    return r;
}

/* The ranked nodes merged into at most `nodes` nodes (tok/par), one per (merged parent, token):
 * first[p + 1] / next[c] chain the merged children of p (p = -1: the root) to look a token up
 * among them; merged[off[k] + i] is what node i of tree k became. Stops at the first new path
 * past `nodes`. Returns the merged tree's size, -1 with an exception set. */
static Py_ssize_t merge_ranked(const DTree *d, const Ranked *r, Py_ssize_t total, const Py_ssize_t *off,
                               Py_ssize_t nodes, int32_t *tok, int32_t *par) {
    int32_t *merged = PyMem_RawMalloc(sizeof(int32_t) * (size_t)(total + 1));
    int32_t *first = PyMem_RawMalloc(sizeof(int32_t) * (size_t)(nodes + 1));
    int32_t *next = PyMem_RawMalloc(sizeof(int32_t) * (size_t)(nodes + 1));
    Py_ssize_t n = 0;
    if (!merged || !first || !next) { PyErr_NoMemory(); n = -1; goto done; }
    for (Py_ssize_t p = 0; p <= nodes; p++) first[p] = -1;
    for (Py_ssize_t j = 0; j < total; j++) {
        const DTree *t = &d[r[j].tree];
        int32_t i = r[j].node, p = t->par[i] >= 0 ? merged[off[r[j].tree] + t->par[i]] : -1, x = t->tok[i], c;
        for (c = first[p + 1]; c >= 0 && tok[c] != x; c = next[c]);
        if (c < 0) {
            if (n == nodes) break;
            c = (int32_t)n++;
            tok[c] = x; par[c] = p; next[c] = first[p + 1]; first[p + 1] = c;
        }
        merged[off[r[j].tree] + i] = c;
    }
done:
    PyMem_RawFree(merged); PyMem_RawFree(first); PyMem_RawFree(next);
    return n;
}

static PyObject *int_list(const int32_t *v, Py_ssize_t n) {
    PyObject *out = PyList_New(n);
    for (Py_ssize_t i = 0; out && i < n; i++) {
        PyObject *x = PyLong_FromLong(v[i]);
        if (!x) { Py_CLEAR(out); break; }
        PyList_SET_ITEM(out, i, x);
    }
    return out;
}

/* merged_draft(streams, nodes, min_prob): the stream `draft_many` would pick first, then the
 * others in order, each drafting its best-first tree of `nodes` nodes, merged into one of at
 * most `nodes` nodes. Returns (tokens, parents), -1 for the root's children. */
PyObject *st_merged_draft(PyObject *self, PyObject *args) {
    PyObject *streams, *out = NULL;
    Py_ssize_t nodes, built = 0, total = 0, n, pick;
    double min_prob;
    if (!PyArg_ParseTuple(args, "O!nd", &PyTuple_Type, &streams, &nodes, &min_prob)) return NULL;
    if (st_check_row(streams, nodes, min_prob, "merged_draft") < 0) return NULL;
    if (nodes == 0) return Py_BuildValue("([][])");
    Py_ssize_t nt = PyTuple_GET_SIZE(streams);
    DTree *d = PyMem_RawCalloc((size_t)nt, sizeof(DTree));
    Py_ssize_t *off = PyMem_RawMalloc(sizeof(Py_ssize_t) * (size_t)nt);
    int32_t *tok = PyMem_RawMalloc(sizeof(int32_t) * (size_t)nodes);
    int32_t *par = PyMem_RawMalloc(sizeof(int32_t) * (size_t)nodes);
    Ranked *r = NULL;
    if (!d || !off || !tok || !par) { PyErr_NoMemory(); goto done; }
    if ((pick = st_pick_stream(streams, nodes, min_prob)) < 0) goto done;
    if (st_row_dtrees(streams, pick, nt, nodes, min_prob, d) < 0) goto done;
    built = nt;
    if (!(r = rank_nodes(d, nt, off, &total))) goto done;
    if ((n = merge_ranked(d, r, total, off, nodes, tok, par)) < 0) goto done;
    PyObject *toks = int_list(tok, n), *pars = int_list(par, n);
    if (toks && pars) out = Py_BuildValue("(NN)", toks, pars);
    else { Py_XDECREF(toks); Py_XDECREF(pars); }
done:
    for (Py_ssize_t k = 0; d && k < built; k++) st_dtree_free(&d[k]);
    PyMem_RawFree(d); PyMem_RawFree(off); PyMem_RawFree(tok); PyMem_RawFree(par);
    PyMem_RawFree(r);
    return out;
}
