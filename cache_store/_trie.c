/* The compiled core of cache_store.trie: a depth-bounded suffix trie over token ids.
 *
 * cache_store/trie.py wraps this module in typed classes; read docs/cache.md ("The tree") for the
 * semantics. Layout: nodes live in one array (node 0 is the root, a child always has a larger id
 * than its parent), children hang off first_child/next_sibling lists, and an open-addressing hash
 * map (parent, token) -> child gives O(1) lookups; its slots hold only node ids (the key is read
 * from the node itself, which a lookup touches anyway), 4 bytes a slot at load <= 0.7. Every node caches the sum of its children's
 * counts and its best child (highest count, then lowest token), so drafting never scans siblings.
 * Dropping nodes (scale with a floor) compacts the arrays and bumps `epoch`, which tells open
 * streams to re-find their context nodes.
 *
 * Every entry point runs with the GIL held: Python threads never see a half-updated tree.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define MAX_DEPTH_LIMIT 1024
#define TOKEN_LIMIT 2147483648LL /* token ids are in [0, 2**31) */
#define FORMAT_VERSION 1
#define HEADER_SIZE 16
#define RECORD_SIZE 16 /* parent u32 + token u32 + count f64, stored as three columns */

typedef struct {
    int32_t token, parent, first_child, next_sibling, best, depth;
    double count, childsum;
} Node;

typedef struct {
    PyObject_HEAD
    Node *nodes;
    int32_t n, cap; /* n counts the root */
    int32_t *hslots; /* node ids; -1 = empty slot */
    uint32_t hcap;
    int hbits;
    int32_t max_depth;
    uint64_t epoch;
} Tree;

typedef struct {
    PyObject_HEAD
    Tree *tree;
    int32_t *active; /* active[L] = node of the suffix of length L ending at the last token */
    int32_t *hist;   /* ring of the last max_depth-1 tokens, to re-find active after an epoch */
    int32_t m, hlen, hhead;
    uint64_t epoch;
} Stream;

static PyTypeObject TreeType;
static PyTypeObject StreamType;

/* ---------- the hash map (parent, token) -> child ---------- */

#define KEY(u, tok) (((uint64_t)(uint32_t)(u) << 32) | (uint32_t)(tok))

static inline uint32_t hslot(uint64_t key, int bits) {
    return (uint32_t)((key * 0x9E3779B97F4A7C15ULL) >> (64 - bits));
}

static inline int32_t find_child(const Tree *t, int32_t u, int32_t tok) {
    uint32_t mask = t->hcap - 1, i = hslot(KEY(u, tok), t->hbits);
    for (;;) {
        int32_t v = t->hslots[i];
        if (v < 0) return -1;
        if (t->nodes[v].parent == u && t->nodes[v].token == tok) return v;
        i = (i + 1) & mask;
    }
}

static void hash_put(Tree *t, int32_t v) {
    uint32_t mask = t->hcap - 1, i = hslot(KEY(t->nodes[v].parent, t->nodes[v].token), t->hbits);
    while (t->hslots[i] >= 0) i = (i + 1) & mask;
    t->hslots[i] = v;
}

static inline int hash_full(const Tree *t, int64_t entries) { return 10 * entries > 7 * (int64_t)t->hcap; }

/* (Re)allocate the map for `want` entries at load <= 0.7 and insert every node. */
static int hash_rebuild(Tree *t, int64_t want) {
    int bits = 4;
    while (10 * want > 7 * ((int64_t)1 << bits)) bits++;
    if (bits > 31) { PyErr_NoMemory(); return -1; }
    uint32_t cap = (uint32_t)1 << bits;
    int32_t *slots = PyMem_Malloc(sizeof(int32_t) * cap);
    if (!slots) { PyErr_NoMemory(); return -1; }
    memset(slots, 0xff, sizeof(int32_t) * cap);
    PyMem_Free(t->hslots);
    t->hslots = slots; t->hcap = cap; t->hbits = bits;
    for (int32_t v = 1; v < t->n; v++) hash_put(t, v);
    return 0;
}

