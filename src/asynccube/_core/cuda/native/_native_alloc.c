/* asynccube._core.cuda.native._native: FastLaunch.empty, a pool hit's whole route in one call
 * (see fast.py; the twin is FastLaunch.empty in _twin_alloc.py).
 *
 * fast.empty(size) -> a new Handle, or None. It takes what ComputeClient.empty ->
 * Channel.send (inline) -> SliceServer.create runs when a handle dropped since the
 * last allocation left a slice of exactly `size` requested bytes in the pool a
 * reservation of `size` goes to: the route would drain the release queue (each id's
 * slice free at once: never used by the device, or passed by a completed sync), hand
 * the slices back to their pools and reserve `size` again, finding a free slice of the
 * same pool. Here the drained slice is given to the new handle instead of going
 * through its pool (the pool's state is the same either way); the others go back as
 * the route sends them. It declines, before anything changes, whatever else the route
 * must do: a size not an exact int in [1, max_allocation], a channel not ready, the
 * persistent mode, a dropped slice the device may still use, or no slice of that size
 * among the dropped ones or the manager's pending ones. The manager's periodic cleanup
 * runs here when it is due, as in reserve. The address entries of the dropped slices
 * sent back are kept (carry()), so that a later handle taking one of them from the
 * pending ones while it is still that range needs no address lookup at its first use. */
#include <stddef.h>

#include "_native.h"

#define MAX_RELEASED 16 /* more dropped at once: the route drains them */
#define MAX_PENDING 64  /* more pending in the manager: the route releases them */
#define MAX_CARRIED 64  /* more address entries kept for pending slices: start again */

typedef struct {
    PyObject *ids;    /* the release queue's ids, a tuple snapshot */
    PyObject *pool;   /* the pool a reservation of `size` goes to */
    PyObject *calls;  /* the manager's next _alloc_calls */
    PyObject *memory; /* the matched slice token and its address entry (or NULL) */
    PyObject *entry;
    PyObject *slice_id; /* no match among the dropped: the manager's pending slice */
    Py_ssize_t match;
    long size;
    int cleanup;
} Alloc;

static const int handle_names[6] = {N_MEMORY, N_OSTART, N_OEND, N_STREAM, N_CURSOR, N_BSIZE};
static const int token_names[2] = {N_ID, N_RQUEUE};

static int offsets(PyObject *t, const int *names, int n, Py_ssize_t *out) {
    for (int i = 0; i < n; i++)
        if ((out[i] = member_offset((PyTypeObject *)t, attr_names[names[i]])) <= 0) {
            bad("%R must keep '%U' in __slots__", t, attr_names[names[i]]);
            return -1;
        }
    return 0;
}

PyObject *fast_set_alloc(PyObject *self, PyObject *args) {
    FastLaunch *f = (FastLaunch *)self;
    PyObject *o[10];
    long max_alloc;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOl:set_alloc", &o[0], &o[1], &o[2], &o[3], &o[4],
                          &o[5], &o[6], &o[7], &o[8], &o[9], &max_alloc))
        return NULL;
    if (!PyType_Check(o[0]) || !PyType_Check(o[1]) || !PyIter_Check(o[2]) ||
        !PyDict_Check(o[3]) || !PyDict_Check(o[4]) || !PyDict_Check(o[6]) ||
        !PyDict_Check(o[8]) || max_alloc < 0)
        return bad("set_alloc needs two types, an iterator, dicts and a size >= 0");
    Py_ssize_t h_off[6], t_off[2];
    if (offsets(o[0], handle_names, 6, h_off) < 0 || offsets(o[1], token_names, 2, t_off) < 0)
        return NULL;
    PyObject **dst[10] = {&f->handle_t, &f->token_t, &f->ids, &f->slices, &f->failed,
                          &f->released, &f->created_at, &f->manager, &f->mslices, &f->pending};
    for (int i = 0; i < 10; i++) Py_XSETREF(*dst[i], Py_NewRef(o[i]));
    memcpy(f->h_off, h_off, sizeof(h_off));
    memcpy(f->t_off, t_off, sizeof(t_off));
    f->max_alloc = max_alloc;
    Py_RETURN_NONE;
}

/* The manager reserves as the route would next: not persistent, no cleanup due; the
 * pool a reservation of a->size goes to (MemoryManagement.reserve's routing). */
