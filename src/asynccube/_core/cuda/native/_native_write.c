/* asynccube._core.cuda.native._native: FastLaunch.write, a small write's whole route in one
 * call, and FastLaunch.export, a DLPack export's ordering in one call (see fast.py; the
 * twins are FastLaunch.write and .export in _twin_fast.py).
 *
 * fast.write(item, data) -> bool. It takes what ComputeClient.create's copy runs through
 * Channel.send (inline) -> DataMovement.write_on_actor -> Channel.fire_writing ->
 * TransferOps._write_one (the staging copy of `data` into page-locked memory, then
 * cuMemcpyHtoDAsync) for `bytes` of exactly the length of one Handle or Binding and at
 * most write_max bytes: the channel ready as for a launch, no buffer tainted, the task's
 * stream, a known address, the buffer last used on this stream's slot, and a spare
 * staging buffer of that size the device is done with (its last copy's stamp passed by
 * the stream's `done`, as a dropped slice is free: ServerCore._forget), or a new one the
 * server's write_miss(size) gives to keep (None: the route stages it). The spare then
 * holds the copy's stamp: it is reused once a completed read or sync of that stream
 * passes it, never earlier, and the server releases the spares at its close. A copy the
 * driver refuses is held for the stream and taints the buffer, as fire_writing does.
 * False means nothing changed and the Python route takes the write.
 *
 * fast.export(item, consumer, event) -> int or None: a DLPack export's ordering in one
 * call (client/interop.py; the twin is FastLaunch.export). It takes what
 * InteropOps.export_to_stream runs for `item` on the task's stream (the channel ready as
 * for a read, no error held, no buffer tainted, a known address, the buffer last used on
 * this stream's slot): the buffer stamped as used at the stream's next cursor (resolve),
 * `event` recorded on the stream and the consumer's stream (a raw handle; its device
 * checked by the caller) made to wait for it on the device. The address of the item's
 * first byte, or None: nothing changed, the Python route exports. A driver error of the
 * record or the wait raises as the route's does (the buffer stays stamped, as there). */
#include <stddef.h>

#include "_native.h"

#define MAX_SCAN 64 /* spares looked at per write (the server keeps at most this many) */

PyObject *fast_set_write(PyObject *self, PyObject *args) {
    FastLaunch *f = (FastLaunch *)self;
    PyObject *spares, *miss;
    long small_max;
    if (!PyArg_ParseTuple(args, "OlO:set_write", &spares, &small_max, &miss)) return NULL;
    if (!PyDict_Check(spares) || small_max < 0 || !PyCallable_Check(miss))
        return bad("set_write needs a dict of spare buffers, a size >= 0 and a callable");
    Py_XSETREF(f->small_writes, Py_NewRef(spares));
    Py_XSETREF(f->write_miss, Py_NewRef(miss));
    f->write_max = small_max;
    Py_RETURN_NONE;
}

PyObject *fast_write_stats(PyObject *self, void *unused) {
    FastLaunch *f = (FastLaunch *)self;
    return Py_BuildValue("(KK)", f->w_hits, f->w_declined);
}

/* 1 when the stream slot of `stamp` (sid, cursor) is done up to its cursor: the device
 * has passed the copy stamped so (a completed read or sync marked it). */
static int passed(FastLaunch *f, Refs *r, PyObject *stamp) {
    long v, cursor, done, m = f->max_streams;
    if (!PyTuple_CheckExact(stamp) || PyTuple_GET_SIZE(stamp) != 2) return 0;
    PyObject *value = get(r, PyTuple_GET_ITEM(stamp, 0), N_VALUE), *wrapper, *o;
    if (value == NULL || as_long(value, &v) < 0 ||
        as_long(PyTuple_GET_ITEM(stamp, 1), &cursor) < 0)
        return 0;
    long slot = ((v % m) + m) % m;
    if (slot >= PyList_GET_SIZE(f->slots)) return 0;
    wrapper = PyList_GET_ITEM(f->slots, slot);
    if (wrapper == Py_None || (o = get(r, wrapper, N_DONE)) == NULL || as_long(o, &done) < 0)
        return 0;
    return done >= cursor;
}

/* A staging buffer for p->nbytes: a spare the device is done with, taken off the
 * server's list (*list, owned by `r`), or a new one from write_miss; its host address in
 * *host. 0 (an error may be set): none, the route stages the write. */
static int spare_of(FastLaunch *f, Refs *r, Plan *p, PyObject **list, PyObject **buf,
                    unsigned long long *host) {
    PyObject *n = keep(r, PyLong_FromLong(p->nbytes));
    PyObject *l = n == NULL ? NULL : PyDict_GetItemWithError(f->small_writes, n);
    if (l == NULL && PyErr_Occurred()) return 0;
    *buf = NULL;
    if (l != NULL) {
        if (!PyList_CheckExact(l) || keep(r, Py_NewRef(l)) == NULL) return 0;
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(l) && i < MAX_SCAN; i++) {
            PyObject *e = PyList_GET_ITEM(l, i);
            if (!PyTuple_CheckExact(e) || PyTuple_GET_SIZE(e) != 2) return 0;
            Py_INCREF(e); /* passed() may run Python code (a getattr) */
            int free = passed(f, r, PyTuple_GET_ITEM(e, 1));
            if (free && keep(r, Py_NewRef(PyTuple_GET_ITEM(e, 0))) != NULL &&
                i < PyList_GET_SIZE(l) && PyList_GET_ITEM(l, i) == e &&
                PySequence_DelItem(l, i) == 0)
                *buf = PyTuple_GET_ITEM(e, 0);
            Py_DECREF(e);
            if (*buf != NULL || PyErr_Occurred()) break;
        }
    }
    if (*buf == NULL && !PyErr_Occurred()) { /* none free: a new one to keep, or None */
        PyObject *fresh = keep(r, PyObject_CallOneArg(f->write_miss, n));
        if (fresh == NULL || fresh == Py_None) return 0;
        l = PyDict_GetItemWithError(f->small_writes, n);
        if (l == NULL || !PyList_CheckExact(l) || keep(r, Py_NewRef(l)) == NULL) {
            if (!PyErr_Occurred()) bad("write_miss must keep a list of spares for the size");
            return 0;
        }
        *buf = fresh;
    }
    if (*buf == NULL) return 0;
    *list = l;
    PyObject *ptr = get(r, *buf, N_PTR), *size = ptr == NULL ? NULL : get(r, *buf, N_SIZE);
    long have;
    if (size == NULL || as_u64(ptr, "a staging buffer's address", host) < 0 ||
        as_long(size, &have) < 0 || have < p->nbytes || *host == 0)
        return 0; /* not a buffer to use: left off the list (its pool gets it back) */
    return 1;
}