/* ---------- nodes ---------- */

/* Room for `want` nodes; exact when the final size is known, else growing by half. */
static int reserve_nodes(Tree *t, int64_t want, int exact) {
    if (want > INT32_MAX - 1) { PyErr_SetString(PyExc_MemoryError, "token tree: too many nodes"); return -1; }
    if (want > t->cap) {
        int64_t cap = exact ? want : (t->cap < 16 ? 16 : t->cap + t->cap / 2);
        if (cap < want) cap = want;
        if (cap > INT32_MAX) cap = INT32_MAX;
        Node *nodes = PyMem_Realloc(t->nodes, sizeof(Node) * (size_t)cap);
        if (!nodes) { PyErr_NoMemory(); return -1; }
        t->nodes = nodes; t->cap = (int32_t)cap;
    }
    if (hash_full(t, want)) return hash_rebuild(t, exact ? want : 2 * want);
    return 0;
}

/* u's child for `tok`, created (count 0) when absent, in one probe of the map; -1 on memory
 * error. *created says which. Room for one more node is made first, so the probe stays valid. */
static int32_t child_or_add(Tree *t, int32_t u, int32_t tok, int *created) {
    if (t->n >= t->cap || hash_full(t, (int64_t)t->n))
        if (reserve_nodes(t, (int64_t)t->n + 1, 0) < 0) return -1;
    uint32_t mask = t->hcap - 1, i = hslot(KEY(u, tok), t->hbits);
    for (;;) {
        int32_t v = t->hslots[i];
        if (v < 0) break;
        if (t->nodes[v].parent == u && t->nodes[v].token == tok) { *created = 0; return v; }
        i = (i + 1) & mask;
    }
    int32_t v = t->n++;
    Node *nv = &t->nodes[v], *nu = &t->nodes[u];
    nv->token = tok; nv->parent = u; nv->first_child = -1; nv->next_sibling = nu->first_child;
    nv->best = -1; nv->depth = nu->depth + 1; nv->count = 0.0; nv->childsum = 0.0;
    nu->first_child = v;
    t->hslots[i] = v;
    *created = 1;
    return v;
}

static inline int better(const Node *a, const Node *b) {
    return a->count > b->count || (a->count == b->count && a->token < b->token);
}

/* Add x to v's count and keep the parent's child sum and best child current. */
static inline void bump(Tree *t, int32_t v, double x) {
    Node *nd = t->nodes;
    nd[v].count += x;
    Node *p = &nd[nd[v].parent];
    p->childsum += x;
    if (p->best < 0 || (p->best != v && better(&nd[v], &nd[p->best]))) p->best = v;
}

static void recompute_aggregates(Tree *t) {
    Node *nd = t->nodes;
    for (int32_t i = 0; i < t->n; i++) { nd[i].childsum = 0.0; nd[i].best = -1; }
    for (int32_t v = 1; v < t->n; v++) {
        Node *p = &nd[nd[v].parent];
        p->childsum += nd[v].count;
        if (p->best < 0 || better(&nd[v], &nd[p->best])) p->best = v;
    }
}

static Tree *tree_alloc(PyTypeObject *type, int32_t max_depth) {
    Tree *t = (Tree *)type->tp_alloc(type, 0);
    if (!t) return NULL;
    t->max_depth = max_depth;
    t->n = 0;
    if (reserve_nodes(t, 1, 0) < 0) { Py_DECREF(t); return NULL; }
    Node *r = &t->nodes[0];
    memset(r, 0, sizeof(Node));
    r->parent = -1; r->first_child = -1; r->next_sibling = -1; r->best = -1; r->token = -1;
    t->n = 1;
    return t;
}

