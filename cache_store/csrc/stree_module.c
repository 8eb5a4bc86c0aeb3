/* The Python face of the suffix tree: the SuffixTree and Stream types of cache_store._stree
 * (wrapped by cache_store/suffix_tree.py) and reading token sequences from Python objects. */
#include "stree.h"

static PyTypeObject STreeType;

static int to_token(PyObject *o, int32_t *out) {
    PyObject *i = PyLong_Check(o) ? (Py_INCREF(o), o) : PyNumber_Index(o);
    if (!i) return -1;
    int overflow;
    long long x = PyLong_AsLongLongAndOverflow(i, &overflow);
    Py_DECREF(i);
    if (x == -1 && PyErr_Occurred()) return -1;
    if (overflow || x < 0 || x >= ST_TOKEN_LIMIT) {
        PyErr_SetString(PyExc_ValueError, "token id out of range [0, 2**31)");
        return -1;
    }
    *out = (int32_t)x;
    return 0;
}

/* The last `tail` tokens of `seq` (all when tail < 0) in a new array, validated before anything
 * changes; *k is how many. Lists and tuples are read directly, anything else through
 * PySequence_Fast (a numpy array, an iterator). */
/* A contiguous buffer of 4-byte ints (array('i'), numpy int32): copied and range-checked in
 * one pass, no Python ints made. Returns NULL without an error set if `seq` is not one. */
static int32_t *read_int32_buffer(PyObject *seq, Py_ssize_t tail, Py_ssize_t *k) {
    Py_buffer b;
    if (PyList_Check(seq) || PyTuple_Check(seq) || !PyObject_CheckBuffer(seq)) return NULL;
    if (PyObject_GetBuffer(seq, &b, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) { PyErr_Clear(); return NULL; }
    const char *f = b.format ? b.format : "B";
    if (*f == '<' || *f == '=' || *f == '@') f++;
    if (b.itemsize != 4 || b.ndim != 1 || !(f[0] == 'i' || f[0] == 'I' || f[0] == 'l') || f[1]) {
        PyBuffer_Release(&b);
        return NULL;
    }
    Py_ssize_t n = b.len / 4, m = (tail >= 0 && tail < n) ? tail : n;
    int32_t *buf = PyMem_RawMalloc(sizeof(int32_t) * (size_t)(m ? m : 1));
    if (!buf) { PyBuffer_Release(&b); PyErr_NoMemory(); return NULL; }
    memcpy(buf, (const int32_t *)b.buf + (n - m), sizeof(int32_t) * (size_t)m);
    PyBuffer_Release(&b);
    for (Py_ssize_t i = 0; i < m; i++)
        if (buf[i] < 0) { /* as int32: an 'I' value >= 2**31 too */
            PyMem_RawFree(buf);
            PyErr_SetString(PyExc_ValueError, "token id out of range [0, 2**31)");
            return NULL;
        }
    *k = m;
    return buf;
}

static int32_t *read_tokens(PyObject *seq, Py_ssize_t tail, Py_ssize_t *k) {
    int32_t *fastbuf = read_int32_buffer(seq, tail, k);
    if (fastbuf || PyErr_Occurred()) return fastbuf;
    PyObject *fast = (PyList_Check(seq) || PyTuple_Check(seq)) ? (Py_INCREF(seq), seq)
                                                                : PySequence_Fast(seq, "tokens must be a sequence of ints");
    if (!fast) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast), m = (tail >= 0 && tail < n) ? tail : n;
    int32_t *buf = PyMem_RawMalloc(sizeof(int32_t) * (size_t)(m ? m : 1));
    if (!buf) { Py_DECREF(fast); PyErr_NoMemory(); return NULL; }
    PyObject **items = PySequence_Fast_ITEMS(fast);
    for (Py_ssize_t i = 0; i < m; i++)
        if (to_token(items[n - m + i], &buf[i]) < 0) { PyMem_RawFree(buf); Py_DECREF(fast); return NULL; }
    Py_DECREF(fast);
    *k = m;
    return buf;
}

/* Exactly k token probabilities from `obj` (None: NULL without an error, all unknown): each
 * in [0, 1] or NaN (unknown). A buffer of float32 (array('f'), numpy) is copied as it is. */
