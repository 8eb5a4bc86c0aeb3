/* Many live streams in one call. An engine step feeds every row's new tokens to its streams
 * and drafts after every row; at 256 rows a Python loop over them costs more than the trees'
 * own work, so the vLLM proposer makes these two calls per step instead.
 *
 * feed_many: per row, the tokens ids[slot, start:end] are compared with the row's last draft
 * (how many it predicted: `accepted`), then appended to each of the row's streams up to
 * `limit` (an absolute position) and up to and including the first eos (`fed`).
 * draft_many: per row, a greedy draft of at most `room` tokens from each of its streams; the
 * one with the largest expected accepted length (the sum of its prefixes' path probabilities)
 * wins, the first stream on ties, exactly as srtcli.rollout.drafters.srt.best_draft picks. */
#include "stree.h"

/* A C-contiguous buffer of signed ints, `ndim` dimensions, 4 or 8 bytes an item. */
static int get_ints(PyObject *o, Py_buffer *b, int ndim, const char *what) {
    if (PyObject_GetBuffer(o, b, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) return -1;
    const char *f = b->format ? b->format : "B";
    if (*f == '<' || *f == '=' || *f == '@') f++;
    int ok = b->ndim == ndim && (b->itemsize == 4 || b->itemsize == 8) && strchr("ilq", f[0]) && !f[1];
    if (!ok) {
        PyBuffer_Release(b);
        PyErr_Format(PyExc_TypeError, "%s must be a C-contiguous %dd array of int32 or int64", what, ndim);
        return -1;
    }
    return 0;
}

static inline int64_t int_at(const Py_buffer *b, Py_ssize_t i) {
    return b->itemsize == 4 ? ((const int32_t *)b->buf)[i] : ((const int64_t *)b->buf)[i];
}

static inline Py_ssize_t items(const Py_buffer *b) { return b->len / b->itemsize; }

int st_is_streams(PyObject *o) {
    if (!PyTuple_Check(o)) return 0;
    for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(o); j++)
        if (!PyObject_TypeCheck(PyTuple_GET_ITEM(o, j), &StreamType)) return 0;
    return 1;
}

/* Row i's arguments, checked before any row is fed: a tuple of open streams, a draft list,
 * 0 <= start <= end <= the width of ids in a row of ids, and its new tokens in [0, 2**31). A
 * draft is a list of ints (the ids of the row's last draft). */
static int check_row(Py_ssize_t i, PyObject *streams, PyObject *draft, const Py_buffer *ids, int64_t slot,
                     int64_t a, int64_t e) {
    Py_ssize_t width = ids->shape[1];
    if (!st_is_streams(streams) || !PyList_Check(draft) || slot < 0 || slot >= ids->shape[0] || a < 0 || e < a ||
        e > width) {
        PyErr_Format(PyExc_ValueError, "row %zd: needs a tuple of streams, a draft list and 0 <= start <= end "
                     "<= the width of ids, in a row of ids", i);
        return -1;
    }
    for (Py_ssize_t j = 0; j < PyList_GET_SIZE(draft); j++)
        if (!PyLong_Check(PyList_GET_ITEM(draft, j))) {
            PyErr_Format(PyExc_ValueError, "row %zd: a draft is a list of token ids", i);
            return -1;
        }
    for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(streams); j++)
        if (((Stream *)PyTuple_GET_ITEM(streams, j))->closed) {
            PyErr_Format(PyExc_ValueError, "row %zd: the stream is closed", i);
            return -1;
        }
    for (int64_t j = a; j < e; j++) {
        int64_t x = int_at(ids, slot * width + j);
        if (x < 0 || x >= ST_TOKEN_LIMIT) {
            PyErr_Format(PyExc_ValueError, "row %zd: token id out of range [0, 2**31)", i);
            return -1;
        }
    }
    return 0;
}