/* One streamed token: every context in active[0..m] gains child `tok`, counted once. */
static int step(Tree *t, int32_t *active, int32_t *pm, int32_t tok) {
    int32_t m = *pm, D = t->max_depth;
    int created;
    for (int32_t L = m; L >= 0; L--) {
        int32_t v = child_or_add(t, active[L], tok, &created);
        if (v < 0) return -1;
        bump(t, v, 1.0);
        if (L + 1 <= D - 1) active[L + 1] = v;
    }
    *pm = m + 1 < D - 1 ? m + 1 : D - 1;
    return 0;
}

/* ---------- reading token sequences ---------- */

static int to_token(PyObject *o, int32_t *out) {
    long long x;
    if (PyLong_Check(o)) {
        x = PyLong_AsLongLong(o);
    } else {
        PyObject *i = PyNumber_Index(o);
        if (!i) return -1;
        x = PyLong_AsLongLong(i);
        Py_DECREF(i);
    }
    if (x == -1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError)) return -1;
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "token id out of range [0, 2**31)");
        return -1;
    }
    if (x < 0 || x >= TOKEN_LIMIT) {
        PyErr_Format(PyExc_ValueError, "token id %lld out of range [0, 2**31)", x);
        return -1;
    }
    *out = (int32_t)x;
    return 0;
}

/* Read the last `tail` items of a sequence (all when tail < 0) into a new array, all validated
 * before anything is changed. Sets *len to the sequence's full length. */
static int32_t *read_tokens(PyObject *seq, Py_ssize_t tail, Py_ssize_t *len, Py_ssize_t *got) {
    PyObject *fast = NULL;
    Py_ssize_t n;
    int use_getitem = 0;
    if (PyList_Check(seq) || PyTuple_Check(seq)) {
        n = PySequence_Fast_GET_SIZE(seq);
    } else if (tail >= 0 && PySequence_Check(seq) && (n = PySequence_Size(seq)) >= 0) {
        use_getitem = 1; /* e.g. a long numpy array: touch only its tail */
    } else {
        PyErr_Clear();
        fast = PySequence_Fast(seq, "tokens must be a sequence of ints");
        if (!fast) return NULL;
        n = PySequence_Fast_GET_SIZE(fast);
    }
    Py_ssize_t k = (tail >= 0 && tail < n) ? tail : n, start = n - k;
    int32_t *buf = PyMem_Malloc(sizeof(int32_t) * (size_t)(k ? k : 1));
    if (!buf) { Py_XDECREF(fast); PyErr_NoMemory(); return NULL; }
    PyObject **items = use_getitem ? NULL : PySequence_Fast_ITEMS(fast ? fast : seq);
    for (Py_ssize_t i = 0; i < k; i++) {
        int rc;
        if (use_getitem) {
            PyObject *o = PySequence_GetItem(seq, start + i);
            if (!o) { rc = -1; } else { rc = to_token(o, &buf[i]); Py_DECREF(o); }
        } else {
            rc = to_token(items[start + i], &buf[i]);
        }
        if (rc < 0) { PyMem_Free(buf); Py_XDECREF(fast); return NULL; }
    }
    Py_XDECREF(fast);
    *len = n;
    *got = k;
    return buf;
}

/* ---------- matching ---------- */

static int32_t walk(const Tree *t, const int32_t *toks, Py_ssize_t k) {
    int32_t u = 0;
    for (Py_ssize_t i = 0; i < k && u >= 0; i++) u = find_child(t, u, toks[i]);
    return u;
}

/* The node to draft from: the longest tail of the context, at most `cap` tokens, whose node has
 * children. "Tail of length k is a node with children" is monotone in k in a suffix-closed trie
 * (every suffix of an inserted path is inserted too), so binary search finds it. */
static int32_t match(const Tree *t, const int32_t *ctx, Py_ssize_t len, Py_ssize_t cap) {
    Py_ssize_t lo = 0, hi = cap < len ? cap : len;
    int32_t best = -1;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi + 1) / 2;
        int32_t u = walk(t, ctx + len - mid, mid);
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

