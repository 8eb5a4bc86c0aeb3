/* Shared declarations of the token tree's compiled core (cache_store._trie).
 *
 * The core is split by concept: nodes.c (the node table, its hash map, insertion, compaction),
 * draft.c (matching the context and drafting), bytes.c (the serialised node table) and
 * module.c (the Python types). Read docs/cache.md ("The tree") for the semantics. Nodes live
 * in one array (node 0 is the root, a child always has a larger id than its parent), children
 * hang off first_child/next_sibling lists, and an open-addressing hash map (parent, token) ->
 * child gives O(1) lookups; its slots hold only node ids (the key is read from the node itself,
 * which a lookup touches anyway), 4 bytes a slot at load <= 0.7. Every node caches the sum of
 * its children's counts and its best child (highest count, then lowest token), so drafting
 * never scans siblings. Dropping nodes (scale with a floor) compacts the arrays and bumps
 * `epoch`, which tells open streams to re-find their context nodes.
 *
 * Every entry point runs with the GIL held: Python threads never see a half-updated tree.
 */
#ifndef SRT_TRIE_H
#define SRT_TRIE_H

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

#define KEY(u, tok) (((uint64_t)(uint32_t)(u) << 32) | (uint32_t)(tok))

static inline uint32_t hslot(uint64_t key, int bits) {
    return (uint32_t)((key * 0x9E3779B97F4A7C15ULL) >> (64 - bits));
}

static inline int32_t trie_find_child(const Tree *t, int32_t u, int32_t tok) {
    uint32_t mask = t->hcap - 1, i = hslot(KEY(u, tok), t->hbits);
    for (;;) {
        int32_t v = t->hslots[i];
        if (v < 0) return -1;
        if (t->nodes[v].parent == u && t->nodes[v].token == tok) return v;
        i = (i + 1) & mask;
    }
}

static inline int trie_hash_full(const Tree *t, int64_t entries) { return 10 * entries > 7 * (int64_t)t->hcap; }

static inline int trie_better(const Node *a, const Node *b) {
    return a->count > b->count || (a->count == b->count && a->token < b->token);
}

/* Add x to v's count and keep the parent's child sum and best child current. */
static inline void trie_bump(Tree *t, int32_t v, double x) {
    Node *nd = t->nodes;
    nd[v].count += x;
    Node *p = &nd[nd[v].parent];
    p->childsum += x;
    if (p->best < 0 || (p->best != v && trie_better(&nd[v], &nd[p->best]))) p->best = v;
}

/* nodes.c */
int trie_rehash(Tree *t, int64_t want);
int trie_reserve(Tree *t, int64_t want, int exact);
int32_t trie_child_or_add(Tree *t, int32_t u, int32_t tok, int *created);
void trie_recompute(Tree *t);
Tree *trie_alloc(PyTypeObject *type, int32_t max_depth);
int trie_step(Tree *t, int32_t *active, int32_t *pm, int32_t tok);
int32_t trie_walk(const Tree *t, const int32_t *toks, Py_ssize_t k);
int trie_compact(Tree *t, const char *keep);

/* module.c */
int32_t *trie_read_tokens(PyObject *seq, Py_ssize_t tail, Py_ssize_t *len, Py_ssize_t *got);

/* draft.c */
PyObject *Tree_draft(Tree *t, PyObject *args, PyObject *kw);
PyObject *Tree_draft_tree(Tree *t, PyObject *args, PyObject *kw);

/* bytes.c */
PyObject *Tree_to_bytes(Tree *t, PyObject *unused);
PyObject *Tree_from_bytes(PyObject *cls, PyObject *arg);

#endif
