/* asynccube._core.cuda.native._native: FastLaunch, a launch's whole route in one call (see
 * fast.py for the contract and _twin_fast.py for the pure-Python twin).
 *
 * FastLaunch(channel, loop, ...)(kernel, count, bindings, mode) -> bool runs what
 * ComputeClient.execute -> Channel.send (inline) -> LaunchOps.execute would run for the
 * common launch: an open channel called on its loop with no capture, an idle actor
 * with nothing queued (or only tracked commands of other streams and buffers queued:
 * channel/footprint.py), the task's own stream, the device's context current, no
 * recorder, a loaded kernel with a static count and no tensor maps, every buffer's
 * address known, a signature already checked (and under CHECKED the grid too), and
 * every buffer last used on this stream's slot. Anything else returns False before any
 * state changes, and the caller takes the Python route, which handles (and raises) the
 * rest. After the bookkeeping (cursor, last-use stamps) an error is held for the stream
 * and the launch's buffers tainted (fast.py's _hold_launch), as the Python route does. */
#include <stddef.h>

#include "_native.h"

static int fast_traverse(FastLaunch *f, visitproc visit, void *arg) {
    for (int i = 0; i < N_OBJ; i++) Py_VISIT(f->obj[i]);
    Py_VISIT(f->fn_obj);
    Py_VISIT(f->st_obj);
    Py_VISIT(f->pk_pack);
    Py_VISIT(f->sh_obj);
    Py_VISIT(f->go_obj);
    Py_VISIT(f->ms_obj);
    Py_VISIT(f->ty_obj);
    Py_VISIT(f->ty_num);
    Py_VISIT(f->handle_t);
    Py_VISIT(f->binding_t);
    Py_VISIT(f->small_reads);
    Py_VISIT(f->later);
    Py_VISIT(f->fail);
    Py_VISIT(f->create_future);
    Py_VISIT(f->ptr_miss);
    Py_VISIT(f->fp);
    Py_VISIT(f->fp_streams);
    Py_VISIT(f->fp_buffers);
    Py_VISIT(f->carried);
    Py_VISIT(f->small_writes);
    Py_VISIT(f->write_miss);
    Py_VISIT(f->deferred);
    Py_VISIT(f->ready);
    Py_VISIT(f->pending_set);
    Py_VISIT(f->sweep_cb);
    Py_VISIT(f->read_miss);
    PyObject *const alloc[9] = {f->token_t, f->ids, f->slices, f->failed, f->released,
                                f->created_at, f->manager, f->mslices, f->pending};
    for (int i = 0; i < 9; i++) Py_VISIT(alloc[i]);
    return 0;
}

static int fast_clear(FastLaunch *f) {
    for (int i = 0; i < N_OBJ; i++) Py_CLEAR(f->obj[i]);
    Py_CLEAR(f->fn_obj);
    Py_CLEAR(f->st_obj);
    Py_CLEAR(f->pk_pack);
    Py_CLEAR(f->sh_obj);
    Py_CLEAR(f->go_obj);
    Py_CLEAR(f->ms_obj);
    Py_CLEAR(f->ty_obj);
    Py_CLEAR(f->ty_num);
    Py_CLEAR(f->handle_t);
    Py_CLEAR(f->binding_t);
    Py_CLEAR(f->small_reads);
    Py_CLEAR(f->later);
    Py_CLEAR(f->fail);
    Py_CLEAR(f->create_future);
    Py_CLEAR(f->ptr_miss);
    Py_CLEAR(f->fp);
    Py_CLEAR(f->fp_streams);
    Py_CLEAR(f->fp_buffers);
    Py_CLEAR(f->carried);
    Py_CLEAR(f->small_writes);
    Py_CLEAR(f->write_miss);
    Py_CLEAR(f->deferred);
    Py_CLEAR(f->ready);
    Py_CLEAR(f->pending_set);
    Py_CLEAR(f->sweep_cb);
    Py_CLEAR(f->read_miss);
    PyObject **alloc[9] = {&f->token_t, &f->ids, &f->slices, &f->failed, &f->released,
                           &f->created_at, &f->manager, &f->mslices, &f->pending};
    for (int i = 0; i < 9; i++) Py_CLEAR(*alloc[i]);
    return 0;
}

static void fast_dealloc(FastLaunch *f) {
    PyObject_GC_UnTrack(f);
    fast_clear(f);
    Py_TYPE(f)->tp_free((PyObject *)f);
}

static PyObject *fast_vectorcall(PyObject *self, PyObject *const *a, size_t nargsf,
                                 PyObject *kw);

