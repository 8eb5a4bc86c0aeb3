/* The serialised node table: a 16-byte header, then parents, tokens and counts as
 * little-endian columns, in canonical order (docs/cache.md, "Decay, merge, bytes"). */
#include "trie.h"

/* ---------- bytes: header, then parents, tokens and counts as little-endian columns ---------- */

static void put_u32(unsigned char *p, uint32_t x) { for (int i = 0; i < 4; i++) p[i] = (unsigned char)(x >> (8 * i)); }
static uint32_t get_u32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static void put_f64(unsigned char *p, double d) {
    uint64_t x; memcpy(&x, &d, 8);
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(x >> (8 * i));
}
static double get_f64(const unsigned char *p) {
    uint64_t x = 0; double d;
    for (int i = 0; i < 8; i++) x |= (uint64_t)p[i] << (8 * i);
    memcpy(&d, &x, 8);
    return d;
}

static const Node *sort_base; /* qsort has no context argument; the GIL serialises its use */

static int by_token(const void *a, const void *b) {
    const Node *x = &sort_base[*(const int32_t *)a], *y = &sort_base[*(const int32_t *)b];
    return (x->token > y->token) - (x->token < y->token);
}

/* Canonical order: breadth first, siblings by token, so equal trees give equal bytes. One pass:
 * a queued node carries its parent's position and is written out when it is dequeued. */
PyObject *Tree_to_bytes(Tree *t, PyObject *unused) {
    int32_t n = t->n - 1;
    PyObject *out = PyBytes_FromStringAndSize(NULL, HEADER_SIZE + (Py_ssize_t)RECORD_SIZE * n);
    int32_t *order = PyMem_Malloc(sizeof(int32_t) * (size_t)t->n);
    int32_t *qpar = PyMem_Malloc(sizeof(int32_t) * (size_t)t->n);
    if (!out || !order || !qpar) {
        Py_XDECREF(out); PyMem_Free(order); PyMem_Free(qpar);
        return PyErr_NoMemory();
    }
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(out);
    memcpy(p, "SRTT", 4);
    p[4] = FORMAT_VERSION & 0xff; p[5] = FORMAT_VERSION >> 8; p[6] = 0; p[7] = 0;
    put_u32(p + 8, (uint32_t)t->max_depth);
    put_u32(p + 12, (uint32_t)n);
    unsigned char *pp = p + HEADER_SIZE, *pt = pp + 4 * (size_t)n, *pc = pt + 4 * (size_t)n;
    const Node *nd = t->nodes;
    int32_t len = 1;
    order[0] = 0; qpar[0] = -1;
    sort_base = nd;
    for (int32_t i = 0; i < len; i++) {
        int32_t u = order[i], start = len;
        if (i > 0) {
            size_t r = (size_t)(i - 1);
            put_u32(pp + 4 * r, (uint32_t)qpar[i]);
            put_u32(pt + 4 * r, (uint32_t)nd[u].token);
            put_f64(pc + 8 * r, nd[u].count);
        }
        for (int32_t v = nd[u].first_child; v >= 0; v = nd[v].next_sibling) { qpar[len] = i; order[len++] = v; }
        int32_t k = len - start, *kids = order + start;
        if (k > 16) {
            qsort(kids, (size_t)k, sizeof(int32_t), by_token);
        } else { /* most nodes have 0-2 children: an insertion sort beats a qsort call */
            for (int32_t a = 1; a < k; a++) {
                int32_t x = kids[a], b = a;
                for (; b > 0 && nd[kids[b - 1]].token > nd[x].token; b--) kids[b] = kids[b - 1];
                kids[b] = x;
            }
        }
    }
    PyMem_Free(order); PyMem_Free(qpar);
    return out;
}

static PyObject *bad_bytes(const char *why, long long i) {
    if (i >= 0) return PyErr_Format(PyExc_ValueError, "token tree bytes: %s (node %lld)", why, i);
    return PyErr_Format(PyExc_ValueError, "token tree bytes: %s", why);
}

PyObject *Tree_from_bytes(PyObject *cls, PyObject *arg) {
    Py_buffer buf;
    if (PyObject_GetBuffer(arg, &buf, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *p = buf.buf;
    Py_ssize_t size = buf.len;
    PyObject *err = NULL;
    Tree *t = NULL;
    if (size < HEADER_SIZE) { err = bad_bytes("truncated header", -1); goto done; }
    if (memcmp(p, "SRTT", 4) != 0) { err = bad_bytes("not a token tree (bad magic)", -1); goto done; }
    unsigned version = p[4] | (unsigned)p[5] << 8;
    if (version != FORMAT_VERSION) {
        err = PyErr_Format(PyExc_ValueError, "token tree bytes: format version %u, this srt reads %d",
                           version, FORMAT_VERSION);
        goto done;
    }
    uint32_t d = get_u32(p + 8), n = get_u32(p + 12);
    if (d < 2 || d > MAX_DEPTH_LIMIT) { err = bad_bytes("bad max_depth", -1); goto done; }
    if (n >= (uint32_t)INT32_MAX || (Py_ssize_t)(size - HEADER_SIZE) / RECORD_SIZE != (Py_ssize_t)n ||
        (size - HEADER_SIZE) % RECORD_SIZE != 0) {
        err = bad_bytes("length does not match the node count", -1); goto done;
    }
    t = trie_alloc((PyTypeObject *)cls, (int32_t)d);
    if (!t || trie_reserve(t, (int64_t)n + 1, 1) < 0) goto done;
    /* Only the canonical order to_bytes writes is accepted: parents non-decreasing, siblings by
     * strictly increasing token. That rules out duplicates without a lookup per node, so the
     * nodes are laid down in one pass and the map is built once at the end. */
    const unsigned char *pp = p + HEADER_SIZE, *pt = pp + 4 * (size_t)n, *pc = pt + 4 * (size_t)n;
    Node *nd = t->nodes;
    uint32_t prev_par = 0, prev_tok = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t par = get_u32(pp + 4 * (size_t)i), tok = get_u32(pt + 4 * (size_t)i);
        double c = get_f64(pc + 8 * (size_t)i);
        if (par > i) { err = bad_bytes("parent after child", i); goto done; }
        if (i > 0 && (par < prev_par || (par == prev_par && tok <= prev_tok))) {
            err = bad_bytes("nodes not in canonical order (or a duplicate child)", i); goto done;
        }
        if (tok >= (uint32_t)TOKEN_LIMIT) { err = bad_bytes("token id out of range", i); goto done; }
        if (!isfinite(c) || c <= 0) { err = bad_bytes("count not finite and > 0", i); goto done; }
        if (nd[par].depth >= (int32_t)d) { err = bad_bytes("deeper than max_depth", i); goto done; }
        Node *v = &nd[i + 1];
        v->token = (int32_t)tok; v->parent = (int32_t)par; v->first_child = -1; v->best = -1;
        v->depth = nd[par].depth + 1; v->count = c; v->childsum = 0.0;
        v->next_sibling = nd[par].first_child;
        nd[par].first_child = (int32_t)i + 1;
        prev_par = par; prev_tok = tok;
    }
    t->n = (int32_t)n + 1;
    if (trie_rehash(t, t->n) < 0) goto done;
    trie_recompute(t);
    PyBuffer_Release(&buf);
    return (PyObject *)t;
done:
    (void)err;
    PyBuffer_Release(&buf);
    Py_XDECREF(t);
    return NULL;
}

