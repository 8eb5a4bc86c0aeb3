/* The node table of the token tree: its hash map, growth, insertion of one streamed token,
 * the cached aggregates (children's count sum, best child) and compaction after drops. */
#include "trie.h"

static void hash_put(Tree *t, int32_t v) {
    uint32_t mask = t->hcap - 1, i = hslot(KEY(t->nodes[v].parent, t->nodes[v].token), t->hbits);
    while (t->hslots[i] >= 0) i = (i + 1) & mask;
    t->hslots[i] = v;
}

/* (Re)allocate the map for `want` entries at load <= 0.7 and insert every node. */
int trie_rehash(Tree *t, int64_t want) {
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

/* Room for `want` nodes; exact when the final size is known, else growing by half. */
int trie_reserve(Tree *t, int64_t want, int exact) {
    if (want > INT32_MAX - 1) { PyErr_SetString(PyExc_MemoryError, "token tree: too many nodes"); return -1; }
    if (want > t->cap) {
        int64_t cap = exact ? want : (t->cap < 16 ? 16 : t->cap + t->cap / 2);
        if (cap < want) cap = want;
        if (cap > INT32_MAX) cap = INT32_MAX;
        Node *nodes = PyMem_Realloc(t->nodes, sizeof(Node) * (size_t)cap);
        if (!nodes) { PyErr_NoMemory(); return -1; }
        t->nodes = nodes; t->cap = (int32_t)cap;
    }
    if (trie_hash_full(t, want)) return trie_rehash(t, exact ? want : 2 * want);
    return 0;
}

/* u's child for `tok`, created (count 0) when absent, in one probe of the map; -1 on memory
 * error. *created says which. Room for one more node is made first, so the probe stays valid. */
int32_t trie_child_or_add(Tree *t, int32_t u, int32_t tok, int *created) {
    if (t->n >= t->cap || trie_hash_full(t, (int64_t)t->n))
        if (trie_reserve(t, (int64_t)t->n + 1, 0) < 0) return -1;
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

void trie_recompute(Tree *t) {
    Node *nd = t->nodes;
    for (int32_t i = 0; i < t->n; i++) { nd[i].childsum = 0.0; nd[i].best = -1; }
    for (int32_t v = 1; v < t->n; v++) {
        Node *p = &nd[nd[v].parent];
        p->childsum += nd[v].count;
        if (p->best < 0 || trie_better(&nd[v], &nd[p->best])) p->best = v;
    }
}

Tree *trie_alloc(PyTypeObject *type, int32_t max_depth) {
    Tree *t = (Tree *)type->tp_alloc(type, 0);
    if (!t) return NULL;
    t->max_depth = max_depth;
    t->n = 0;
    if (trie_reserve(t, 1, 0) < 0) { Py_DECREF(t); return NULL; }
    Node *r = &t->nodes[0];
    memset(r, 0, sizeof(Node));
    r->parent = -1; r->first_child = -1; r->next_sibling = -1; r->best = -1; r->token = -1;
    t->n = 1;
    return t;
}

/* One streamed token: every context in active[0..m] gains child `tok`, counted once. */
int trie_step(Tree *t, int32_t *active, int32_t *pm, int32_t tok) {
    int32_t m = *pm, D = t->max_depth;
    int created;
    for (int32_t L = m; L >= 0; L--) {
        int32_t v = trie_child_or_add(t, active[L], tok, &created);
        if (v < 0) return -1;
        trie_bump(t, v, 1.0);
        if (L + 1 <= D - 1) active[L + 1] = v;
    }
    *pm = m + 1 < D - 1 ? m + 1 : D - 1;
    return 0;
}

int32_t trie_walk(const Tree *t, const int32_t *toks, Py_ssize_t k) {
    int32_t u = 0;
    for (Py_ssize_t i = 0; i < k && u >= 0; i++) u = trie_find_child(t, u, toks[i]);
    return u;
}

/* Keep only nodes with keep[v] != 0 (a kept node's parent is kept); ids stay in order. */
int trie_compact(Tree *t, const char *keep) {
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
    return trie_rehash(t, n);
}