static PyObject *fast_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    if (kw != NULL && PyDict_GET_SIZE(kw)) return bad("FastLaunch takes no keyword arguments");
    if (PyTuple_GET_SIZE(args) != N_OBJ + 1)
        return bad("FastLaunch takes %d arguments, got %zd", N_OBJ + 1, PyTuple_GET_SIZE(args));
    FastLaunch *f = (FastLaunch *)type->tp_alloc(type, 0);
    if (f == NULL) return NULL;
    for (int i = 0; i < N_OBJ; i++) f->obj[i] = Py_NewRef(PyTuple_GET_ITEM(args, i));
    unsigned long long streams;
    if (as_u64(PyTuple_GET_ITEM(args, N_OBJ), "max_streams", &streams) < 0) goto fail;
    if (streams == 0 || streams > 1 << 20) {
        bad("max_streams must be in [1, 2**20], got %llu", streams);
        goto fail;
    }
    f->max_streams = (long)streams;
    f->vectorcall = fast_vectorcall;
    if (!PyDict_Check(f->kernels) || !PyDict_Check(f->addresses) || !PyDict_Check(f->packs) ||
        !PyDict_Check(f->last_use) || !PyList_Check(f->slots) ||
        !PyContextVar_CheckExact(f->pinned) || !PyContextVar_CheckExact(f->owned)) {
        bad("FastLaunch needs dicts, a list of stream slots and two ContextVars");
        goto fail;
    }
    return (PyObject *)f;
fail:
    Py_DECREF(f);
    return NULL;
}

int cached_handle(PyObject **obj, unsigned long long *val, PyObject *o) {
    if (o == *obj) return 0;
    unsigned long long v;
    if (as_handle(o, "a driver handle", &v) < 0) return -1;
    Py_XSETREF(*obj, Py_NewRef(o));
    *val = v;
    return 0;
}

/* Hold the raised exception for the stream and taint the launch's buffers (memory ids
 * p->mids), as the Python route's Launcher.launch does: hold(sid, exc, mids). */
int hold_raised(FastLaunch *f, Plan *p) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL) PyException_SetTraceback(value, tb);
    PyObject *mids = value == NULL ? NULL : PyTuple_New(p->n), *res = NULL;
    if (mids != NULL) {
        for (Py_ssize_t i = 0; i < p->n; i++) PyTuple_SET_ITEM(mids, i, Py_NewRef(p->mids[i]));
        res = PyObject_CallFunctionObjArgs(f->hold, p->sid, value, mids, NULL);
        Py_DECREF(mids);
    }
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    Py_XDECREF(res);
    return res == NULL ? -1 : 0;
}

/* Advance the stream's cursor and stamp every buffer as last used there. */
int commit(FastLaunch *f, Refs *r, Plan *p) {
    PyObject *cursor = get(r, p->wrapper, N_CURSOR);
    if (cursor == NULL) return -1;
    long value;
    PyObject *next = as_long(cursor, &value) < 0 ? NULL : PyLong_FromLong(value + 1);
    if (next == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "a stream cursor must be an int");
        return -1;
    }
    PyObject *stamp = p->stamp = keep(r, PyTuple_Pack(2, p->sid, next));
    int rc = stamp == NULL ? -1 : set_attr(p->wrapper, N_CURSOR, next);
    for (Py_ssize_t i = 0; rc == 0 && i < p->n; i++)
        rc = PyDict_SetItem(f->last_use, p->mids[i], stamp);
    Py_DECREF(next);
    return rc;
}

static int fill(PackState *s, Plan *p) {
    if (p->n != s->n_ptrs) {
        bad("%zd buffer pointers given; the signature has %zd", p->n, s->n_ptrs);
        return -1;
    }
    memcpy((char *)s->storage.buf + s->ptr_offset, p->ptrs, 8 * (size_t)p->n);
    if (p->n_groups != s->n_scalars) {
        bad("%d scalar groups given; the signature has %zd", p->n_groups, s->n_scalars);
        return -1;
    }
    for (int i = 0; i < p->n_groups; i++)
        if (pack_put(s, p->scalar_data[i], s->scalar_off[i], s->scalar_cap[i], "scalar groups",
                     0) < 0)
            return -1;
    if (p->meta_size == 0) return 0;
    if (s->meta_off < 0) {
        bad("metadata given, but the signature has none");
        return -1;
    }
    return pack_put(s, p->meta, s->meta_off, s->meta_size, "metadata", 1);
}