static int manager_ready(FastLaunch *f, Refs *r, Alloc *a) {
    PyObject *m = f->manager, *o;
    long calls, next, limit = 0;
    if ((o = get(r, m, N_USE_PERSISTENT)) == NULL || o != Py_False) return 0;
    if ((o = get(r, m, N_ALLOC_CALLS)) == NULL || as_long(o, &calls) < 0) return 0;
    if ((o = get(r, m, N_NEXT_CHECK)) == NULL || as_long(o, &next) < 0) return 0;
    a->cleanup = calls + 1 >= next; /* the periodic cleanup is due: run after the mint */
    PyObject *limits = get(r, m, N_LIMITS), *routes = get(r, m, N_ROUTES);
    if (limits == NULL || routes == NULL || !PyList_CheckExact(limits) ||
        !PyList_CheckExact(routes) || PyList_GET_SIZE(routes) != PyList_GET_SIZE(limits))
        return 0;
    Py_ssize_t i = 0, n = PyList_GET_SIZE(limits);
    while (i < n && as_long(PyList_GET_ITEM(limits, i), &limit) == 0 && limit < a->size) i++;
    if (i == n || limit < a->size) return 0;
    a->pool = PyList_GET_ITEM(routes, i);
    return (a->calls = keep(r, PyLong_FromLong(calls + 1))) != NULL;
}

/* The slice of dropped `id` is free at once, as ServerCore._forget decides: never used
 * by the device (its last use is its creation), or passed by a completed sync. */
static int free_at_once(FastLaunch *f, Refs *r, PyObject *id) {
    PyObject *last = PyDict_GetItemWithError(f->last_use, id);
    if (last == NULL) return !PyErr_Occurred();
    PyObject *created = PyDict_GetItemWithError(f->created_at, id);
    if (created == last) return 1;
    if (created == NULL && PyErr_Occurred()) return 0;
    if (keep(r, Py_NewRef(last)) == NULL) return 0; /* the compares may run Python */
    if (created != NULL && keep(r, Py_NewRef(created)) != NULL) {
        int same = PyObject_RichCompareBool(last, created, Py_EQ);
        if (same != 0) return same > 0;
    }
    if (!PyTuple_Check(last) || PyTuple_GET_SIZE(last) != 2) return 0;
    PyObject *value = get(r, PyTuple_GET_ITEM(last, 0), N_VALUE), *done;
    long v, m = f->max_streams;
    if (value == NULL || as_long(value, &v) < 0) return 0;
    long slot = ((v % m) + m) % m;
    if (slot >= PyList_GET_SIZE(f->slots) || PyList_GET_ITEM(f->slots, slot) == Py_None) return 0;
    if ((done = get(r, PyList_GET_ITEM(f->slots, slot), N_DONE)) == NULL) return 0;
    return PyObject_RichCompareBool(done, PyTuple_GET_ITEM(last, 1), Py_GE) == 1;
}

/* 1 when the manager's slice `sl_id` can be the new handle's: a->size requested bytes, in
 * the pool a reservation of that size goes to. */
static int slice_fits(FastLaunch *f, Refs *r, Alloc *a, PyObject *sl_id) {
    PyObject *sl = sl_id == NULL ? NULL : PyDict_GetItemWithError(f->mslices, sl_id), *o;
    long used;
    if (sl == NULL || (o = get(r, sl, N_USED)) == NULL || as_long(o, &used) < 0) return 0;
    return used == a->size && (o = get(r, sl, N_POOL)) != NULL && o == a->pool;
}

/* The same for the slice behind dropped handle `id`. */
static int fits(FastLaunch *f, Refs *r, Alloc *a, PyObject *id) {
    PyObject *memory = PyDict_GetItemWithError(f->slices, id);
    /* a pool slice's token (an imported buffer's owner stands there too: never reused) */
    if (memory == NULL || Py_TYPE(memory) != (PyTypeObject *)f->token_t) return 0;
    return slice_fits(f, r, a, get(r, memory, N_ID));
}

/* A slice the server has let go of and its pool not yet taken back (the manager's
 * pending ids, released at its next reservation), that fits. */
static int pending_fit(FastLaunch *f, Refs *r, Alloc *a) {
    Py_ssize_t n = PyObject_Length(f->pending);
    if (n <= 0 || n > MAX_PENDING) return 0;
    PyObject *ids = keep(r, PySequence_Tuple(f->pending));
    for (Py_ssize_t i = 0; ids != NULL && i < PyTuple_GET_SIZE(ids); i++) {
        if (slice_fits(f, r, a, PyTuple_GET_ITEM(ids, i))) {
            a->slice_id = PyTuple_GET_ITEM(ids, i);
            return 1;
        }
        if (PyErr_Occurred()) return 0;
    }
    return 0;
}

/* Every handle dropped since the server's last collection free at once (else the route
 * retires it), and a slice that fits: one of theirs, or one pending in the manager. */
