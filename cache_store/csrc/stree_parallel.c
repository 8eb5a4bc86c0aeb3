/* Work on many live streams at once, on several threads, without the GIL: appends (one
 * thread per tree at a time) and drafts (read only, rows shared out in chunks).
 *
 * Streams of different trees share nothing, so each tree's appends can run on a thread of
 * their own; one tree's appends run on one thread, in the order given, so every tree ends
 * exactly as appending one after another would leave it: the result does not depend on the
 * threads. Trees are taken largest first (the run-wide tree, which every row feeds, bounds the
 * wall time). The caller holds references to the streams and releases the GIL around
 * st_append_all; errors are set through st_fail, which takes it. Threads are started per call
 * (tens of us, against ms of appends at a production step): nothing outlives the call, so a
 * fork (vLLM's workers) never copies a pool half-way. */
#include <stdlib.h>
#include "stree.h"
#ifndef _WIN32
#include <pthread.h>
#endif

typedef struct { Py_ssize_t first, end; int64_t tokens; } Run; /* one tree's jobs */

typedef struct {
    const StAppend *jobs;
    const Run *runs;
    Py_ssize_t nruns;
    Py_ssize_t next; /* the next run to take (atomic) */
    int failed;      /* atomic */
} Work;

static int by_tree(const void *a, const void *b) {
    const StAppend *x = a, *y = b;
    uintptr_t p = (uintptr_t)x->stream->tree, q = (uintptr_t)y->stream->tree;
    if (p != q) return p < q ? -1 : 1;
    return (x->order > y->order) - (x->order < y->order);
}

static int most_tokens_first(const void *a, const void *b) {
    const Run *x = a, *y = b;
    return (x->tokens < y->tokens) - (x->tokens > y->tokens);
}

static void *worker(void *arg) {
    Work *w = arg;
    for (;;) {
        Py_ssize_t r = __atomic_fetch_add(&w->next, 1, __ATOMIC_RELAXED);
        if (r >= w->nruns) return NULL;
        for (Py_ssize_t i = w->runs[r].first; i < w->runs[r].end; i++) {
            if (__atomic_load_n(&w->failed, __ATOMIC_RELAXED)) return NULL;
            if (st_stream_append(w->jobs[i].stream, w->jobs[i].toks, w->jobs[i].n) < 0) {
                __atomic_store_n(&w->failed, 1, __ATOMIC_RELAXED);
                return NULL;
            }
        }
    }
}

/* Run the appends `jobs` (reordered in place) on up to `threads` threads: 0, or -1 with an
 * error set (then some appends may be done and others not). */
int st_append_all(StAppend *jobs, Py_ssize_t n, int threads) {
    if (threads <= 1) { /* in the given order: no grouping needed */
        for (Py_ssize_t i = 0; i < n; i++)
            if (st_stream_append(jobs[i].stream, jobs[i].toks, jobs[i].n) < 0) return -1;
        return 0;
    }
    for (Py_ssize_t i = 0; i < n; i++) jobs[i].order = i;
    qsort(jobs, (size_t)n, sizeof(StAppend), by_tree);
    Run *runs = PyMem_RawMalloc(sizeof(Run) * (size_t)(n ? n : 1));
    if (!runs) return st_fail(NULL, NULL);
    Py_ssize_t nruns = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i == 0 || jobs[i].stream->tree != jobs[i - 1].stream->tree) runs[nruns++] = (Run){i, i, 0};
        runs[nruns - 1].end = i + 1;
        runs[nruns - 1].tokens += jobs[i].n;
    }
    qsort(runs, (size_t)nruns, sizeof(Run), most_tokens_first);
    Work w = {jobs, runs, nruns, 0, 0};
    st_run_threads(threads < nruns ? threads : (int)nruns, worker, &w);
    PyMem_RawFree(runs);
    return w.failed ? -1 : 0;
}

/* `worker(arg)` on `threads` threads (at most ST_MAX_THREADS), this one among them, until all
 * return. The workers share out the work themselves (an atomic counter in `arg`), so a thread
 * that cannot be started only means fewer threads. */
void st_run_threads(int threads, void *(*worker)(void *), void *arg) {
#ifdef _WIN32 /* no pthreads: this thread does it all */
    (void)threads;
    worker(arg);
#else
    pthread_t tid[ST_MAX_THREADS];
    int started = 0;
    if (threads > ST_MAX_THREADS) threads = ST_MAX_THREADS;
    for (; started < threads - 1; started++)
        if (pthread_create(&tid[started], NULL, worker, arg) != 0) break;
    worker(arg);
    for (int i = 0; i < started; i++) pthread_join(tid[i], NULL);
#endif
}