static int run(FastLaunch *f, Plan *p) {
    if (!(p->grid[0] && p->grid[1] && p->grid[2])) return 0;
    if (fill(p->pack, p) < 0 || cached_handle(&f->fn_obj, &f->fn_val, p->function) < 0 ||
        cached_handle(&f->st_obj, &f->st_val, p->stream) < 0)
        return hold_raised(f, p);
    CUresult err = cu.launch((CUh)(uintptr_t)f->fn_val, p->grid[0], p->grid[1], p->grid[2],
                             p->shape[0], p->shape[1], p->shape[2], p->shape[3],
                             (CUh)(uintptr_t)f->st_val, (void **)p->pack->params.buf, NULL);
    if (err == 0) return 0;
    PyObject *what = PyUnicode_FromFormat("cuLaunchKernel(%S)", p->kernel_id);
    PyObject *exc = what == NULL ? NULL : PyObject_CallFunction(f->error_from, "iO", err, what);
    Py_XDECREF(what);
    if (exc == NULL) return -1;
    PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
    Py_DECREF(exc);
    return hold_raised(f, p);
}

/* What Channel.ran_inline does (inlined: a Python call per launch would cost more than
 * the rest of this): end the server's batch with the loop iteration; wake a stopping
 * actor. A launch taken here does not count against the channel's inline budget. */
int after(FastLaunch *f, Refs *r, Plan *p) {
    PyObject *stop = get(r, f->channel, N_STOP);
    int stopping = stop == NULL ? -1 : PyObject_IsTrue(stop);
    if (stopping < 0) return -1;
    if (stopping) {
        PyObject *res = PyObject_CallNoArgs(f->wake);
        if (res == NULL) return -1;
        Py_DECREF(res);
    }
    if (p->scheduled) return 0;
    if (set_attr(f->channel, N_SCHEDULED, Py_True) < 0) return -1;
    PyObject *res = PyObject_CallOneArg(f->call_soon, f->end_batch);
    Py_XDECREF(res);
    return res == NULL ? -1 : 0;
}

/* A route that declines leaves what stopped it to the Python route, which meets (and
 * raises) it again: an Exception is cleared (1). Anything else, a KeyboardInterrupt from
 * Python code the route called (the server's _ptr, say), is not swallowed (0: it stays
 * set, the call returns NULL), as the twin's `except Exception` lets it through. */
int declined_quietly(void) {
    if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_Exception)) return 0;
    PyErr_Clear();
    return 1;
}

/* A launch offered by its caller (queued == 0: the caller's checks, then after()) or by
 * the actor running it from its queue (queued == 1, a[4] its StreamId; the actor ends
 * its batch itself). True: launched, or its error held; False: left to the route. */
static PyObject *take(FastLaunch *f, PyObject *const *a, int queued) {
    Refs r;
    r.n = 0; /* (not = {0}: that would clear every slot, a few hundred words, per call) */
    Plan p;
    memset(&p, 0, offsetof(Plan, mids)); /* the arrays are filled up to p.n */
    int ok = queued ? plan_queued(f, &r, &p, a) : plan(f, &r, &p, a);
    PyObject *result = NULL;
    if (!ok) {
        if (declined_quietly()) {
            ++*(queued ? &f->q_declined : &f->declined);
            result = Py_NewRef(Py_False);
        }
    } else if (commit(f, &r, &p) == 0 && run(f, &p) == 0 && (queued || after(f, &r, &p) == 0)) {
        ++*(queued ? &f->q_hits : &f->hits);
        result = Py_NewRef(Py_True);
    }
    for (int i = 0; i < r.n; i++) Py_DECREF(r.ref[i]);
    return result;
}

/* fast(kernel, count, bindings, mode) -> bool: a launch as its caller offers it. */
static PyObject *fast_vectorcall(PyObject *self, PyObject *const *a, size_t nargsf,
                                 PyObject *kw) {
    if (kw != NULL) {
        PyErr_SetString(PyExc_TypeError, "FastLaunch takes no keywords");
        return NULL;
    }
    if (nargs_ok(PyVectorcall_NARGS(nargsf), 4, "FastLaunch") < 0) return NULL;
    return take((FastLaunch *)self, a, 0);
}

/* fast.queued(kernel, count, bindings, mode, sid) -> bool: the launch as the actor runs
 * it from its queue (Launcher.launch): the same route, on the StreamId it was sent
 * with, without the caller's checks (its loop, an idle actor) or after(). */
static PyObject *fast_queued(PyObject *self, PyObject *const *a, Py_ssize_t n) {
    if (nargs_ok(n, 5, "FastLaunch.queued") < 0) return NULL;
    return take((FastLaunch *)self, a, 1);
}

static PyObject *fast_queued_stats(PyObject *self, void *unused) {
    FastLaunch *f = (FastLaunch *)self;
    return Py_BuildValue("(KK)", f->q_hits, f->q_declined);
}


/* fast.set_pointers(fn): fn(binding) -> int finds (and caches in the addresses dict) the
 * address of a buffer no route has used yet; its errors leave the command to the route. */