static float *read_probs(PyObject *obj, Py_ssize_t k) {
    if (obj == Py_None) return NULL;
    float *p = PyMem_RawMalloc(sizeof(float) * (size_t)(k ? k : 1));
    if (!p) { PyErr_NoMemory(); return NULL; }
    Py_buffer b;
    if (PyObject_CheckBuffer(obj) && PyObject_GetBuffer(obj, &b, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) == 0) {
        const char *f = b.format ? b.format : "B";
        if (*f == '<' || *f == '=' || *f == '@') f++;
        int ok = b.itemsize == 4 && b.ndim == 1 && f[0] == 'f' && !f[1] && b.len / 4 == k;
        if (ok) memcpy(p, b.buf, sizeof(float) * (size_t)k);
        PyBuffer_Release(&b);
        if (!ok) goto bad;
    } else {
        PyErr_Clear();
        PyObject *fast = PySequence_Fast(obj, "probs must be a sequence of floats");
        if (!fast) { PyMem_RawFree(p); return NULL; }
        if (PySequence_Fast_GET_SIZE(fast) != k) { Py_DECREF(fast); goto bad; }
        for (Py_ssize_t i = 0; i < k; i++) {
            double x = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(fast, i));
            if (x == -1.0 && PyErr_Occurred()) { Py_DECREF(fast); PyMem_RawFree(p); return NULL; }
            p[i] = (float)x;
        }
        Py_DECREF(fast);
    }
    for (Py_ssize_t i = 0; i < k; i++)
        if (!isnan(p[i]) && !(p[i] >= 0.0f && p[i] <= 1.0f)) goto bad;
    return p;
bad:
    PyMem_RawFree(p);
    PyErr_SetString(PyExc_ValueError, "probs must hold one float32 in [0, 1] (or NaN) per token");
    return NULL;
}

/* ---------- SuffixTree ---------- */

static PyObject *STree_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"max_depth", NULL};
    int max_depth = 64;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|i", kwlist, &max_depth)) return NULL;
    if (max_depth < 2 || max_depth > ST_MAX_DEPTH)
        return PyErr_Format(PyExc_ValueError, "max_depth must be in [2, %d], got %d", ST_MAX_DEPTH, max_depth);
    STree *t = (STree *)type->tp_alloc(type, 0);
    if (!t) return NULL;
    if (st_init(t, max_depth) < 0) { Py_DECREF(t); return NULL; }
    return (PyObject *)t;
}

static void STree_dealloc(STree *t) {
    st_free(t);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

/* A finished sequence's tokens (and probabilities) into the sequence table, its windows not yet
 * in the tree; its id, or -1 with an error set. */
static int32_t push_sequence(STree *t, PyObject *seq, double weight, PyObject *probs) {
    if (!isfinite(weight) || weight <= 0) {
        PyErr_SetString(PyExc_ValueError, "weight must be finite and > 0");
        return -1;
    }
    Py_ssize_t k;
    int32_t *toks = read_tokens(seq, -1, &k);
    if (!toks) return -1;
    float *p = read_probs(probs, k);
    if (!p && PyErr_Occurred()) { PyMem_RawFree(toks); return -1; }
    int32_t s = st_seq_new(t, weight);
    int rc = s < 0 ? -1 : st_seq_push(t, s, toks, k);
    if (rc == 0 && p) rc = st_seq_set_probs(t, s, 0, p, k);
    PyMem_RawFree(toks); PyMem_RawFree(p);
    return rc < 0 ? -1 : s;
}

static PyObject *STree_add(STree *t, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"tokens", "weight", "probs", NULL};
    PyObject *seq, *probs = Py_None;
    double weight = 1.0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|dO", kwlist, &seq, &weight, &probs)) return NULL;
    int32_t s = push_sequence(t, seq, weight, probs);
    if (s < 0 || st_add_windows(t, s) < 0) return NULL;
    return PyLong_FromLong(s);
}

/* build(seqs, max_depth): a new tree holding every (tokens, weight[, probs]) of the sequence
 * `seqs`, trimmed. The sequences are read with the GIL held; their windows go in without it (no
 * other code can reach the new tree yet), so loads in several threads build at once. */
