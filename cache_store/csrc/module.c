/* The Python face of the compiled token tree: the Tree and Stream types of cache_store._trie
 * (wrapped by cache_store/trie.py), reading token sequences, decay, merge and copy. */
#include "trie.h"

static PyTypeObject TreeType;
static PyTypeObject StreamType;

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
int32_t *trie_read_tokens(PyObject *seq, Py_ssize_t tail, Py_ssize_t *len, Py_ssize_t *got) {
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

/* ---------- Tree methods ---------- */

static PyObject *Tree_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"max_depth", NULL};
    int max_depth = 64;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|i", kwlist, &max_depth)) return NULL;
    if (max_depth < 2 || max_depth > MAX_DEPTH_LIMIT)
        return PyErr_Format(PyExc_ValueError, "max_depth must be in [2, %d], got %d", MAX_DEPTH_LIMIT, max_depth);
    return (PyObject *)trie_alloc(type, max_depth);
}

static void Tree_dealloc(Tree *t) {
    PyMem_Free(t->nodes);
    PyMem_Free(t->hslots);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

static PyObject *Tree_insert(Tree *t, PyObject *seq) {
    Py_ssize_t n, k;
    int32_t *toks = trie_read_tokens(seq, -1, &n, &k);
    if (!toks) return NULL;
    int32_t active[MAX_DEPTH_LIMIT], m = 0;
    active[0] = 0;
    for (Py_ssize_t i = 0; i < k; i++)
        if (trie_step(t, active, &m, toks[i]) < 0) { PyMem_Free(toks); return NULL; }
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
    int32_t *toks = trie_read_tokens(seq, -1, &n, &k);
    if (!toks) return NULL;
    double c;
    if (k == 0) c = t->nodes[0].childsum;
    else if (k > t->max_depth) c = 0.0;
    else { int32_t u = trie_walk(t, toks, k); c = u >= 0 ? t->nodes[u].count : 0.0; }
    PyMem_Free(toks);
    return PyFloat_FromDouble(c);
}

/* ---------- decay, merge, copy ---------- */

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
    int rc = dropped ? trie_compact(t, keep) : 0;
    PyMem_Free(keep);
    trie_recompute(t);
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
        trie_recompute(t);
        Py_RETURN_NONE;
    }
    int32_t *map = PyMem_Malloc(sizeof(int32_t) * (size_t)o->n);
    if (!map) return PyErr_NoMemory();
    map[0] = 0;
    int rc = 0, created;
    for (int32_t i = 1; i < o->n; i++) {
        int32_t v = trie_child_or_add(t, map[o->nodes[i].parent], o->nodes[i].token, &created);
        if (v < 0) { rc = -1; break; }
        t->nodes[v].count += o->nodes[i].count;
        map[i] = v;
    }
    PyMem_Free(map);
    trie_recompute(t); /* also on failure: nodes added so far must stay consistent */
    if (rc < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *Tree_copy(Tree *t, PyObject *unused) {
    Tree *c = trie_alloc(Py_TYPE(t), t->max_depth);
    if (!c) return NULL;
    if (trie_reserve(c, t->n, 1) < 0) { Py_DECREF(c); return NULL; }
    memcpy(c->nodes, t->nodes, sizeof(Node) * (size_t)t->n);
    c->n = t->n;
    if (trie_rehash(c, t->n) < 0) { Py_DECREF(c); return NULL; }
    return (PyObject *)c;
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
        int32_t u = trie_walk(t, toks + s->hlen - L, L);
        if (u < 0) break;
        s->active[L] = u;
        s->m = L;
    }
    s->epoch = t->epoch;
}

static PyObject *Stream_extend(Stream *s, PyObject *seq) {
    Py_ssize_t n, k;
    int32_t *toks = trie_read_tokens(seq, -1, &n, &k);
    if (!toks) return NULL;
    Tree *t = s->tree;
    if (s->epoch != t->epoch) stream_resync(s);
    int32_t ring = t->max_depth - 1;
    for (Py_ssize_t i = 0; i < k; i++) {
        if (trie_step(t, s->active, &s->m, toks[i]) < 0) { PyMem_Free(toks); return NULL; }
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
