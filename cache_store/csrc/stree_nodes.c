/* The suffix tree's node table: growth, the (parent, first token) -> child map, leaves,
 * count bookkeeping on a parent, edge splits, closing a growing leaf, and the sequence table. */
#include "stree.h"

static void hash_put(STree *t, int32_t v) {
    uint32_t mask = t->hcap - 1, i = st_hash(t->nodes[v].par, t->nodes[v].ftok, t->hbits);
    while (t->hslots[i] >= 0) i = (i + 1) & mask;
    t->hslots[i] = v;
}

/* A map with room for `want` entries at load <= tenths / 10, every node inserted. */
static int rehash(STree *t, int64_t want, int tenths) {
    int bits = 4;
    while (10 * want > tenths * ((int64_t)1 << bits)) bits++;
    if (bits > 31) return st_fail(NULL, NULL);
    uint32_t cap = (uint32_t)1 << bits;
    int32_t *slots = PyMem_RawMalloc(sizeof(int32_t) * cap);
    if (!slots) return st_fail(NULL, NULL);
    memset(slots, 0xff, sizeof(int32_t) * cap);
    PyMem_RawFree(t->hslots);
    t->hslots = slots; t->hcap = cap; t->hbits = bits;
    for (int32_t v = 1; v < t->n; v++) hash_put(t, v);
    return 0;
}

/* Room for `extra` more nodes (arrays grow by half, the map at load 0.7). */
int st_reserve(STree *t, int32_t extra) {
    int64_t want = (int64_t)t->n + extra;
    if (want > INT32_MAX - 1) return st_fail(PyExc_MemoryError, "suffix tree: too many nodes");
    if (want > t->cap) {
        int64_t cap = t->cap < 64 ? 64 : t->cap + t->cap / 2;
        if (cap < want) cap = want;
        if (cap > INT32_MAX) cap = INT32_MAX;
        SNode *nodes = PyMem_RawRealloc(t->nodes, sizeof(SNode) * (size_t)cap);
        if (!nodes) return st_fail(NULL, NULL);
        t->nodes = nodes; t->cap = (int32_t)cap;
    }
    if (10 * want > 7 * (int64_t)t->hcap) return rehash(t, 2 * want, 7);
    return 0;
}

/* Give back what growth reserved: node and token arrays to their size, the map to the
 * smallest with load <= 0.7 (appends regrow them). */
int st_trim(STree *t) {
    SNode *nodes = PyMem_RawRealloc(t->nodes, sizeof(SNode) * (size_t)t->n);
    if (nodes) { t->nodes = nodes; t->cap = t->n; }
    for (int32_t i = 0; i < t->nseq; i++) {
        Seq *q = &t->seqs[i];
        if (q->stream >= 0 || q->cap == q->len || q->len == 0) continue;
        int32_t *a = PyMem_RawRealloc(q->tok, sizeof(int32_t) * (size_t)q->len);
        if (!a) continue;
        q->tok = a; q->cap = q->len;
        uint8_t *f = q->p ? PyMem_RawRealloc(q->p, (size_t)q->len) : NULL;
        if (f) q->p = f; /* a shrink that fails keeps the larger block: still room for cap */
    }
    return rehash(t, t->n, 7); /* the load growth allows, so the next append does not regrow it */
}

int st_init(STree *t, int32_t max_depth) {
    t->max_depth = max_depth;
    t->n = 0;
    if (st_reserve(t, 1) < 0) return -1;
    SNode *r = &t->nodes[0];
    memset(r, 0, sizeof(SNode));
    r->ftok = -1; r->par = -1; r->seq = 0; r->first_child = r->next_sibling = r->prev_sibling = -1;
    r->best = -1;
    t->n = 1;
    t->freeblock = -1;
    return 0;
}

void st_free(STree *t) {
    for (int32_t s = 0; s < t->nseq; s++) { PyMem_RawFree(t->seqs[s].tok); PyMem_RawFree(t->seqs[s].p); }
    PyMem_RawFree(t->seqs); PyMem_RawFree(t->nodes); PyMem_RawFree(t->hslots); PyMem_RawFree(t->wins);
    PyMem_RawFree(t->fmap);
    t->seqs = NULL; t->nodes = NULL; t->hslots = NULL; t->wins = NULL; t->fmap = NULL;
}