/* Up to `stop` of the row's new tokens, and after the first eos no more. */
static Py_ssize_t cut_at_eos(const int32_t *toks, Py_ssize_t stop, const Py_buffer *eos) {
    for (Py_ssize_t c = 0; c < stop; c++)
        for (Py_ssize_t q = 0; q < items(eos); q++)
            if (int_at(eos, q) == toks[c]) return c + 1;
    return stop;
}

/* The common prefix of toks[0..k) and the list `draft`. */
static Py_ssize_t predicted(const int32_t *toks, Py_ssize_t k, PyObject *draft) {
    Py_ssize_t n = PyList_GET_SIZE(draft), a = 0;
    for (int over = 0; a < k && a < n; a++) /* an id past a long can match no token */
        if (PyLong_AsLongAndOverflow(PyList_GET_ITEM(draft, a), &over) != toks[a] || over) break;
    return a;
}

/* feed_many(streams, ids, slots, starts, ends, limits, eos, drafts, threads=1). Every row is
 * checked and its tokens cut (eos, limit) and compared with its draft with the GIL held; then
 * the appends run without it, on up to `threads` threads, one tree per thread at a time
 * (st_append_all), so the trees end as a row-by-row loop would leave them. */
PyObject *st_feed_many(PyObject *self, PyObject *args) {
    PyObject *streams, *ido, *slo, *sto, *eno, *lio, *eoso, *drafts, *fed = NULL, *acc = NULL;
    int32_t *toks = NULL;
    StAppend *jobs = NULL;
    int threads = 1;
    if (!PyArg_ParseTuple(args, "O!OOOOOOO!|i", &PyList_Type, &streams, &ido, &slo, &sto, &eno, &lio, &eoso,
                          &PyList_Type, &drafts, &threads))
        return NULL;
    Py_buffer ids, slots, starts, ends, limits, eos;
    int got = 0; /* buffers acquired, released in order at the end */
    Py_buffer *bufs[] = {&ids, &slots, &starts, &ends, &limits, &eos};
    PyObject *objs[] = {ido, slo, sto, eno, lio, eoso};
    const char *names[] = {"ids", "slots", "starts", "ends", "limits", "eos"};
    for (; got < 6; got++)
        if (get_ints(objs[got], bufs[got], got ? 1 : 2, names[got]) < 0) goto done;
    Py_ssize_t R = PyList_GET_SIZE(streams), width = ids.shape[1], total = 0, njobs = 0;
    if (items(&slots) != R || items(&starts) != R || items(&ends) != R || items(&limits) != R ||
        PyList_GET_SIZE(drafts) != R) {
        PyErr_SetString(PyExc_ValueError, "streams, slots, starts, ends, limits and drafts differ in length");
        goto done;
    }
    for (Py_ssize_t i = 0; i < R; i++) {
        PyObject *row = PyList_GET_ITEM(streams, i);
        if (check_row(i, row, PyList_GET_ITEM(drafts, i), &ids, int_at(&slots, i), int_at(&starts, i),
                      int_at(&ends, i)) < 0)
            goto done;
        total += (Py_ssize_t)(int_at(&ends, i) - int_at(&starts, i));
        njobs += PyTuple_GET_SIZE(row);
    }
    toks = PyMem_RawMalloc(sizeof(int32_t) * (size_t)(total ? total : 1));
    jobs = PyMem_RawMalloc(sizeof(StAppend) * (size_t)(njobs ? njobs : 1));
    fed = PyList_New(R); acc = PyList_New(R);
    if (!toks || !jobs || !fed || !acc) { PyErr_NoMemory(); goto fail; }
    njobs = 0;
    for (Py_ssize_t i = 0, at = 0; i < R; i++) {
        int64_t slot = int_at(&slots, i), a = int_at(&starts, i), lim = int_at(&limits, i);
        Py_ssize_t k = (Py_ssize_t)(int_at(&ends, i) - a), stop = lim < a ? 0 : (lim - a < k ? (Py_ssize_t)(lim - a) : k);
        int32_t *row = toks + at;
        for (Py_ssize_t j = 0; j < k; j++) row[j] = (int32_t)int_at(&ids, slot * width + a + j);
        at += k;
        Py_ssize_t cut = cut_at_eos(row, stop, &eos), hit = predicted(row, k, PyList_GET_ITEM(drafts, i));
        PyObject *st = PyList_GET_ITEM(streams, i), *x = PyLong_FromSsize_t(cut), *y = PyLong_FromSsize_t(hit);
        if (!x || !y) { Py_XDECREF(x); Py_XDECREF(y); goto fail; }
        PyList_SET_ITEM(fed, i, x); PyList_SET_ITEM(acc, i, y);
        for (Py_ssize_t j = 0; cut > 0 && j < PyTuple_GET_SIZE(st); j++)
            jobs[njobs++] = (StAppend){(Stream *)PyTuple_GET_ITEM(st, j), row, (int32_t)cut, 0};
    }
    int rc;
    PyObject *held = PyList_GetSlice(streams, 0, R); /* holds the rows' streams while the GIL is away */
    if (!held) goto fail;
    Py_BEGIN_ALLOW_THREADS
    rc = st_append_all(jobs, njobs, threads);
    Py_END_ALLOW_THREADS
    Py_DECREF(held);
    if (rc == 0) goto done;
fail:
    Py_CLEAR(fed); Py_CLEAR(acc);
done:
    PyMem_RawFree(toks); PyMem_RawFree(jobs);
    for (int b = 0; b < got; b++) PyBuffer_Release(bufs[b]);
    if (!fed) return NULL;
    return Py_BuildValue("(NN)", fed, acc);
}