/* Copy `data` into the staging buffer and queue its copy to the device; a refused copy
 * is held for the stream and taints the buffer (0: done either way). */
static int issue_write(FastLaunch *f, Plan *p, unsigned long long host, PyObject *data) {
    memcpy((void *)(uintptr_t)host, PyBytes_AS_STRING(data), (size_t)p->nbytes);
    CUresult err = cu.htod(p->ptrs[0], (const void *)(uintptr_t)host, (size_t)p->nbytes,
                           (CUh)(uintptr_t)f->st_val);
    if (err == 0) return 0;
    PyObject *exc = PyObject_CallFunction(f->error_from, "is", err, "cuMemcpyHtoDAsync");
    if (exc == NULL) return -1;
    PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
    Py_DECREF(exc);
    return hold_raised(f, p);
}

/* The staging buffer back on its list with the copy's stamp (reused once passed). */
static int respare(PyObject *list, PyObject *buf, PyObject *stamp) {
    PyObject *entry = PyTuple_Pack(2, buf, stamp);
    int rc = entry == NULL ? -1 : PyList_Append(list, entry);
    Py_XDECREF(entry);
    return rc;
}

PyObject *fast_write(PyObject *self, PyObject *const *a, Py_ssize_t n) {
    FastLaunch *f = (FastLaunch *)self;
    if (nargs_ok(n, 2, "FastLaunch.write") < 0) return NULL;
    if (f->small_writes == NULL || f->write_miss == NULL) Py_RETURN_FALSE; /* no set_write */
    Refs r;
    r.n = 0;
    Plan p;
    memset(&p, 0, offsetof(Plan, mids));
    PyObject *result = NULL, *list = NULL, *buf = NULL;
    unsigned long long host = 0;
    int ok = plan_write(f, &r, &p, a[0], a[1]) && spare_of(f, &r, &p, &list, &buf, &host) &&
             cached_handle(&f->st_obj, &f->st_val, p.stream) == 0;
    if (!ok) {
        if (declined_quietly()) { /* the Python route meets whatever stopped this one */
            f->w_declined++;
            result = Py_NewRef(Py_False);
        }
    } else if (commit(f, &r, &p) == 0 && issue_write(f, &p, host, a[1]) == 0 &&
               respare(list, buf, p.stamp) == 0 && after(f, &r, &p) == 0) {
        f->w_hits++;
        result = Py_NewRef(Py_True);
    }
    for (int i = 0; i < r.n; i++) Py_DECREF(r.ref[i]);
    return result;
}

PyObject *fast_export_stats(PyObject *self, void *unused) {
    FastLaunch *f = (FastLaunch *)self;
    return Py_BuildValue("(KK)", f->x_hits, f->x_declined);
}

/* `event` recorded on the planned stream, and `consumer` made to wait for it. */
static int order_after(FastLaunch *f, unsigned long long consumer, unsigned long long event) {
    const char *what = "cuEventRecord";
    CUresult err = cu.event_record((CUh)(uintptr_t)event, (CUh)(uintptr_t)f->st_val);
    if (err == 0) {
        what = "cuStreamWaitEvent";
        err = cu.wait_event((CUh)(uintptr_t)consumer, (CUh)(uintptr_t)event, 0);
    }
    if (err == 0) return 0;
    PyObject *exc = PyObject_CallFunction(f->error_from, "is", err, what);
    if (exc != NULL) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
    return -1;
}

PyObject *fast_export(PyObject *self, PyObject *const *a, Py_ssize_t n) {
    FastLaunch *f = (FastLaunch *)self;
    unsigned long long consumer, event;
    if (nargs_ok(n, 3, "FastLaunch.export") < 0 ||
        as_u64(a[1], "export's consumer stream", &consumer) < 0 ||
        as_u64(a[2], "export's event", &event) < 0)
        return NULL;
    if (consumer == 0 || event == 0)
        return bad("export needs a consumer stream and an event, not a null handle");
    Refs r;
    r.n = 0;
    Plan p;
    memset(&p, 0, offsetof(Plan, mids));
    PyObject *result = NULL;
    int ok = plan_export(f, &r, &p, a[0]) &&
             cached_handle(&f->st_obj, &f->st_val, p.stream) == 0;
    if (!ok) {
        if (declined_quietly()) { /* the Python route meets whatever stopped this one */
            f->x_declined++;
            result = Py_NewRef(Py_None);
        }
    } else if (commit(f, &r, &p) == 0 && order_after(f, consumer, event) == 0 &&
               after(f, &r, &p) == 0) {
        f->x_hits++;
        result = PyLong_FromUnsignedLongLong(p.ptrs[0]);
    }
    for (int i = 0; i < r.n; i++) Py_DECREF(r.ref[i]);
    return result;
}