/* ---------- Tree methods ---------- */

static PyObject *Tree_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"max_depth", NULL};
    int max_depth = 64;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|i", kwlist, &max_depth)) return NULL;
    if (max_depth < 2 || max_depth > MAX_DEPTH_LIMIT)
        return PyErr_Format(PyExc_ValueError, "max_depth must be in [2, %d], got %d", MAX_DEPTH_LIMIT, max_depth);
    return (PyObject *)tree_alloc(type, max_depth);
}

static void Tree_dealloc(Tree *t) {
    PyMem_Free(t->nodes);
    PyMem_Free(t->hslots);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

static PyObject *Tree_insert(Tree *t, PyObject *seq) {
    Py_ssize_t n, k;
    int32_t *toks = read_tokens(seq, -1, &n, &k);
    if (!toks) return NULL;
    int32_t active[MAX_DEPTH_LIMIT], m = 0;
    active[0] = 0;
    for (Py_ssize_t i = 0; i < k; i++)
        if (step(t, active, &m, toks[i]) < 0) { PyMem_Free(toks); return NULL; }
    PyMem_Free(toks);
    Py_RETURN_NONE;
}

static PyObject *Tree_stream(Tree *t, PyObject *unused) {
    Stream *s = PyObject_New(Stream, &StreamType);
    if (!s) return NULL;
    s->active = PyMem_Malloc(sizeof(int32_t) * (size_t)t->max_depth);
    s->hist = PyMem_Malloc(sizeof(int32_t) * (size_t)t->max_depth);
    if (!s->active || !s->hist) {
        PyMem_Free(s->active); PyMem_Free(s->hist); PyObject_Free(s);
        return PyErr_NoMemory();
    }
    Py_INCREF(t);
    s->tree = t;
    s->active[0] = 0;
    s->m = 0; s->hlen = 0; s->hhead = 0; s->epoch = t->epoch;
    return (PyObject *)s;
}

static PyObject *Tree_count(Tree *t, PyObject *seq) {
    Py_ssize_t n, k;
    int32_t *toks = read_tokens(seq, -1, &n, &k);
    if (!toks) return NULL;
    double c;
    if (k == 0) c = t->nodes[0].childsum;
    else if (k > t->max_depth) c = 0.0;
    else { int32_t u = walk(t, toks, k); c = u >= 0 ? t->nodes[u].count : 0.0; }
    PyMem_Free(toks);
    return PyFloat_FromDouble(c);
}

static int parse_draft_args(PyObject *args, PyObject *kw, PyObject **ctx, Py_ssize_t *budget, double *min_prob) {
    static char *kwlist[] = {"context", "budget", "min_prob", NULL};
    *budget = 16; *min_prob = 0.1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|nd", kwlist, ctx, budget, min_prob)) return -1;
    if (*budget < 0) { PyErr_SetString(PyExc_ValueError, "budget must be >= 0"); return -1; }
    if (isnan(*min_prob)) { PyErr_SetString(PyExc_ValueError, "min_prob must not be NaN"); return -1; }
    return 0;
}

/* Greedy draft: from the matched node follow the best child while the product of C stays >= min_prob. */
static PyObject *Tree_draft(Tree *t, PyObject *args, PyObject *kw) {
    PyObject *ctxo; Py_ssize_t budget, len, k; double min_prob;
    if (parse_draft_args(args, kw, &ctxo, &budget, &min_prob) < 0) return NULL;
    int32_t *ctx = read_tokens(ctxo, match_cap(t, budget), &len, &k);
    if (!ctx) return NULL;
    int32_t u = match(t, ctx, k, k);
    PyMem_Free(ctx);
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

static PyObject *Tree_draft_tree(Tree *t, PyObject *args, PyObject *kw) {
    PyObject *ctxo; Py_ssize_t budget, len, k; double min_prob;
    if (parse_draft_args(args, kw, &ctxo, &budget, &min_prob) < 0) return NULL;
    int32_t *ctx = read_tokens(ctxo, match_cap(t, budget), &len, &k);
    if (!ctx) return NULL;
    int32_t u = match(t, ctx, k, k);
    PyMem_Free(ctx);
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

/* ---------- decay, merge, copy ---------- */

/* Keep only nodes with keep[v] != 0 (a kept node's parent is kept); ids stay in order. */
static int compact(Tree *t, const char *keep) {
    int32_t *newid = PyMem_Malloc(sizeof(int32_t) * (size_t)t->n);
    if (!newid) { PyErr_NoMemory(); return -1; }
    Node *nd = t->nodes;
    int32_t n = 0;
    for (int32_t v = 0; v < t->n; v++) {
        if (!keep[v]) continue;
        newid[v] = n;
        nd[n] = nd[v];
        nd[n].parent = v ? newid[nd[v].parent] : -1;
        n++;
    }
    PyMem_Free(newid);
    t->n = n;
    for (int32_t v = 0; v < n; v++) nd[v].first_child = -1;
    for (int32_t v = n - 1; v >= 1; v--) {
        nd[v].next_sibling = nd[nd[v].parent].first_child;
        nd[nd[v].parent].first_child = v;
    }
    nd[0].next_sibling = -1;
    t->epoch++;
    Node *fit = PyMem_Realloc(t->nodes, sizeof(Node) * (size_t)n); /* give dropped room back */
    if (fit) { t->nodes = fit; t->cap = n; }
    return hash_rebuild(t, n);
}

static PyObject *Tree_scale(Tree *t, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"factor", "floor", NULL};
    double factor, floor = 0.0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "d|d", kwlist, &factor, &floor)) return NULL;
    if (!isfinite(factor) || factor < 0 || !isfinite(floor) || floor < 0) {
        PyErr_SetString(PyExc_ValueError, "factor and floor must be finite and >= 0");
        return NULL;
    }
    char *keep = PyMem_Malloc((size_t)t->n);
    if (!keep) return PyErr_NoMemory();
    Node *nd = t->nodes;
    int dropped = 0;
    keep[0] = 1;
    for (int32_t v = 1; v < t->n; v++) {
        nd[v].count *= factor;
        keep[v] = keep[nd[v].parent] && nd[v].count >= floor && nd[v].count > 0;
        dropped |= !keep[v];
    }
    int rc = dropped ? compact(t, keep) : 0;
    PyMem_Free(keep);
    recompute_aggregates(t);
    if (rc < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *Tree_merge(Tree *t, PyObject *arg) {
    if (!PyObject_TypeCheck(arg, &TreeType)) {
        PyErr_SetString(PyExc_TypeError, "merge() needs another tree");
        return NULL;
    }
    Tree *o = (Tree *)arg;
    if (o->max_depth != t->max_depth)
        return PyErr_Format(PyExc_ValueError, "cannot merge a tree of max_depth %d into one of %d",
                            o->max_depth, t->max_depth);
    if (o == t) {
        for (int32_t v = 1; v < t->n; v++) t->nodes[v].count += t->nodes[v].count;
        recompute_aggregates(t);
        Py_RETURN_NONE;
    }
    int32_t *map = PyMem_Malloc(sizeof(int32_t) * (size_t)o->n);
    if (!map) return PyErr_NoMemory();
    map[0] = 0;
    int rc = 0, created;
    for (int32_t i = 1; i < o->n; i++) {
        int32_t v = child_or_add(t, map[o->nodes[i].parent], o->nodes[i].token, &created);
        if (v < 0) { rc = -1; break; }
        t->nodes[v].count += o->nodes[i].count;
        map[i] = v;
    }
    PyMem_Free(map);
    recompute_aggregates(t); /* also on failure: nodes added so far must stay consistent */
    if (rc < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *Tree_copy(Tree *t, PyObject *unused) {
    Tree *c = tree_alloc(Py_TYPE(t), t->max_depth);
    if (!c) return NULL;
    if (reserve_nodes(c, t->n, 1) < 0) { Py_DECREF(c); return NULL; }
    memcpy(c->nodes, t->nodes, sizeof(Node) * (size_t)t->n);
    c->n = t->n;
    if (hash_rebuild(c, t->n) < 0) { Py_DECREF(c); return NULL; }
    return (PyObject *)c;
}

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

static int by_token(const void *a, const void *b) {
    const Node *x = &sort_base[*(const int32_t *)a], *y = &sort_base[*(const int32_t *)b];
    return (x->token > y->token) - (x->token < y->token);
}

/* Canonical order: breadth first, siblings by token, so equal trees give equal bytes. One pass:
 * a queued node carries its parent's position and is written out when it is dequeued. */
static PyObject *Tree_to_bytes(Tree *t, PyObject *unused) {
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

static PyObject *Tree_from_bytes(PyObject *cls, PyObject *arg) {
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
    t = tree_alloc((PyTypeObject *)cls, (int32_t)d);
    if (!t || reserve_nodes(t, (int64_t)n + 1, 1) < 0) goto done;
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
    if (hash_rebuild(t, t->n) < 0) goto done;
    recompute_aggregates(t);
    PyBuffer_Release(&buf);
    return (PyObject *)t;
done:
    (void)err;
    PyBuffer_Release(&buf);
    Py_XDECREF(t);
    return NULL;
}

/* ---------- attributes ---------- */

static PyObject *Tree_memory_bytes(Tree *t, PyObject *unused) {
    size_t b = sizeof(Tree) + sizeof(Node) * (size_t)t->cap + sizeof(int32_t) * (size_t)t->hcap;
    return PyLong_FromSize_t(b);
}
static PyObject *Tree_get_nodes(Tree *t, void *c) { return PyLong_FromLong(t->n - 1); }
static PyObject *Tree_get_mass(Tree *t, void *c) { return PyFloat_FromDouble(t->nodes[0].childsum); }
static PyObject *Tree_get_max_depth(Tree *t, void *c) { return PyLong_FromLong(t->max_depth); }

static PyMethodDef Tree_methods[] = {
    {"insert", (PyCFunction)Tree_insert, METH_O, "insert(tokens): add one whole sequence"},
    {"stream", (PyCFunction)Tree_stream, METH_NOARGS, "stream() -> Stream for incremental insertion"},
    {"count", (PyCFunction)Tree_count, METH_O, "count(path) -> float (0.0 if absent; mass for [])"},
    {"draft", (PyCFunction)(void (*)(void))Tree_draft, METH_VARARGS | METH_KEYWORDS,
     "draft(context, budget=16, min_prob=0.1) -> (tokens, probs, match_len)"},
    {"draft_tree", (PyCFunction)(void (*)(void))Tree_draft_tree, METH_VARARGS | METH_KEYWORDS,
     "draft_tree(context, budget=16, min_prob=0.1) -> (tokens, parents, probs, match_len)"},
    {"scale", (PyCFunction)(void (*)(void))Tree_scale, METH_VARARGS | METH_KEYWORDS,
     "scale(factor, floor=0.0): multiply counts, drop nodes below floor"},
    {"merge", (PyCFunction)Tree_merge, METH_O, "merge(other): add other's counts"},
    {"copy", (PyCFunction)Tree_copy, METH_NOARGS, "copy() -> an independent tree"},
    {"to_bytes", (PyCFunction)Tree_to_bytes, METH_NOARGS, "to_bytes() -> bytes"},
    {"from_bytes", (PyCFunction)Tree_from_bytes, METH_O | METH_CLASS, "from_bytes(b) -> tree; ValueError on bad bytes"},
    {"memory_bytes", (PyCFunction)Tree_memory_bytes, METH_NOARGS, "bytes held by the node table and map"},
    {NULL}};

static PyGetSetDef Tree_getset[] = {
    {"nodes", (getter)Tree_get_nodes, NULL, "number of nodes (the root excluded)", NULL},
    {"mass", (getter)Tree_get_mass, NULL, "sum of depth-1 counts", NULL},
    {"max_depth", (getter)Tree_get_max_depth, NULL, "deepest path stored", NULL},
    {NULL}};

static PyTypeObject TreeType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cache_store._trie.Tree",
    .tp_basicsize = sizeof(Tree),
    .tp_dealloc = (destructor)Tree_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Depth-bounded suffix trie over token ids with float counts.",
    .tp_methods = Tree_methods,
    .tp_getset = Tree_getset,
    .tp_new = Tree_new,
};

/* ---------- Stream ---------- */

/* After nodes were dropped, find again the context nodes of the last tokens; a context that was
 * dropped stays dropped (and so do the longer ones, which extend it). */
static void stream_resync(Stream *s) {
    Tree *t = s->tree;
    int32_t D = t->max_depth, ring = D - 1, toks[MAX_DEPTH_LIMIT];
    for (int32_t i = 0; i < s->hlen; i++) toks[i] = s->hist[(s->hhead + ring - s->hlen + i) % ring];
    s->m = 0;
    s->active[0] = 0;
    for (int32_t L = 1; L <= s->hlen; L++) {
        int32_t u = walk(t, toks + s->hlen - L, L);
        if (u < 0) break;
        s->active[L] = u;
        s->m = L;
    }
    s->epoch = t->epoch;
}

static PyObject *Stream_extend(Stream *s, PyObject *seq) {
    Py_ssize_t n, k;
    int32_t *toks = read_tokens(seq, -1, &n, &k);
    if (!toks) return NULL;
    Tree *t = s->tree;
    if (s->epoch != t->epoch) stream_resync(s);
    int32_t ring = t->max_depth - 1;
    for (Py_ssize_t i = 0; i < k; i++) {
        if (step(t, s->active, &s->m, toks[i]) < 0) { PyMem_Free(toks); return NULL; }
        s->hist[s->hhead] = toks[i];
        s->hhead = (s->hhead + 1) % ring;
        if (s->hlen < ring) s->hlen++;
    }
    PyMem_Free(toks);
    Py_RETURN_NONE;
}

static void Stream_dealloc(Stream *s) {
    PyMem_Free(s->active);
    PyMem_Free(s->hist);
    Py_XDECREF(s->tree);
    PyObject_Free(s);
}

static PyMethodDef Stream_methods[] = {
    {"extend", (PyCFunction)Stream_extend, METH_O, "extend(tokens): insert tokens and every suffix ending at them"},
    {NULL}};

static PyTypeObject StreamType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cache_store._trie.Stream",
    .tp_basicsize = sizeof(Stream),
    .tp_dealloc = (destructor)Stream_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Incremental insertion of one sequence into a tree.",
    .tp_methods = Stream_methods,
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_trie", "Compiled core of cache_store.trie.", -1, NULL};

PyMODINIT_FUNC PyInit__trie(void) {
    if (PyType_Ready(&TreeType) < 0 || PyType_Ready(&StreamType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&TreeType);
    Py_INCREF(&StreamType);
    if (PyModule_AddObject(m, "Tree", (PyObject *)&TreeType) < 0 ||
        PyModule_AddObject(m, "Stream", (PyObject *)&StreamType) < 0 ||
        PyModule_AddIntConstant(m, "FORMAT_VERSION", FORMAT_VERSION) < 0 ||
        PyModule_AddIntConstant(m, "MAX_DEPTH_LIMIT", MAX_DEPTH_LIMIT) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
