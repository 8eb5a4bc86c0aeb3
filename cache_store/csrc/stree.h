/* Shared declarations of the path-compressed suffix tree (cache_store._stree).
 *
 * The tree holds every window s[i .. i+D) of every stored sequence s (D = max_depth), path
 * compressed: a node is the lower end of an edge, and its label is read from the sequence
 * arrays (node v's path is tokens of sequence seq[v] from off[v], dep(v) tokens long), so a
 * node is a few int32 and two doubles and a token is stored once, as int32.
 *
 * Counts. F[v] is the weighted number of windows whose content passes the first point of the
 * edge into v (what drafting ranks children by); every node caches its children's F sum and
 * its best child (highest F, then lowest first token). A live (streamed) window whose content
 * currently ends strictly inside an edge is "in flight" there: it sits in that edge's
 * in-flight list, kept in a small side map (node -> list head, length) because only the last
 * max_depth windows of each live stream can be in flight. The count at a point of an edge is F
 * minus the windows in flight above that point; live windows weigh 1, so that subtraction is
 * exact. Windows of finished sequences always end at nodes (an end inside an edge splits it).
 *
 * A split gives the upper part a new node id and keeps the lower part (and so every leaf, its
 * children and every window at its end) under the old one; windows in flight on the split
 * edge are moved to the side they are on. Siblings are doubly linked, so the new upper node
 * takes the old one's place among its siblings in O(1).
 *
 * A leaf created by a live window (its "owner") grows with the sequence for free: its depth
 * is min(D, length - off) while dep[v] < 0. When another window needs the end point of such
 * a leaf, the leaf is closed (its depth fixed) and the owner becomes a walker at that end.
 *
 * Every entry point runs with the GIL held, except the part of a bulk load that puts windows in
 * (`build`): st_reserve, st_add_windows and st_trim may run without it, so the tree's memory
 * is PyMem_Raw* throughout and their errors are set through st_fail, which takes the GIL.
 */
#ifndef SRT_STREE_H
#define SRT_STREE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define ST_MAX_DEPTH 1024
#define ST_TOKEN_LIMIT 2147483648LL

/* 48 bytes, packed to 4-byte alignment (x86 and arm64 read unaligned doubles at full speed);
 * the sequence id and the depth share a word, so a tree holds at most ST_MAX_SEQS sequences. */
typedef struct __attribute__((packed, aligned(4))) {
    int32_t ftok, par, off, first_child, next_sibling, prev_sibling, best;
    int32_t seq : 20, dep : 12; /* dep: 0..ST_MAX_DEPTH, or -1 for a growing leaf */
    double F, childsum;
} SNode;
_Static_assert(sizeof(SNode) == 48, "a node is 48 bytes");
#define ST_MAX_SEQS ((1 << 19) - 1)

typedef struct { int32_t node, head, cnt; } Flight; /* node < 0: empty slot */

/* p-hat in one byte, the LMDB record's own coding (cache_store.seqrecord.as_probs): in memory
 * the tree drafts by exactly what a load from the store gives it back. */
#define P_STEPS 254
#define P_UNKNOWN 255
static inline uint8_t st_byte(float p) {
    return isnan(p) ? P_UNKNOWN : (uint8_t)lrint((double)p * P_STEPS);
}
static inline float st_unbyte(uint8_t b) { return b == P_UNKNOWN ? NAN : (float)b / (float)P_STEPS; }

typedef struct {
    int32_t *tok;
    uint8_t *p; /* the policy's probability of each token when it was generated, one byte as
                 * the store keeps it (round(p x 254); P_UNKNOWN: unknown); NULL while every
                 * token's is unknown */
    int32_t len, cap;
    int32_t stream; /* window block of the live stream writing it; -1 when finished */
    double weight;
} Seq;

enum { W_FREE = 0, W_WALK = 1, W_OWNER = 2 };