static inline int better(const STree *t, int32_t a, int32_t b) {
    double fa = st_F(t, a), fb = st_F(t, b);
    return fa > fb || (fa == fb && t->nodes[a].ftok < t->nodes[b].ftok);
}

/* c's first-point count F just grew by w: keep its parent's child sum and best child current. */
void st_enter(STree *t, int32_t c, double w) {
    SNode *nd = t->nodes;
    int32_t u = nd[c].par;
    nd[u].childsum += w;
    int32_t b = nd[u].best;
    if (b < 0 || (b != c && better(t, c, b))) nd[u].best = c;
}

static void link_child(STree *t, int32_t u, int32_t v) {
    SNode *nd = t->nodes;
    nd[v].par = u; nd[v].prev_sibling = -1; nd[v].next_sibling = nd[u].first_child;
    if (nd[u].first_child >= 0) nd[nd[u].first_child].prev_sibling = v;
    nd[u].first_child = v;
}

/* A new leaf under u whose path is seq[off ..] (first edge token `tok`), holding one window of
 * weight w that ends at it. `open`: it grows with its (live) sequence. -1 on memory error. */
int32_t st_new_leaf(STree *t, int32_t u, int32_t seq, int32_t off, int32_t tok, double w, int open) {
    if (st_reserve(t, 1) < 0) return -1;
    int32_t v = t->n++;
    SNode *nv = &t->nodes[v];
    nv->ftok = tok; nv->seq = seq; nv->off = off;
    nv->dep = -1;
    nv->first_child = -1; nv->best = -1;
    nv->F = w; nv->childsum = 0.0;
    if (!open) {
        int32_t d = t->seqs[seq].len - off;
        nv->dep = d < t->max_depth ? d : t->max_depth;
    }
    link_child(t, u, v);
    hash_put(t, v);
    st_enter(t, v, w);
    return v;
}

/* Split the edge into v at depth d (dep(par) < d < dep(v)): a new node m takes v's place
 * under its parent and v hangs below m. Windows in flight on the old edge go to m's edge
 * (depth < d), to m's end (depth == d) or stay on v's (depth > d); F[m] is the old F[v], and
 * F[v] loses the windows that no longer reach its first point (an exact integer subtraction).
 * Returns m, or -1 on memory error (nothing changed). */
int32_t st_split(STree *t, int32_t v, int32_t d) {
    if (st_reserve(t, 1) < 0) return -1;
    SNode *nd = t->nodes;
    int32_t m = t->n++, u = nd[v].par;
    nd[m] = nd[v];
    nd[m].dep = d; nd[m].first_child = v; nd[m].best = v;
    /* m takes v's place among u's children and in the map (same key: u and v's first token) */
    if (nd[v].prev_sibling >= 0) nd[nd[v].prev_sibling].next_sibling = m;
    else nd[u].first_child = m;
    if (nd[v].next_sibling >= 0) nd[nd[v].next_sibling].prev_sibling = m;
    if (nd[u].best == v) nd[u].best = m;
    uint32_t mask = t->hcap - 1, i = st_hash(u, nd[v].ftok, t->hbits);
    while (t->hslots[i] != v) i = (i + 1) & mask;
    t->hslots[i] = m;
    nd[v].par = m; nd[v].prev_sibling = nd[v].next_sibling = -1;
    nd[v].ftok = st_tok(t, v, d);
    hash_put(t, v);
    Flight *e = st_flight(t, v);
    if (e) {
        int32_t w = e->head, gone = 0;
        e->head = -1; e->cnt = 0; /* refilled with the windows below d (the entry stays put) */
        int32_t up = -1;
        while (w >= 0) {
            Win *x = &t->wins[w];
            int32_t next = x->next, *head = NULL;
            if (x->depth > d) { head = &e->head; e->cnt++; x->node = v; }
            else { gone++; x->node = m; if (x->depth < d) head = &up; }
            x->prev = -1; x->next = -1;
            if (head) {
                x->next = *head;
                if (*head >= 0) t->wins[*head].prev = w;
                *head = w;
            }
            w = next;
        }
        nd[v].F -= (double)gone;
        if (e->cnt == 0) st_flight_remove_entry(t, v);
        for (w = up; w >= 0; ) { /* the windows above d are in flight on m's edge now */
            int32_t next = t->wins[w].next;
            st_flight_push(t, m, w);
            w = next;
        }
    }
    nd[m].childsum = nd[v].F;
    return m;
}