static PyObject *st_build(PyObject *self, PyObject *args) {
    PyObject *seqs, *fast, *item_args = NULL;
    int max_depth;
    if (!PyArg_ParseTuple(args, "Oi", &seqs, &max_depth)) return NULL;
    STree *t = (STree *)PyObject_CallFunction((PyObject *)&STreeType, "i", max_depth);
    if (!t) return NULL;
    if (!(fast = PySequence_Fast(seqs, "build takes a sequence of (tokens, weight[, probs])"))) goto fail;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); i++) {
        PyObject *tokens, *probs = Py_None, *item = PySequence_Fast_GET_ITEM(fast, i);
        double weight = 1.0;
        item_args = PySequence_Tuple(item);
        if (!item_args || !PyArg_ParseTuple(item_args, "O|dO", &tokens, &weight, &probs) ||
            push_sequence(t, tokens, weight, probs) < 0)
            goto fail;
        Py_CLEAR(item_args);
    }
    Py_CLEAR(fast);
    int rc = 0;
    Py_BEGIN_ALLOW_THREADS
    for (int32_t s = 0; s < t->nseq && rc == 0; s++) rc = st_add_windows(t, s);
    if (rc == 0) rc = st_trim(t);
    Py_END_ALLOW_THREADS
    if (rc < 0) goto fail;
    return (PyObject *)t;
fail:
    Py_XDECREF(item_args); Py_XDECREF(fast); Py_DECREF(t);
    return NULL;
}

static PyObject *STree_stream(STree *t, PyObject *unused) {
    int32_t s = st_seq_new(t, 1.0);
    if (s < 0 || st_stream_open(t, s) < 0) return NULL;
    Stream *st = PyObject_New(Stream, &StreamType);
    if (!st) { st_stream_close(t, s); return NULL; }
    Py_INCREF(t);
    st->tree = t; st->seq = s; st->closed = 0;
    return (PyObject *)st;
}

static PyObject *STree_count(STree *t, PyObject *seq) {
    Py_ssize_t k;
    int32_t *toks = read_tokens(seq, -1, &k);
    if (!toks) return NULL;
    double c = st_count(t, toks, k);
    PyMem_RawFree(toks);
    return PyFloat_FromDouble(c);
}

typedef PyObject *(*draft_fn)(STree *, int32_t, Py_ssize_t, Py_ssize_t, double);

static int check_draft_args(Py_ssize_t budget, double min_prob) {
    if (budget < 0) { PyErr_SetString(PyExc_ValueError, "budget must be >= 0"); return -1; }
    if (isnan(min_prob)) { PyErr_SetString(PyExc_ValueError, "min_prob must not be NaN"); return -1; }
    return 0;
}

static PyObject *run_draft(STree *t, PyObject *args, PyObject *kw, draft_fn fn) {
    static char *kwlist[] = {"context", "budget", "min_prob", NULL};
    PyObject *ctxo;
    Py_ssize_t budget = 16, k;
    double min_prob = 0.1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|nd", kwlist, &ctxo, &budget, &min_prob)) return NULL;
    if (check_draft_args(budget, min_prob) < 0) return NULL;
    int32_t *ctx = read_tokens(ctxo, st_match_cap(t, budget), &k), v = 0;
    if (!ctx) return NULL;
    Py_ssize_t m = st_match(t, ctx, k, st_match_cap(t, budget), &v);
    PyMem_RawFree(ctx);
    return fn(t, v, m, budget, min_prob);
}

static PyObject *STree_draft(STree *t, PyObject *args, PyObject *kw) { return run_draft(t, args, kw, st_draft); }
static PyObject *STree_draft_tree(STree *t, PyObject *args, PyObject *kw) { return run_draft(t, args, kw, st_draft_tree); }

static PyObject *STree_sequence(STree *t, PyObject *arg) {
    Py_ssize_t i = PyLong_AsSsize_t(arg);
    if (i == -1 && PyErr_Occurred()) return NULL;
    if (i < 0 || i >= t->nseq) { PyErr_SetString(PyExc_IndexError, "no such sequence"); return NULL; }
    const Seq *s = &t->seqs[i];
    return PyBytes_FromStringAndSize((const char *)s->tok, (Py_ssize_t)sizeof(int32_t) * s->len);
}