/* One window of a live stream: its locus (node hint, depth) and its in-flight list links. */
typedef struct {
    int32_t node, depth, prev, next;
    int32_t state, seq, start;
} Win;

typedef struct {
    PyObject_HEAD
    SNode *nodes;
    int32_t n, cap;
    int32_t *hslots;
    uint32_t hcap;
    int hbits;
    Seq *seqs;
    int32_t nseq, seqcap;
    Flight *fmap;     /* in-flight lists by node: open addressing, load <= 1/2 */
    uint32_t fcap;
    Win *wins;        /* blocks of max_depth windows, one block per live stream */
    int32_t nblocks, blockcap, freeblock; /* free blocks chained through wins[b*D].next */
    int32_t max_depth;
    int64_t tokens;
    int32_t live;
} STree;

/* A live sequence being appended to a tree (cache_store._stree.Stream). */
typedef struct {
    PyObject_HEAD
    STree *tree;
    int32_t seq;
    int closed;
} Stream;
extern PyTypeObject StreamType;

/* Set `exc` (NULL: MemoryError) with `msg` and return -1, with or without the GIL held. */
static inline int st_fail(PyObject *exc, const char *msg) {
    PyGILState_STATE g = PyGILState_Ensure();
    if (exc) PyErr_SetString(exc, msg);
    else PyErr_NoMemory();
    PyGILState_Release(g);
    return -1;
}

static inline int32_t st_tok(const STree *t, int32_t v, int32_t k) {
    return t->seqs[t->nodes[v].seq].tok[t->nodes[v].off + k];
}

/* p-hat of the d-th token (1-based) of node v's path: the probability the policy gave it in the
 * sequence the node points into (NaN when unknown). */
static inline float st_prob(const STree *t, int32_t v, int32_t d) {
    const Seq *q = &t->seqs[t->nodes[v].seq];
    return q->p ? st_unbyte(q->p[t->nodes[v].off + d - 1]) : NAN;
}

static inline int st_open(const STree *t, int32_t v) { return t->nodes[v].dep < 0; }

static inline int32_t st_dep(const STree *t, int32_t v) {
    const SNode *nd = &t->nodes[v];
    if (nd->dep >= 0) return nd->dep;
    int32_t d = t->seqs[nd->seq].len - nd->off;
    return d < t->max_depth ? d : t->max_depth;
}

static inline double st_F(const STree *t, int32_t v) { return t->nodes[v].F; }

static inline uint32_t st_hash(int32_t u, int32_t tok, int bits) {
    uint64_t key = ((uint64_t)(uint32_t)u << 32) | (uint32_t)tok;
    return (uint32_t)((key * 0x9E3779B97F4A7C15ULL) >> (64 - bits));
}

static inline int32_t st_child(const STree *t, int32_t u, int32_t tok) {
    uint32_t mask = t->hcap - 1, i = st_hash(u, tok, t->hbits);
    for (;;) {
        int32_t v = t->hslots[i];
        if (v < 0) return -1;
        if (t->nodes[v].par == u && t->nodes[v].ftok == tok) return v;
        i = (i + 1) & mask;
    }
}

/* stree_nodes.c: the node table, splits, leaves, counts */
int st_init(STree *t, int32_t max_depth);
int st_reserve(STree *t, int32_t extra);
int st_trim(STree *t);
void st_free(STree *t);
int32_t st_new_leaf(STree *t, int32_t u, int32_t seq, int32_t off, int32_t tok, double w, int open);
void st_enter(STree *t, int32_t c, double w);
int32_t st_split(STree *t, int32_t v, int32_t d);
void st_close_leaf(STree *t, int32_t v);
int32_t st_seq_new(STree *t, double weight);
Flight *st_flight(const STree *t, int32_t v);
int st_flight_room(STree *t, int64_t entries);
void st_flight_push(STree *t, int32_t v, int32_t slot);
void st_flight_remove(STree *t, int32_t v, int32_t slot);
void st_flight_remove_entry(STree *t, int32_t v);
int st_seq_push(STree *t, int32_t s, const int32_t *tok, Py_ssize_t k);
int st_seq_set_probs(STree *t, int32_t s, Py_ssize_t from, const float *p, Py_ssize_t k);

