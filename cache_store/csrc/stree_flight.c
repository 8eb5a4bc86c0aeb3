/* The side map of in-flight windows: node -> (head of its doubly linked list of windows, list
 * length), open addressing with backward-shift deletion. Only edges that a live window ends
 * inside have an entry, so it stays as small as the live streams' windows. */
#include "stree.h"

static inline uint32_t fslot(int32_t v, uint32_t cap) {
    return (uint32_t)(((uint64_t)(uint32_t)v * 0x9E3779B97F4A7C15ULL) >> 32) & (cap - 1);
}

Flight *st_flight(const STree *t, int32_t v) {
    if (!t->fcap) return NULL;
    for (uint32_t i = fslot(v, t->fcap);; i = (i + 1) & (t->fcap - 1)) {
        if (t->fmap[i].node == v) return &t->fmap[i];
        if (t->fmap[i].node < 0) return NULL;
    }
}

static Flight *insert_entry(STree *t, int32_t v) {
    uint32_t i = fslot(v, t->fcap);
    while (t->fmap[i].node >= 0) i = (i + 1) & (t->fcap - 1);
    t->fmap[i].node = v; t->fmap[i].head = -1; t->fmap[i].cnt = 0;
    return &t->fmap[i];
}

/* Room for `entries` entries at load <= 1/2 (called when a stream opens, so that no window
 * step ever has to grow the map). */
int st_flight_room(STree *t, int64_t entries) {
    if (2 * entries <= (int64_t)t->fcap) return 0;
    uint32_t cap = 16;
    while ((int64_t)cap < 2 * entries) cap *= 2;
    Flight *old = t->fmap, *m = PyMem_RawMalloc(sizeof(Flight) * cap);
    if (!m) { PyErr_NoMemory(); return -1; }
    for (uint32_t i = 0; i < cap; i++) m[i].node = -1;
    uint32_t oldcap = t->fcap;
    t->fmap = m; t->fcap = cap;
    for (uint32_t i = 0; i < oldcap; i++)
        if (old[i].node >= 0) *insert_entry(t, old[i].node) = old[i];
    PyMem_RawFree(old);
    return 0;
}

static void delete_entry(STree *t, Flight *e) {
    uint32_t mask = t->fcap - 1, i = (uint32_t)(e - t->fmap), j = i;
    t->fmap[i].node = -1;
    for (;;) { /* backward shift: move later entries of the run into the hole if allowed */
        j = (j + 1) & mask;
        if (t->fmap[j].node < 0) return;
        uint32_t home = fslot(t->fmap[j].node, t->fcap);
        if (((j - home) & mask) >= ((j - i) & mask)) {
            t->fmap[i] = t->fmap[j];
            t->fmap[j].node = -1;
            i = j;
        }
    }
}

void st_flight_push(STree *t, int32_t v, int32_t slot) {
    Flight *e = st_flight(t, v);
    if (!e) e = insert_entry(t, v);
    Win *x = &t->wins[slot];
    x->prev = -1; x->next = e->head;
    if (e->head >= 0) t->wins[e->head].prev = slot;
    e->head = slot;
    e->cnt++;
}

void st_flight_remove(STree *t, int32_t v, int32_t slot) {
    Flight *e = st_flight(t, v);
    Win *x = &t->wins[slot];
    if (x->prev >= 0) t->wins[x->prev].next = x->next;
    else e->head = x->next;
    if (x->next >= 0) t->wins[x->next].prev = x->prev;
    x->prev = x->next = -1;
    if (--e->cnt == 0) delete_entry(t, e);
}

void st_flight_remove_entry(STree *t, int32_t v) {
    Flight *e = st_flight(t, v);
    if (e) delete_entry(t, e);
}