static PyObject *STree_sequence_probs(STree *t, PyObject *arg) {
    Py_ssize_t i = PyLong_AsSsize_t(arg);
    if (i == -1 && PyErr_Occurred()) return NULL;
    if (i < 0 || i >= t->nseq) { PyErr_SetString(PyExc_IndexError, "no such sequence"); return NULL; }
    const Seq *s = &t->seqs[i];
    if (!s->p) Py_RETURN_NONE;
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)sizeof(float) * s->len);
    if (!out) return NULL;
    float *f = (float *)PyBytes_AS_STRING(out);
    for (int32_t k = 0; k < s->len; k++) f[k] = st_unbyte(s->p[k]);
    return out;
}

/* Every node as (parent, first token, depth, F, in flight, child sum), for tests. */
static PyObject *STree_dump(STree *t, PyObject *unused) {
    PyObject *out = PyList_New(0);
    for (int32_t v = 0; out && v < t->n; v++) {
        const SNode *nd = &t->nodes[v];
        const Flight *e = st_flight(t, v);
        PyObject *x = Py_BuildValue("(iiidid)", nd->par, nd->ftok, st_dep(t, v), nd->F, e ? e->cnt : 0, nd->childsum);
        if (!x || PyList_Append(out, x) < 0) Py_CLEAR(out);
        Py_XDECREF(x);
    }
    return out;
}