/* stree_insert.c: whole sequences and live streams */
int st_add_windows(STree *t, int32_t s);
int st_stream_open(STree *t, int32_t s);
int st_stream_step(STree *t, int32_t s);
int st_stream_close(STree *t, int32_t s);
int st_stream_append(Stream *s, const int32_t *toks, Py_ssize_t k);

/* stree_draft.c, stree_dtree.c */
int st_walk(const STree *t, const int32_t *toks, Py_ssize_t k, int32_t *node);
double st_count(const STree *t, const int32_t *toks, Py_ssize_t k);
Py_ssize_t st_draft_path(const STree *t, int32_t v, Py_ssize_t m, Py_ssize_t budget, double min_prob,
                         int32_t *toks, double *probs);
PyObject *st_draft(STree *t, int32_t v, Py_ssize_t m, Py_ssize_t budget, double min_prob);
PyObject *st_draft_tree(STree *t, int32_t v, Py_ssize_t m, Py_ssize_t budget, double min_prob);
/* A draft tree in arrays: node i has token tok[i], parent par[i] (-1: the root's child; parents
 * come first), child frequency c[i] and p-hat ph[i] (the policy's probability of the token in
 * the stored sequence the node points into; NaN: unknown). */
typedef struct { int32_t *tok, *par; double *c; float *ph; Py_ssize_t n; } DTree;
int st_dtree_build(const STree *t, int32_t v, Py_ssize_t m, Py_ssize_t budget, double min_prob, DTree *d);
void st_dtree_free(DTree *d);
Py_ssize_t st_stream_match(const STree *t, int32_t s, Py_ssize_t cap, int32_t *node);
Py_ssize_t st_match_cap(const STree *t, Py_ssize_t budget);
Py_ssize_t st_match(const STree *t, const int32_t *ctx, Py_ssize_t k, Py_ssize_t cap, int32_t *node);
Py_ssize_t st_stream_locus(const Stream *s, Py_ssize_t budget, int32_t *node);

/* stree_parallel.c: appends to many streams, one thread per tree at a time (no GIL needed) */
#define ST_MAX_THREADS 16
typedef struct { Stream *stream; const int32_t *toks; int32_t n; Py_ssize_t order; } StAppend;
int st_append_all(StAppend *jobs, Py_ssize_t n, int threads);
void st_run_threads(int threads, void *(*worker)(void *), void *arg);

/* stree_batch.c: many streams in one call */
PyObject *st_feed_many(PyObject *self, PyObject *args);
PyObject *st_draft_many(PyObject *self, PyObject *args);
int st_is_streams(PyObject *o);
Py_ssize_t st_best_stream(PyObject *streams, Py_ssize_t room, double min_prob, int32_t *toks, double *probs,
                          Py_ssize_t *n);
PyObject *st_sample_draft(PyObject *self, PyObject *args);
PyObject *st_pick_stream_py(PyObject *self, PyObject *args);
/* A row's streams in the order its drafts use them: the picked one first, then the others. */
static inline const Stream *st_picked_first(PyObject *streams, Py_ssize_t pick, Py_ssize_t k) {
    return (const Stream *)PyTuple_GET_ITEM(streams, k == 0 ? pick : (k - 1 < pick ? k - 1 : k));
}

int st_check_row(PyObject *streams, Py_ssize_t size, double min_prob, const char *fn);
Py_ssize_t st_pick_stream(PyObject *streams, Py_ssize_t room, double min_prob);
int st_row_dtrees(PyObject *streams, Py_ssize_t pick, Py_ssize_t nt, Py_ssize_t budget, double min_prob, DTree *d);

/* stree_merge.c: a row's draft trees as one */
PyObject *st_merged_draft(PyObject *self, PyObject *args);

#endif
