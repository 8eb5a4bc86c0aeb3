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

static int feed_row(PyObject *streams, const int32_t *toks, Py_ssize_t k) {
    for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(streams); j++)
        if (st_stream_append((Stream *)PyTuple_GET_ITEM(streams, j), toks, k) < 0) return -1;
    return 0;
}

PyObject *st_feed_many(PyObject *self, PyObject *args) {
    PyObject *streams, *ido, *slo, *sto, *eno, *lio, *eoso, *drafts, *fed = NULL, *acc = NULL;
    int32_t *row = NULL;
    if (!PyArg_ParseTuple(args, "O!OOOOOOO!", &PyList_Type, &streams, &ido, &slo, &sto, &eno, &lio, &eoso,
                          &PyList_Type, &drafts))
        return NULL;
    Py_buffer ids, slots, starts, ends, limits, eos;
    int got = 0; /* buffers acquired, released in order at the end */
    Py_buffer *bufs[] = {&ids, &slots, &starts, &ends, &limits, &eos};
    PyObject *objs[] = {ido, slo, sto, eno, lio, eoso};
    const char *names[] = {"ids", "slots", "starts", "ends", "limits", "eos"};
    for (; got < 6; got++)
        if (get_ints(objs[got], bufs[got], got ? 1 : 2, names[got]) < 0) goto done;
    Py_ssize_t R = PyList_GET_SIZE(streams), width = ids.shape[1];
    if (items(&slots) != R || items(&starts) != R || items(&ends) != R || items(&limits) != R ||
        PyList_GET_SIZE(drafts) != R) {
        PyErr_SetString(PyExc_ValueError, "streams, slots, starts, ends, limits and drafts differ in length");
        goto done;
    }
    for (Py_ssize_t i = 0; i < R; i++)
        if (check_row(i, PyList_GET_ITEM(streams, i), PyList_GET_ITEM(drafts, i), &ids, int_at(&slots, i),
                      int_at(&starts, i), int_at(&ends, i)) < 0)
            goto done;
    row = PyMem_RawMalloc(sizeof(int32_t) * (size_t)(width ? width : 1));
    fed = PyList_New(R); acc = PyList_New(R);
    if (!row || !fed || !acc) { PyErr_NoMemory(); goto fail; }
    for (Py_ssize_t i = 0; i < R; i++) {
        int64_t slot = int_at(&slots, i), a = int_at(&starts, i), lim = int_at(&limits, i);
        Py_ssize_t k = (Py_ssize_t)(int_at(&ends, i) - a), stop = lim < a ? 0 : (lim - a < k ? (Py_ssize_t)(lim - a) : k);
        for (Py_ssize_t j = 0; j < k; j++) row[j] = (int32_t)int_at(&ids, slot * width + a + j);
        Py_ssize_t cut = cut_at_eos(row, stop, &eos), hit = predicted(row, k, PyList_GET_ITEM(drafts, i));
        if (feed_row(PyList_GET_ITEM(streams, i), row, cut) < 0) goto fail;
        PyObject *x = PyLong_FromSsize_t(cut), *y = PyLong_FromSsize_t(hit);
        if (!x || !y) { Py_XDECREF(x); Py_XDECREF(y); goto fail; }
        PyList_SET_ITEM(fed, i, x); PyList_SET_ITEM(acc, i, y);
    }
    PyMem_RawFree(row);
    goto done;
fail:
    PyMem_RawFree(row);
    Py_CLEAR(fed); Py_CLEAR(acc);
done:
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

/* The winning draft of one row, as a list. */
static PyObject *draft_row(PyObject *streams, Py_ssize_t room, double min_prob, int32_t *toks, double *probs) {
    Py_ssize_t n;
    st_best_stream(streams, room, min_prob, toks, probs, &n);
    PyObject *out = PyList_New(n);
    for (Py_ssize_t i = 0; out && i < n; i++) {
        PyObject *x = PyLong_FromLong(toks[i]);
        if (!x) { Py_CLEAR(out); break; }
        PyList_SET_ITEM(out, i, x);
    }
    return out;
}

PyObject *st_draft_many(PyObject *self, PyObject *args) {
    PyObject *streams, *roomo, *out = NULL;
    int32_t *toks = NULL;
    double min_prob, *probs = NULL;
    if (!PyArg_ParseTuple(args, "O!Od", &PyList_Type, &streams, &roomo, &min_prob)) return NULL;
    if (isnan(min_prob)) { PyErr_SetString(PyExc_ValueError, "min_prob must not be NaN"); return NULL; }
    Py_buffer rooms;
    if (get_ints(roomo, &rooms, 1, "rooms") < 0) return NULL;
    Py_ssize_t R = PyList_GET_SIZE(streams), most = 0;
    if (items(&rooms) != R) { PyErr_SetString(PyExc_ValueError, "streams and rooms differ in length"); goto free; }
    for (Py_ssize_t i = 0; i < R; i++) most = int_at(&rooms, i) > most ? (Py_ssize_t)int_at(&rooms, i) : most;
    toks = PyMem_RawMalloc(sizeof(int32_t) * 2 * (size_t)(most + 1));
    probs = PyMem_RawMalloc(sizeof(double) * 2 * (size_t)(most + 1));
    out = PyList_New(R);
    if (!toks || !probs || !out) { PyErr_NoMemory(); Py_CLEAR(out); goto free; }
    for (Py_ssize_t i = 0; i < R; i++) {
        PyObject *st = PyList_GET_ITEM(streams, i), *d;
        Py_ssize_t room = (Py_ssize_t)int_at(&rooms, i);
        if (!st_is_streams(st)) { PyErr_Format(PyExc_ValueError, "row %zd: needs a tuple of streams", i); Py_CLEAR(out); goto free; }
        d = room > 0 ? draft_row(st, room, min_prob, toks, probs) : PyList_New(0);
        if (!d) { Py_CLEAR(out); goto free; }
        PyList_SET_ITEM(out, i, d);
    }
free:
    PyMem_RawFree(toks); PyMem_RawFree(probs);
    PyBuffer_Release(&rooms);
    return out;
}