static PyObject *STree_trim(STree *t, PyObject *unused) {
    if (st_trim(t) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *STree_memory_bytes(STree *t, PyObject *unused) {
    size_t b = sizeof(STree) + sizeof(SNode) * (size_t)t->cap + sizeof(int32_t) * (size_t)t->hcap +
               sizeof(Seq) * (size_t)t->seqcap + sizeof(Win) * (size_t)t->blockcap * t->max_depth +
               sizeof(Flight) * (size_t)t->fcap;
    for (int32_t s = 0; s < t->nseq; s++)
        b += (sizeof(int32_t) + (t->seqs[s].p ? sizeof(uint8_t) : 0)) * (size_t)t->seqs[s].cap;
    return PyLong_FromSize_t(b);
}

static PyObject *STree_get_nodes(STree *t, void *c) { return PyLong_FromLong(t->n - 1); }
static PyObject *STree_get_mass(STree *t, void *c) { return PyFloat_FromDouble(t->nodes[0].childsum); }
static PyObject *STree_get_max_depth(STree *t, void *c) { return PyLong_FromLong(t->max_depth); }
static PyObject *STree_get_sequences(STree *t, void *c) { return PyLong_FromLong(t->nseq); }
static PyObject *STree_get_tokens(STree *t, void *c) { return PyLong_FromLongLong(t->tokens); }
static PyObject *STree_get_live(STree *t, void *c) { return PyLong_FromLong(t->live); }

static PyMethodDef STree_methods[] = {
    {"add", (PyCFunction)(void (*)(void))STree_add, METH_VARARGS | METH_KEYWORDS,
     "add(tokens, weight=1.0, probs=None) -> sequence id: insert a finished sequence"},
    {"stream", (PyCFunction)STree_stream, METH_NOARGS, "stream() -> Stream for a live sequence (weight 1)"},
    {"count", (PyCFunction)STree_count, METH_O, "count(path) -> float"},
    {"draft", (PyCFunction)(void (*)(void))STree_draft, METH_VARARGS | METH_KEYWORDS,
     "draft(context, budget=16, min_prob=0.1) -> (tokens, probs, match_len)"},
    {"draft_tree", (PyCFunction)(void (*)(void))STree_draft_tree, METH_VARARGS | METH_KEYWORDS,
     "draft_tree(context, budget=16, min_prob=0.1) -> (tokens, parents, probs, match_len)"},
    {"sequence", (PyCFunction)STree_sequence, METH_O, "sequence(i) -> its tokens as native int32 bytes"},
    {"sequence_probs", (PyCFunction)STree_sequence_probs, METH_O,
     "sequence_probs(i) -> its token probabilities as native float32 bytes, or None"},
    {"_dump", (PyCFunction)STree_dump, METH_NOARGS, "nodes as (parent, first token, depth, F, in flight, child sum)"},
    {"trim", (PyCFunction)STree_trim, METH_NOARGS, "trim(): give back memory reserved for growth"},
    {"memory_bytes", (PyCFunction)STree_memory_bytes, METH_NOARGS, "bytes allocated by the tree"},
    {NULL}};

static PyGetSetDef STree_getset[] = {
    {"nodes", (getter)STree_get_nodes, NULL, "nodes, the root excluded", NULL},
    {"mass", (getter)STree_get_mass, NULL, "weighted tokens stored", NULL},
    {"max_depth", (getter)STree_get_max_depth, NULL, "longest window", NULL},
    {"sequences", (getter)STree_get_sequences, NULL, "sequences stored (live ones included)", NULL},
    {"tokens", (getter)STree_get_tokens, NULL, "tokens stored", NULL},
    {"live_streams", (getter)STree_get_live, NULL, "streams not yet closed", NULL},
    {NULL}};

static PyTypeObject STreeType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cache_store._stree.SuffixTree",
    .tp_basicsize = sizeof(STree),
    .tp_dealloc = (destructor)STree_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Depth-bounded, path-compressed suffix tree over weighted token sequences.",
    .tp_methods = STree_methods,
    .tp_getset = STree_getset,
    .tp_new = STree_new,
};

/* ---------- Stream ---------- */

static PyObject *Stream_extend(Stream *s, PyObject *args) {
    PyObject *seq, *probs = Py_None;
    if (!PyArg_ParseTuple(args, "O|O", &seq, &probs)) return NULL;
    if (s->closed) { PyErr_SetString(PyExc_ValueError, "the stream is closed"); return NULL; }
    Py_ssize_t k;
    int32_t *toks = read_tokens(seq, -1, &k);
    if (!toks) return NULL;
    float *p = read_probs(probs, k);
    if (!p && PyErr_Occurred()) { PyMem_RawFree(toks); return NULL; }
    int rc = st_stream_append(s, toks, k);
    if (rc == 0 && p) rc = st_seq_set_probs(s->tree, s->seq, s->tree->seqs[s->seq].len - k, p, k);
    PyMem_RawFree(toks); PyMem_RawFree(p);
    if (rc < 0) return NULL;
    Py_RETURN_NONE;
}

/* move(tree): this stream's sequence so far (tokens and probabilities) goes into `tree` as a new
 * sequence of its weight, live (its windows streamed token by token, as if it had been streamed
 * there from the start) or finished as this one is, and the stream continues there; in its old
 * tree the sequence is finished. How a live group moves onto a tree built off the step. */
static PyObject *Stream_move(Stream *s, PyObject *arg) {
    if (!PyObject_TypeCheck(arg, &STreeType)) { PyErr_SetString(PyExc_TypeError, "move takes a SuffixTree"); return NULL; }
    STree *to = (STree *)arg, *from = s->tree;
    if (to == from) { PyErr_SetString(PyExc_ValueError, "the stream is already in that tree"); return NULL; }
    const Seq *q = &from->seqs[s->seq];
    int32_t n = st_seq_new(to, q->weight);
    if (n < 0) return NULL;
    if (s->closed) {
        if (st_seq_push(to, n, q->tok, q->len) < 0) return NULL;
    } else {
        if (st_stream_open(to, n) < 0) return NULL;
        for (int32_t i = 0; i < q->len; i++)
            if (st_seq_push(to, n, q->tok + i, 1) < 0 || st_stream_step(to, n) < 0) return NULL;
    }
    Seq *d = &to->seqs[n];
    if (q->p) {
        if (!(d->p = PyMem_RawMalloc((size_t)(d->cap ? d->cap : 1)))) return PyErr_NoMemory();
        memcpy(d->p, q->p, (size_t)q->len);
    }
    if (s->closed ? st_add_windows(to, n) < 0 : st_stream_close(from, s->seq) < 0) return NULL;
    Py_INCREF(to);
    s->tree = to; s->seq = n;
    Py_DECREF(from);
    Py_RETURN_NONE;
}

static PyObject *Stream_close(Stream *s, PyObject *unused) {
    if (!s->closed) {
        s->closed = 1;
        if (st_stream_close(s->tree, s->seq) < 0) return NULL;
    }
    Py_RETURN_NONE;
}

/* A draft continuing the stream's own sequence: what tree.draft(its tokens) gives, with the
 * match read off the stream's windows (after close, matched the ordinary way). */
static PyObject *stream_draft(Stream *s, PyObject *args, PyObject *kw, draft_fn fn) {
    static char *kwlist[] = {"budget", "min_prob", NULL};
    Py_ssize_t budget = 16, m;
    double min_prob = 0.1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|nd", kwlist, &budget, &min_prob)) return NULL;
    if (check_draft_args(budget, min_prob) < 0) return NULL;
    int32_t v = 0;
    m = st_stream_locus(s, budget, &v);
    return fn(s->tree, v, m, budget, min_prob);
}

static PyObject *Stream_draft(Stream *s, PyObject *a, PyObject *k) { return stream_draft(s, a, k, st_draft); }
static PyObject *Stream_draft_tree(Stream *s, PyObject *a, PyObject *k) { return stream_draft(s, a, k, st_draft_tree); }

static void Stream_dealloc(Stream *s) {
    if (!s->closed && st_stream_close(s->tree, s->seq) < 0) PyErr_Clear();
    Py_XDECREF(s->tree);
    PyObject_Free(s);
}

static PyObject *Stream_get_seq(Stream *s, void *c) { return PyLong_FromLong(s->seq); }
static PyObject *Stream_get_len(Stream *s, void *c) { return PyLong_FromLong(s->tree->seqs[s->seq].len); }

static PyMethodDef Stream_methods[] = {
    {"extend", (PyCFunction)Stream_extend, METH_VARARGS,
     "extend(tokens, probs=None): append (with each token's probability) and insert every window"},
    {"close", (PyCFunction)Stream_close, METH_NOARGS, "close(): the sequence is finished"},
    {"move", (PyCFunction)Stream_move, METH_O, "move(tree): continue this sequence in another tree"},
    {"draft", (PyCFunction)(void (*)(void))Stream_draft, METH_VARARGS | METH_KEYWORDS,
     "draft(budget=16, min_prob=0.1) -> (tokens, probs, match_len), continuing this sequence"},
    {"draft_tree", (PyCFunction)(void (*)(void))Stream_draft_tree, METH_VARARGS | METH_KEYWORDS,
     "draft_tree(budget=16, min_prob=0.1) -> (tokens, parents, probs, match_len)"},
    {NULL}};

static PyGetSetDef Stream_getset[] = {
    {"sequence", (getter)Stream_get_seq, NULL, "the id of the sequence being written", NULL},
    {"length", (getter)Stream_get_len, NULL, "tokens written so far", NULL},
    {NULL}};

PyTypeObject StreamType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cache_store._stree.Stream",
    .tp_basicsize = sizeof(Stream),
    .tp_dealloc = (destructor)Stream_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A live sequence being appended to a suffix tree.",
    .tp_methods = Stream_methods,
    .tp_getset = Stream_getset,
};