/* Fix the depth of a growing leaf at its current length and turn its owner window into a
 * walker at its end (some other window needs that end point). */
void st_close_leaf(STree *t, int32_t v) {
    SNode *nv = &t->nodes[v];
    nv->dep = st_dep(t, v);
    const Seq *s = &t->seqs[nv->seq];
    if (s->stream < 0) return;
    Win *x = &t->wins[(size_t)s->stream * t->max_depth + nv->off % t->max_depth];
    if (x->state == W_OWNER && x->start == nv->off && x->seq == nv->seq) {
        x->state = W_WALK; x->node = v; x->depth = nv->dep;
    }
}

int32_t st_seq_new(STree *t, double weight) {
    if (t->nseq >= ST_MAX_SEQS) {
        PyErr_Format(PyExc_MemoryError, "a suffix tree holds at most %d sequences", ST_MAX_SEQS);
        return -1;
    }
    if (t->nseq == t->seqcap) {
        int32_t cap = t->seqcap < 16 ? 16 : t->seqcap * 2;
        Seq *s = PyMem_RawRealloc(t->seqs, sizeof(Seq) * (size_t)cap);
        if (!s) { PyErr_NoMemory(); return -1; }
        t->seqs = s; t->seqcap = cap;
    }
    Seq *s = &t->seqs[t->nseq];
    s->tok = NULL; s->p = NULL; s->len = 0; s->cap = 0; s->stream = -1; s->weight = weight;
    return t->nseq++;
}

/* Append k tokens to sequence s's array (not yet to the tree). */
int st_seq_push(STree *t, int32_t s, const int32_t *tok, Py_ssize_t k) {
    Seq *q = &t->seqs[s];
    if (k == 0) return 0;
    if ((int64_t)q->len + k > INT32_MAX) return st_fail(PyExc_MemoryError, "sequence too long");
    if (q->len + k > q->cap) {
        int64_t cap = q->cap < 16 ? 16 : (int64_t)q->cap * 2;
        if (cap < q->len + k) cap = q->len + k;
        if (cap > INT32_MAX) cap = INT32_MAX;
        if (q->p) {
            uint8_t *f = PyMem_RawRealloc(q->p, (size_t)cap);
            if (!f) return st_fail(NULL, NULL);
            q->p = f;
        }
        int32_t *a = PyMem_RawRealloc(q->tok, sizeof(int32_t) * (size_t)cap);
        if (!a) return st_fail(NULL, NULL);
        q->tok = a; q->cap = (int32_t)cap;
    }
    memcpy(q->tok + q->len, tok, sizeof(int32_t) * (size_t)k);
    if (q->p) memset(q->p + q->len, P_UNKNOWN, (size_t)k);
    q->len += (int32_t)k;
    return 0;
}

/* Set the probabilities of tokens [from, from + k) of sequence s (already pushed); the array
 * is made on first use, unknown (NaN) everywhere else. */
int st_seq_set_probs(STree *t, int32_t s, Py_ssize_t from, const float *p, Py_ssize_t k) {
    Seq *q = &t->seqs[s];
    if (k == 0) return 0;
    if (!q->p) {
        q->p = PyMem_RawMalloc((size_t)(q->cap ? q->cap : 1));
        if (!q->p) { PyErr_NoMemory(); return -1; }
        memset(q->p, P_UNKNOWN, (size_t)q->len);
    }
    for (Py_ssize_t i = 0; i < k; i++) q->p[from + i] = st_byte(p[i]);
    return 0;
}