static int released_ready(FastLaunch *f, Refs *r, Alloc *a) {
    Py_ssize_t n = PyObject_Length(f->released);
    a->match = -1;
    if (n < 0 || n > MAX_RELEASED) return 0;
    if ((a->ids = keep(r, PySequence_Tuple(f->released))) == NULL) return 0;
    n = PyTuple_GET_SIZE(a->ids);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *id = PyTuple_GET_ITEM(a->ids, i);
        if (!free_at_once(f, r, id)) return 0;
        if (a->match < 0 && fits(f, r, a, id)) a->match = i;
        if (PyErr_Occurred()) return 0;
    }
    return a->match >= 0 || pending_fit(f, r, a);
}

static int plan_alloc(FastLaunch *f, Refs *r, Plan *p, Alloc *a, PyObject *size) {
    if (!PyLong_CheckExact(size) || as_long(size, &a->size) < 0) return 0;
    if (a->size <= 0 || a->size > f->max_alloc) return 0;
    if (!channel_ready(f, r, p) || !stream_of(f, r, p)) return 0;
    if (!manager_ready(f, r, a) || !released_ready(f, r, a)) return 0;
    PyObject *value = get(r, p->sid, N_VALUE);
    long v, m = f->max_streams;
    if (value == NULL || as_long(value, &v) < 0) return 0;
    return clear_of(f, r, p, NULL, 0) && wrapper_of(f, r, p, ((v % m) + m) % m);
}

/* d.pop(k, None), the value owned by `r` (NULL: absent, or an error set). */
static PyObject *pop(Refs *r, PyObject *d, PyObject *k) {
    PyObject *v = PyDict_GetItemWithError(d, k);
    if (v == NULL || keep(r, Py_NewRef(v)) == NULL) return NULL;
    return PyDict_DelItem(d, k) < 0 ? NULL : v;
}

/* An instance of `t` with its slots at `off` set to `v`, as its __init__ sets them. */
static PyObject *made(PyObject *t, const Py_ssize_t *off, int n, PyObject *const *v) {
    PyObject *o = ((PyTypeObject *)t)->tp_alloc((PyTypeObject *)t, 0);
    if (o == NULL) return NULL;
    for (int i = 0; i < n; i++) *(PyObject **)((char *)o + off[i]) = Py_NewRef(v[i]);
    return o;
}

/* Keep the address entry of a dropped slice the manager gets back (pending), with the
 * slice's range (its Slice object, page and offset), for a later handle that takes it. */
static int carry(FastLaunch *f, Refs *r, PyObject *memory, PyObject *entry) {
    if (memory == NULL || entry == NULL || Py_TYPE(memory) != (PyTypeObject *)f->token_t)
        return 0;
    PyObject *sl_id = get(r, memory, N_ID), *sl, *page, *offset, *kept;
    if (sl_id == NULL || (sl = PyDict_GetItemWithError(f->mslices, sl_id)) == NULL)
        return PyErr_Occurred() ? -1 : 0;
    if ((page = get(r, sl, N_PAGE)) == NULL || (offset = get(r, sl, N_OFFSET)) == NULL) return -1;
    if (f->carried == NULL && (f->carried = PyDict_New()) == NULL) return -1;
    if (PyDict_GET_SIZE(f->carried) >= MAX_CARRIED) PyDict_Clear(f->carried);
    if ((kept = keep(r, PyTuple_Pack(4, entry, sl, page, offset))) == NULL) return -1;
    return PyDict_SetItem(f->carried, sl_id, kept);
}

/* The address entry kept for the manager's slice `sl_id` (borrowed, owned by `r`), if
 * the slice is still the range it was and its entry covers a->size bytes; else NULL. */
static PyObject *carried(FastLaunch *f, Refs *r, Alloc *a, PyObject *sl_id) {
    PyObject *c = f->carried == NULL ? NULL : pop(r, f->carried, sl_id), *sl, *o, *entry;
    if (c == NULL || !PyTuple_Check(c) || PyTuple_GET_SIZE(c) != 4) return NULL;
    sl = PyDict_GetItemWithError(f->mslices, sl_id);
    if (sl == NULL || sl != PyTuple_GET_ITEM(c, 1)) return NULL;
    if ((o = get(r, sl, N_PAGE)) == NULL || o != PyTuple_GET_ITEM(c, 2)) return NULL;
    if ((o = get(r, sl, N_OFFSET)) == NULL ||
        PyObject_RichCompareBool(o, PyTuple_GET_ITEM(c, 3), Py_EQ) != 1)
        return NULL;
    long length;
    entry = PyTuple_GET_ITEM(c, 0);
    if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 2 ||
        as_long(PyTuple_GET_ITEM(entry, 1), &length) < 0 || length != a->size)
        return NULL;
    return entry;
}

/* Take the snapshot's ids off the queue (popleft: a thread may append meanwhile) and
 * forget each, as SliceTable.drain and _forget do; keep the matched slice, and the
 * address entries of the others (carry()). */