static PyObject *fast_set_pointers(PyObject *self, PyObject *fn) {
    if (!PyCallable_Check(fn)) return bad("set_pointers needs a callable, got %R", fn);
    Py_XSETREF(((FastLaunch *)self)->ptr_miss, Py_NewRef(fn));
    Py_RETURN_NONE;
}

/* fast.set_footprint(fp): the channel's Footprint (channel/footprint.py); its dicts
 * `streams` and `buffers` are kept (never replaced), `queued` is read per call. */
static PyObject *fast_set_footprint(PyObject *self, PyObject *fp) {
    FastLaunch *f = (FastLaunch *)self;
    PyObject *streams = PyObject_GetAttrString(fp, "streams");
    PyObject *buffers = streams == NULL ? NULL : PyObject_GetAttrString(fp, "buffers");
    if (buffers == NULL || !PyDict_CheckExact(streams) || !PyDict_CheckExact(buffers)) {
        Py_XDECREF(streams);
        Py_XDECREF(buffers);
        PyErr_Clear();
        return bad("set_footprint needs an object with dicts streams and buffers");
    }
    Py_XSETREF(f->fp_streams, streams);
    Py_XSETREF(f->fp_buffers, buffers);
    Py_XSETREF(f->fp, Py_NewRef(fp));
    Py_RETURN_NONE;
}

static PyObject *fast_stats(PyObject *self, void *unused) {
    FastLaunch *f = (FastLaunch *)self;
    return Py_BuildValue("(KK)", f->hits, f->declined);
}

static PyMethodDef fast_methods[] = {
    {"queued", (PyCFunction)(void (*)(void))fast_queued, METH_FASTCALL,
     "queued(kernel, count, bindings, mode, sid) -> bool: a launch the actor runs"},
    {"read", fast_read, METH_O,
     "read(item) -> a future of [bytes], or None: the Python route takes it (fast.py)"},
    {"write", (PyCFunction)(void (*)(void))fast_write, METH_FASTCALL,
     "write(item, data) -> bool: a small write of a whole buffer, or False: the route"},
    {"export", (PyCFunction)(void (*)(void))fast_export, METH_FASTCALL,
     "export(item, consumer, event) -> the address, ordered for the consumer, or None"},
    {"set_write", fast_set_write, METH_VARARGS,
     "set_write(small_writes, small_max, miss): what write() needs (fast.py)"},
    {"set_read", fast_set_read, METH_VARARGS,
     "set_read(handle_t, binding_t, small_reads, small_max, later, fail, create_future)"},
    {"set_defer", fast_set_defer, METH_VARARGS,
     "set_defer(ready, pending, miss, first): when read() defers to sweep() (fast.py)"},
    {"sweep", fast_sweep, METH_NOARGS,
     "sweep(): settle the deferred reads the device is done with (a loop callback)"},
    {"flush_reads", fast_flush_reads, METH_NOARGS,
     "flush_reads(): hand every deferred read to the route (the server's close)"},
    {"empty", fast_empty, METH_O,
     "empty(size) -> a new Handle over a dropped slice, or None: the route takes it"},
    {"set_footprint", fast_set_footprint, METH_O,
     "set_footprint(fp): with the channel's Footprint, routes run ahead of other streams"},
    {"set_pointers", fast_set_pointers, METH_O,
     "set_pointers(fn): fn(binding) finds and caches an address not cached yet"},
    {"set_alloc", fast_set_alloc, METH_VARARGS,
     "set_alloc(handle_t, token_t, ids, slices, failed, released, created_at, manager, "
     "mslices, pending, max_alloc)"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef fast_getset[] = {
    {"stats", fast_stats, NULL, "(launches taken, launches left to the Python route)", NULL},
    {"queued_stats", fast_queued_stats, NULL, "stats of queued(): (taken, left to the route)",
     NULL},
    {"defer_stats", fast_defer_stats, NULL,
     "(reads deferred, of them handed to the route's completion)", NULL},
    {"write_stats", fast_write_stats, NULL, "stats of write(): (taken, left to the route)",
     NULL},
    {"export_stats", fast_export_stats, NULL, "stats of export(): (taken, left to the route)",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject FastLaunchType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "asynccube._core.cuda.native._native.FastLaunch",
    .tp_basicsize = sizeof(FastLaunch),
    .tp_dealloc = (destructor)fast_dealloc,
    .tp_vectorcall_offset = offsetof(FastLaunch, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)fast_traverse,
    .tp_clear = (inquiry)fast_clear,
    .tp_doc = "FastLaunch(...)(kernel, count, bindings, mode) -> bool (see fast.py)",
    .tp_new = fast_new,
    .tp_getset = fast_getset,
    .tp_methods = fast_methods,
};