static double expected_length(const double *probs, Py_ssize_t n) {
    double total = 0.0, path = 1.0;
    for (Py_ssize_t i = 0; i < n; i++) { path *= probs[i]; total += path; }
    return total;
}

/* Which of a row's streams drafts (its index): each stream's greedy draft of at most `room`
 * tokens, the largest expected accepted length winning, the first on ties. `toks`/`probs` have
 * room for two drafts of `room`; the winner's `*n` tokens are left at their start. */
Py_ssize_t st_best_stream(PyObject *streams, Py_ssize_t room, double min_prob, int32_t *toks, double *probs,
                          Py_ssize_t *n) {
    int32_t *win_t = toks, *cur_t = toks + room;
    double *win_p = probs, *cur_p = probs + room, best_len = 0.0;
    Py_ssize_t best_n = -1, best = 0;
    for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(streams); j++) {
        const Stream *s = (const Stream *)PyTuple_GET_ITEM(streams, j);
        int32_t v = 0;
        Py_ssize_t m = st_stream_locus(s, room, &v);
        Py_ssize_t k = st_draft_path(s->tree, v, m, room, min_prob, cur_t, cur_p);
        double len = expected_length(cur_p, k);
        if (best_n < 0 || len > best_len) { /* the current draft wins: it becomes the kept one */
            int32_t *t = win_t; win_t = cur_t; cur_t = t;
            double *p = win_p; win_p = cur_p; cur_p = p;
            best_n = k; best_len = len; best = j;
        }
    }
    *n = best_n > 0 ? best_n : 0;
    if (win_t != toks) {
        memcpy(toks, win_t, sizeof(int32_t) * (size_t)*n);
        memcpy(probs, win_p, sizeof(double) * (size_t)*n);
    }
    return best;
}

/* Rows shared out in chunks to the threads of draft_many: each row's winning draft goes to its
 * own `most` slots of `toks`, its length to `len`. Only reads the trees. */
#define DRAFT_CHUNK 16
typedef struct {
    PyObject **rows; /* each row's tuple of streams */
    const Py_buffer *rooms;
    double min_prob;
    Py_ssize_t R, most, next; /* next: the first row of the next chunk (atomic) */
    int32_t *toks;
    Py_ssize_t *len;
    int failed; /* atomic */
} Drafts;