static int drain(FastLaunch *f, Refs *r, Alloc *a) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(a->ids); i++) {
        PyObject *id = PyTuple_GET_ITEM(a->ids, i);
        if (keep(r, PyObject_CallMethodNoArgs(f->released, attr_names[N_POPLEFT])) == NULL)
            return -1;
        PyObject *memory = pop(r, f->slices, id), *entry = NULL;
        if (memory == NULL && PyErr_Occurred()) return -1;
        PyObject *const dicts[4] = {f->addresses, f->failed, f->last_use, f->created_at};
        for (int d = 0; d < 4; d++) {
            if (d == 1 && PyDict_GET_SIZE(f->failed) == 0) continue;
            PyObject *v = pop(r, dicts[d], id);
            if (v == NULL && PyErr_Occurred()) return -1;
            if (d == 0) entry = v;
        }
        if (i == a->match) {
            a->memory = memory;
            a->entry = entry;
        } else if (carry(f, r, memory, entry) < 0) {
            return -1;
        }
    }
    if (a->match >= 0) return a->memory == NULL ? (bad("a dropped slice vanished"), -1) : 0;
    /* The pending slice leaves the manager's queue, reserved again under a new token. */
    PyObject *queue = get(r, f->manager, N_RQUEUE), *gone;
    if (queue == NULL) return -1;
    gone = PyObject_CallMethodOneArg(f->pending, attr_names[N_REMOVE], a->slice_id);
    if (gone == NULL) return -1;
    Py_DECREF(gone);
    PyObject *tv[2] = {a->slice_id, queue};
    if ((a->memory = keep(r, made(f->token_t, f->t_off, 2, tv))) == NULL) return -1;
    a->entry = carried(f, r, a, a->slice_id); /* its address, where still valid */
    return a->entry == NULL && PyErr_Occurred() ? -1 : 0;
}

/* The new handle over the matched slice, minted and stamped as create would. */
static PyObject *mint(FastLaunch *f, Refs *r, Plan *p, Alloc *a, PyObject *size) {
    if (drain(f, r, a) < 0 || commit(f, r, p) < 0) return NULL;
    PyObject *queue = get(r, f->table, N_RQUEUE), *id = keep(r, PyIter_Next(f->ids));
    if (queue == NULL || id == NULL) {
        if (!PyErr_Occurred()) bad("the handle ids ran out");
        return NULL;
    }
    PyObject *tv[2] = {id, queue};
    PyObject *token = keep(r, made(f->token_t, f->t_off, 2, tv));
    PyObject *cursor = token == NULL ? NULL : PyTuple_GET_ITEM(p->stamp, 1);
    PyObject *hv[6] = {token, Py_None, Py_None, p->sid, cursor, size};
    PyObject *handle = cursor == NULL ? NULL : made(f->handle_t, f->h_off, 6, hv);
    if (handle == NULL) return NULL;
    if (PyDict_SetItem(f->slices, id, a->memory) < 0 ||
        (a->entry != NULL && PyDict_SetItem(f->addresses, id, a->entry) < 0) ||
        PyDict_SetItem(f->last_use, id, p->stamp) < 0 ||
        PyDict_SetItem(f->created_at, id, p->stamp) < 0 ||
        set_attr(f->manager, N_ALLOC_CALLS, a->calls) < 0)
        Py_CLEAR(handle);
    if (handle != NULL && a->cleanup) { /* as reserve: every tick's calls, the pools' policy */
        PyObject *res = PyObject_CallMethodOneArg(f->manager, attr_names[N_PERIODIC], a->calls);
        if (res == NULL) Py_CLEAR(handle);
        Py_XDECREF(res);
    }
    return handle;
}

PyObject *fast_empty(PyObject *self, PyObject *size) {
    FastLaunch *f = (FastLaunch *)self;
    if (f->token_t == NULL) Py_RETURN_NONE; /* set_alloc() not called */
    Refs r;
    r.n = 0;
    Plan p;
    memset(&p, 0, offsetof(Plan, mids));
    Alloc a;
    memset(&a, 0, sizeof(a));
    PyObject *result = NULL;
    if (!plan_alloc(f, &r, &p, &a, size)) {
        if (declined_quietly()) { /* the Python route meets whatever stopped this one */
            f->declined++;
            result = Py_NewRef(Py_None);
        }
    } else if ((result = mint(f, &r, &p, &a, size)) != NULL) {
        if (after(f, &r, &p) < 0)
            Py_CLEAR(result);
        else
            f->hits++;
    }
    for (int i = 0; i < r.n; i++) Py_DECREF(r.ref[i]);
    return result;
}