static PyMethodDef module_methods[] = {
    {"build", st_build, METH_VARARGS, "build(seqs, max_depth) -> SuffixTree holding them (windows put in without the GIL)"},
    {"feed_many", st_feed_many, METH_VARARGS,
     "feed_many(streams, ids, slots, starts, ends, limits, eos, drafts, threads=1) -> (fed, accepted)"},
    {"draft_many", st_draft_many, METH_VARARGS, "draft_many(streams, rooms, min_prob, threads=1) -> drafts"},
    {"sample_draft", st_sample_draft, METH_VARARGS,
     "sample_draft(streams, budget, min_prob, random, stop=False) -> (tokens, qs, dists)"},
    {"merged_draft", st_merged_draft, METH_VARARGS, "merged_draft(streams, nodes, min_prob) -> (tokens, parents)"},
    {"pick_stream", st_pick_stream_py, METH_VARARGS, "pick_stream(streams, room, min_prob) -> the stream a row drafts from"},
    {NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_stree", "Compiled core of cache_store.suffix_tree.", -1,
                                    module_methods};

PyMODINIT_FUNC PyInit__stree(void) {
    if (PyType_Ready(&STreeType) < 0 || PyType_Ready(&StreamType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&STreeType);
    Py_INCREF(&StreamType);
    if (PyModule_AddObject(m, "SuffixTree", (PyObject *)&STreeType) < 0 ||
        PyModule_AddObject(m, "Stream", (PyObject *)&StreamType) < 0 ||
        PyModule_AddIntConstant(m, "MAX_DEPTH_LIMIT", ST_MAX_DEPTH) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