static void *draft_rows(void *arg) {
    Drafts *d = arg;
    int32_t *toks = PyMem_RawMalloc(sizeof(int32_t) * 2 * (size_t)(d->most + 1));
    double *probs = PyMem_RawMalloc(sizeof(double) * 2 * (size_t)(d->most + 1));
    if (!toks || !probs) __atomic_store_n(&d->failed, 1, __ATOMIC_RELAXED);
    for (Py_ssize_t lo; toks && probs && (lo = __atomic_fetch_add(&d->next, DRAFT_CHUNK, __ATOMIC_RELAXED)) < d->R;)
        for (Py_ssize_t i = lo; i < lo + DRAFT_CHUNK && i < d->R; i++) {
            Py_ssize_t room = (Py_ssize_t)int_at(d->rooms, i), n = 0;
            if (room > 0) st_best_stream(d->rows[i], room, d->min_prob, toks, probs, &n);
            memcpy(d->toks + i * d->most, toks, sizeof(int32_t) * (size_t)n);
            d->len[i] = n;
        }
    PyMem_RawFree(toks); PyMem_RawFree(probs);
    return NULL;
}

/* draft_many(streams, rooms, min_prob, threads=1): the rows are checked with the GIL held, drafted
 * without it on up to `threads` threads, and their lists built with it again. */
PyObject *st_draft_many(PyObject *self, PyObject *args) {
    PyObject *streams, *roomo, *held = NULL, *out = NULL;
    double min_prob;
    int threads = 1;
    if (!PyArg_ParseTuple(args, "O!Od|i", &PyList_Type, &streams, &roomo, &min_prob, &threads)) return NULL;
    if (isnan(min_prob)) { PyErr_SetString(PyExc_ValueError, "min_prob must not be NaN"); return NULL; }
    Py_buffer rooms;
    if (get_ints(roomo, &rooms, 1, "rooms") < 0) return NULL;
    Drafts d = {NULL, &rooms, min_prob, PyList_GET_SIZE(streams), 0, 0, NULL, NULL, 0};
    if (items(&rooms) != d.R) { PyErr_SetString(PyExc_ValueError, "streams and rooms differ in length"); goto free; }
    for (Py_ssize_t i = 0; i < d.R; i++) {
        if (!st_is_streams(PyList_GET_ITEM(streams, i))) {
            PyErr_Format(PyExc_ValueError, "row %zd: needs a tuple of streams", i);
            goto free;
        }
        d.most = int_at(&rooms, i) > d.most ? (Py_ssize_t)int_at(&rooms, i) : d.most;
    }
    held = PyList_GetSlice(streams, 0, d.R); /* holds the rows' streams while the GIL is away */
    d.toks = PyMem_RawMalloc(sizeof(int32_t) * (size_t)(d.R * d.most + 1));
    d.len = PyMem_RawMalloc(sizeof(Py_ssize_t) * (size_t)(d.R + 1));
    if (!held || !d.toks || !d.len) { if (held) PyErr_NoMemory(); goto free; }
    d.rows = PySequence_Fast_ITEMS(held);
    Py_BEGIN_ALLOW_THREADS
    st_run_threads(threads, draft_rows, &d);
    Py_END_ALLOW_THREADS
    if (d.failed) { PyErr_NoMemory(); goto free; }
    out = PyList_New(d.R);
    for (Py_ssize_t i = 0; out && i < d.R; i++) {
        PyObject *draft = PyList_New(d.len[i]);
        for (Py_ssize_t j = 0; draft && j < d.len[i]; j++) {
            PyObject *x = PyLong_FromLong(d.toks[i * d.most + j]);
            if (!x) Py_CLEAR(draft);
            else PyList_SET_ITEM(draft, j, x);
        }
        if (!draft) Py_CLEAR(out);
        else PyList_SET_ITEM(out, i, draft);
    }
free:
    Py_XDECREF(held);
    PyMem_RawFree(d.toks); PyMem_RawFree(d.len);
    PyBuffer_Release(&rooms);
    return out;
}
