/* asynccube._core.cuda.native._native: FastLaunch.read, a small read's whole route in one call
 * (see fast.py; the twin is FastLaunch.read in _twin_fast.py).
 *
 * fast.read(item) -> a future of [bytes], or None. It takes what ComputeClient.read ->
 * Channel.request (inline) -> await_completion -> TransferOps._read_small would run for
 * one Handle or Binding of at most small_max bytes: the channel ready as for a launch,
 * no error held, the task's stream, a known address, the buffers last used on this
 * stream's slot, and a spare pinned buffer of that size. It queues the copy, then polls
 * the stream for up to SPIN_S (the copy is the stream's last work): done, the stream is
 * marked done up to the read (as a sync marks it) and the future is resolved before it
 * is returned, so awaiting it does not suspend; not done, later()
 * hands the copy to the completion watcher as the route would. None means nothing
 * changed and the Python route takes the read. */
#include <stddef.h>

#include "_native.h"

#define SPIN_S 30e-6          /* as CompletionWatcher's sync_spin_seconds */
#define KEEP_SPARE 4          /* as TransferOps._read_small's finish */

PyObject *fast_set_read(PyObject *self, PyObject *args) {
    FastLaunch *f = (FastLaunch *)self;
    PyObject *o[6];
    long small_max;
    if (!PyArg_ParseTuple(args, "OOOlOOO:set_read", &o[0], &o[1], &o[2], &small_max, &o[3],
                          &o[4], &o[5]))
        return NULL;
    if (!PyType_Check(o[0]) || !PyType_Check(o[1]) || !PyDict_Check(o[2]) || small_max < 0)
        return bad("set_read needs two types, a dict of spare buffers and a size >= 0");
    PyObject **dst[6] = {&f->handle_t, &f->binding_t, &f->small_reads, &f->later, &f->fail,
                         &f->create_future};
    for (int i = 0; i < 6; i++) Py_XSETREF(*dst[i], Py_NewRef(o[i]));
    f->small_max = small_max;
    Py_RETURN_NONE;
}

/* Poll the stream until its work is done (1), SPIN_S passed (0) or it failed (-1). */
static int spin(unsigned long long stream) {
    double end = now_s() + SPIN_S;
    for (;;) {
        CUresult q = cu.stream_query((CUh)(uintptr_t)stream);
        if (q == 0) return 1;
        if (q != CUDA_ERROR_NOT_READY) return -1; /* later() raises it, as the route */
        if (now_s() >= end) return 0;
    }
}

/* The copied bytes as [bytes]; the buffer kept as a spare, or released. */
static PyObject *take_bytes(PyObject *spare, PyObject *buf, unsigned long long host, long n) {
    PyObject *data = PyBytes_FromStringAndSize((const char *)(uintptr_t)host, n);
    PyObject *out = data == NULL ? NULL : PyList_New(1);
    if (out == NULL) {
        Py_XDECREF(data);
        return NULL;
    }
    PyList_SET_ITEM(out, 0, data);
    int rc;
    if (PyList_GET_SIZE(spare) < KEEP_SPARE) {
        rc = PyList_Append(spare, buf);
    } else {
        PyObject *res = PyObject_CallMethod(buf, "release", NULL);
        rc = res == NULL ? -1 : 0;
        Py_XDECREF(res);
    }
    if (rc < 0) {
        Py_DECREF(out);
        return NULL;
    }
    return out;
}

/* The copy was the stream's last work and the stream reached it: as a completed sync
 * would, record that the stream passed the read's cursor (p->stamp[1]), so the slices
 * last used up to there are free at once when dropped (fast.empty reuses them). */
static int mark_done(Refs *r, Plan *p) {
    PyObject *done = get(r, p->wrapper, N_DONE), *cursor = PyTuple_GET_ITEM(p->stamp, 1);
    if (done == NULL) return -1;
    int behind = PyObject_RichCompareBool(done, cursor, Py_LT);
    return behind <= 0 ? behind : set_attr(p->wrapper, N_DONE, cursor);
}

/* Queue the copy on the planned stream and settle (or hand over) the future. */
static PyObject *issue(FastLaunch *f, Refs *r, Plan *p, PyObject *spare) {
    Py_ssize_t last = PyList_GET_SIZE(spare) - 1;
    PyObject *buf = keep(r, Py_NewRef(PyList_GET_ITEM(spare, last)));
    PyObject *hptr = buf == NULL ? NULL : get(r, buf, N_PTR);
    unsigned long long host;
    if (hptr == NULL || as_u64(hptr, "a pinned buffer's address", &host) < 0 ||
        PyList_SetSlice(spare, last, last + 1, NULL) < 0 ||
        cached_handle(&f->st_obj, &f->st_val, p->stream) < 0)
        return NULL;
    PyObject *fut = keep(r, PyObject_CallNoArgs(f->create_future)), *res;
    if (fut == NULL) return NULL;
    CUresult err = cu.dtoh((void *)(uintptr_t)host, p->ptrs[0], (size_t)p->nbytes,
                           (CUh)(uintptr_t)f->st_val);
    if (err != 0) {
        if (PyList_Append(spare, buf) < 0) return NULL;
        PyObject *exc = keep(r, PyObject_CallFunction(f->error_from, "is", err,
                                                      "cuMemcpyDtoHAsync"));
        res = exc == NULL ? NULL : PyObject_CallFunctionObjArgs(f->fail, fut, exc, NULL);
    } else if (spin(f->st_val) == 1) {
        PyObject *value =
            mark_done(r, p) < 0 ? NULL : keep(r, take_bytes(spare, buf, host, p->nbytes));
        res = value == NULL ? NULL : PyObject_CallMethod(fut, "set_result", "O", value);
    } else {
        PyObject *n = keep(r, PyLong_FromLong(p->nbytes));
        res = n == NULL ? NULL
                        : PyObject_CallFunctionObjArgs(f->later, p->sid, p->stream, buf, n, fut,
                                                       NULL);
    }
    if (res == NULL) return NULL;
    Py_DECREF(res);
    return Py_NewRef(fut);
}

PyObject *fast_read(PyObject *self, PyObject *item) {
    FastLaunch *f = (FastLaunch *)self;
    if (f->small_reads == NULL) Py_RETURN_NONE; /* set_read() not called */
    Refs r;
    r.n = 0;
    Plan p;
    memset(&p, 0, offsetof(Plan, mids));
    PyObject *result = NULL, *spare = NULL, *n = NULL;
    int ok = plan_read(f, &r, &p, item);
    if (ok && (n = keep(&r, PyLong_FromLong(p.nbytes))) != NULL)
        spare = PyDict_GetItemWithError(f->small_reads, n);
    if (!ok || spare == NULL || !PyList_CheckExact(spare) || PyList_GET_SIZE(spare) == 0) {
        if (declined_quietly()) { /* the Python route meets whatever stopped this one */
            f->declined++;
            result = Py_NewRef(Py_None);
        }
    } else {
        Py_INCREF(spare);
        if (keep(&r, spare) != NULL && commit(f, &r, &p) == 0 &&
            (result = issue(f, &r, &p, spare)) != NULL && after(f, &r, &p) < 0)
            Py_CLEAR(result);
        if (result != NULL) f->hits++;
    }
    for (int i = 0; i < r.n; i++) Py_DECREF(r.ref[i]);
    return result;
}
