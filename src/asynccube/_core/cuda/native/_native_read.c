/* asynccube._core.cuda.native._native: FastLaunch.read, a small read's whole route in one call
 * (see fast.py; the twin is FastLaunch.read in _twin_fast.py).
 *
 * fast.read(item) -> a future of [bytes], or None. It takes what ComputeClient.read ->
 * Channel.request (inline) -> await_completion -> TransferOps._read_small would run for
 * one Handle or Binding of at most small_max bytes: the channel ready as for a launch,
 * no error held, the task's stream, a known address, the buffers last used on this
 * stream's slot, and a spare pinned buffer of that size. It queues the copy, then:
 *
 * - when other tasks are ready to run (set_defer() says how that is seen), it defers:
 *   the read's entry waits in f->deferred, and sweep(), one loop callback an iteration
 *   for all of them, settles each the device is done with (a stream query: the copy is
 *   still the stream's last work while the stream's cursor has not moved), so the
 *   caller suspends and the loop runs the other tasks while the device copies;
 * - else it polls the stream for up to SPIN_S: done, the future is resolved before it
 *   is returned, so awaiting it does not suspend.
 *
 * Either way a read done is marked on the stream (done up to the read, as a sync marks
 * it) and its buffer goes back to the spares; a read not done within SPIN_S of its
 * issue, or whose stream got later work first, is handed by later() to the completion
 * watcher as the route would (an event recorded then, after that work: later, never
 * early), with the mark of the errors held at its issue. The server's close calls
 * flush_reads() first, on the loop thread: no entry outlives the streams it queries.
 * None means nothing changed and the Python route takes the read. */
#include <stddef.h>

#include "_native.h"

#define SPIN_S 30e-6          /* as CompletionWatcher's sync_spin_seconds */
#define KEEP_SPARE 4          /* as transfers.keeps_read_spare: always 4 a size, */
#define READ_SPARES 64        /* up to 64 within READ_SPARE_BYTES */
#define READ_SPARE_BYTES (4L << 20)
#define PROBE_EVERY 32        /* mode 2: a read in this many defers, to find other tasks */
#define SWEEP_WAITING 2       /* a sweep stops querying after this many not done */
#define SPIN_WEIGHT 8.0       /* spin_avg: each spin counts this much less than the sum */

/* A deferred read's entry (a tuple): what sweep() and later() need. */
enum { E_FUT, E_BUF, E_HOST, E_NBYTES, E_WRAPPER, E_CURSOR, E_STREAM, E_STVAL, E_SID,
       E_SPARE, E_DEADLINE, E_MARK, E_COUNT };

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

/* Poll the stream until its work is done (1), `seconds` passed (0) or it failed (-1). */
static int spin(unsigned long long stream, double seconds) {
    double end = now_s() + seconds;
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
    Py_ssize_t kept = PyList_GET_SIZE(spare);
    if (kept < KEEP_SPARE || (kept < READ_SPARES && (kept + 1) * n <= READ_SPARE_BYTES)) {
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
static int mark_done(Refs *r, PyObject *wrapper, PyObject *cursor) {
    PyObject *done = get(r, wrapper, N_DONE);
    if (done == NULL) return -1;
    int behind = PyObject_RichCompareBool(done, cursor, Py_LT);
    return behind <= 0 ? behind : set_attr(wrapper, N_DONE, cursor);
}

/* set_defer(ready, pending, miss, above): ready is asyncio's ready deque (mode 1), True (another
 * asyncio loop, uvloop's: mode 2) or None (never defer: trio's, whose runner the route
 * does not see); pending is the channel's set of futures not settled yet; miss(n) a new
 * pinned buffer when every spare of size n is out (None: the route reads); above: reads
 * defer only while recent spins averaged at least this many seconds (f->spin_avg). */
PyObject *fast_set_defer(PyObject *self, PyObject *args) {
    FastLaunch *f = (FastLaunch *)self;
    PyObject *ready, *pending, *miss;
    double above = 0;
    if (!PyArg_ParseTuple(args, "OOOd:set_defer", &ready, &pending, &miss, &above)) return NULL;
    if (!(above >= 0 && above <= SPIN_S))
        return bad("set_defer's threshold must be in [0, %g] seconds, got %g", SPIN_S, above);
    if (!PySet_Check(pending) || !PyCallable_Check(miss))
        return bad("set_defer needs the channel's set of futures and a callable");
    int mode = ready == Py_None ? 0 : ready == Py_True ? 2 : 1;
    if (mode == 1 && !PySequence_Check(ready))
        return bad("set_defer's ready must be a deque, True or None, got %R", ready);
    if (f->deferred == NULL && (f->deferred = PyList_New(0)) == NULL) return NULL;
    if (f->sweep_cb == NULL && (f->sweep_cb = PyObject_GetAttrString(self, "sweep")) == NULL)
        return NULL;
    Py_XSETREF(f->ready, mode == 1 ? Py_NewRef(ready) : NULL);
    Py_XSETREF(f->pending_set, Py_NewRef(pending));
    Py_XSETREF(f->read_miss, Py_NewRef(miss));
    f->defer_mode = mode;
    f->defer_above = above;
    Py_RETURN_NONE;
}

PyObject *fast_defer_stats(PyObject *self, void *unused) {
    FastLaunch *f = (FastLaunch *)self;
    return Py_BuildValue("(KK)", f->d_hits, f->d_later);
}

/* Whether other tasks may run while this read waits: reads wait already, or tasks are
 * ready (asyncio: the ready queue holds more than the channel's end of batch; another
 * loop: the last sweep settled several, or one read in PROBE_EVERY). */
static int others_ready(FastLaunch *f, Plan *p) {
    if (PyList_GET_SIZE(f->deferred) > 0) return 1;
    if (f->defer_mode == 1) {
        Py_ssize_t n = PyObject_Size(f->ready);
        if (n < 0) {
            PyErr_Clear();
            return 0;
        }
        return n > p->scheduled + f->sweep_scheduled;
    }
    if (f->crowd >= 2) return 1;
    return ++f->since_defer >= PROBE_EVERY;
}

/* Whether this read defers (see the header): other tasks may run, and the reads that
 * spun lately waited long (a suspension costs about what a short spin does); one read
 * in PROBE_EVERY spins anyway, to see whether they still would. */
static int should_defer(FastLaunch *f, Plan *p) {
    if (f->defer_mode == 0 || !others_ready(f, p)) return 0;
    if (f->spin_avg < f->defer_above) return 0;
    if (f->defer_above <= 0 || ++f->since_spin < PROBE_EVERY) return 1;
    f->since_spin = 0;
    return 0;
}

/* Queue the entry of a read issued on p's stream, and the sweep if none is queued. */
static int defer(FastLaunch *f, Refs *r, Plan *p, PyObject *spare, PyObject *buf,
                 unsigned long long host, PyObject *fut) {
    PyObject *held = get(r, f->channel, N_HELD);
    PyObject *mark = held == NULL ? NULL : keep(r, PyObject_GetAttr(held, attr_names[N_SEQ]));
    if (mark == NULL) return -1;
    PyObject *entry = keep(r, Py_BuildValue("(OOKlOOOKOOdO)", fut, buf, host, p->nbytes,
                                            p->wrapper, PyTuple_GET_ITEM(p->stamp, 1),
                                            p->stream, f->st_val, p->sid, spare,
                                            now_s() + SPIN_S, mark));
    if (entry == NULL || PySet_Add(f->pending_set, fut) < 0 ||
        PyList_Append(f->deferred, entry) < 0)
        return -1;
    f->d_hits++;
    f->since_defer = 0;
    if (f->sweep_scheduled) return 0;
    PyObject *res = PyObject_CallOneArg(f->call_soon, f->sweep_cb);
    if (res == NULL) return -1;
    Py_DECREF(res);
    f->sweep_scheduled = 1;
    return 0;
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
    } else if (should_defer(f, p)) {
        res = defer(f, r, p, spare, buf, host, fut) < 0 ? NULL : Py_NewRef(Py_None);
    } else {
        double t0 = now_s();
        int done = spin(f->st_val, SPIN_S);
        f->spin_avg += (now_s() - t0 - f->spin_avg) / SPIN_WEIGHT; /* what spins cost */
        if (done == 1) {
            PyObject *value = mark_done(r, p->wrapper, PyTuple_GET_ITEM(p->stamp, 1)) < 0
                                  ? NULL
                                  : keep(r, take_bytes(spare, buf, host, p->nbytes));
            res = value == NULL ? NULL : PyObject_CallMethod(fut, "set_result", "O", value);
        } else {
            PyObject *n = keep(r, PyLong_FromLong(p->nbytes));
            res = n == NULL ? NULL
                            : PyObject_CallFunctionObjArgs(f->later, p->sid, p->stream, buf, n,
                                                           fut, NULL);
        }
    }
    if (res == NULL) return NULL;
    Py_DECREF(res);
    return Py_NewRef(fut);
}

/* Every spare of the size is out (reads in flight): the server's read_spare(n) gives
 * one (None: the route reads); put on the list for issue() to take. */
static int spare_from(FastLaunch *f, Refs *r, PyObject *spare, PyObject *n) {
    PyObject *buf = keep(r, PyObject_CallOneArg(f->read_miss, n));
    if (buf == NULL) return -1;
    return buf == Py_None ? 0 : PyList_Append(spare, buf);
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
    if (spare != NULL && PyList_CheckExact(spare) && PyList_GET_SIZE(spare) == 0 &&
        f->read_miss != NULL && spare_from(f, &r, spare, n) < 0)
        spare = NULL;
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

/* Give a deferred read to the route's completion (later()): an event recorded now. */
static int hand_over(FastLaunch *f, PyObject *e) {
    PyObject *const *it = &PyTuple_GET_ITEM(e, 0);
    PyObject *args[6] = {it[E_SID], it[E_STREAM], it[E_BUF], it[E_NBYTES], it[E_FUT],
                         it[E_MARK]};
    PyObject *res = PyObject_Vectorcall(f->later, args, 6, NULL);
    if (res == NULL) return -1;
    Py_DECREF(res);
    f->d_later++;
    return 1;
}

/* The read of entry e is done: its bytes, its buffer back, its future settled (1). */
static int finish(FastLaunch *f, Refs *r, PyObject *e) {
    PyObject *const *it = &PyTuple_GET_ITEM(e, 0);
    if (mark_done(r, it[E_WRAPPER], it[E_CURSOR]) < 0) return -1;
    if (PySet_Discard(f->pending_set, it[E_FUT]) < 0) return -1;
    unsigned long long host = PyLong_AsUnsignedLongLong(it[E_HOST]);
    long nbytes = PyLong_AsLong(it[E_NBYTES]);
    if (PyErr_Occurred()) return -1;
    PyObject *value = keep(r, take_bytes(it[E_SPARE], it[E_BUF], host, nbytes));
    if (value == NULL) return -1;
    PyObject *done = PyObject_CallMethod(it[E_FUT], "done", NULL);
    int cancelled = done == NULL ? -1 : PyObject_IsTrue(done);
    Py_XDECREF(done);
    if (cancelled != 0) return cancelled < 0 ? -1 : 1; /* its task was cancelled */
    PyObject *res = PyObject_CallMethod(it[E_FUT], "set_result", "O", value);
    Py_XDECREF(res);
    return res == NULL ? -1 : 1;
}

/* Whether the stream of entry e is marked done up to its read (a later read or sync
 * there completed: the copy, earlier in stream order, is done): 1, 0, -1 (an error). */
static int passed(Refs *r, PyObject *e) {
    PyObject *done = get(r, PyTuple_GET_ITEM(e, E_WRAPPER), N_DONE);
    return done == NULL ? -1 : PyObject_RichCompareBool(done, PyTuple_GET_ITEM(e, E_CURSOR), Py_GE);
}

/* Settle entry e if its read is done (1), leave it waiting (0), or hand it to the route
 * (1: the device failed, or it is not done SPIN_S after its issue). 2: its stream got
 * later work (the cursor moved: another task's, sharing the stream slot, or its own)
 * and is not marked done up to it; the second pass decides. -1: an error. */
static int settle(FastLaunch *f, Refs *r, PyObject *e, double now) {
    PyObject *const *it = &PyTuple_GET_ITEM(e, 0);
    int done = passed(r, e);
    if (done != 0) return done < 0 ? -1 : finish(f, r, e);
    PyObject *cursor = get(r, it[E_WRAPPER], N_CURSOR);
    int same = cursor == NULL ? -1 : PyObject_RichCompareBool(cursor, it[E_CURSOR], Py_EQ);
    if (same <= 0) return same < 0 ? -1 : 2;
    unsigned long long stream = PyLong_AsUnsignedLongLong(it[E_STVAL]);
    if (PyErr_Occurred()) return -1;
    CUresult q = cu.stream_query((CUh)(uintptr_t)stream);
    if (q == CUDA_ERROR_NOT_READY && now < PyFloat_AS_DOUBLE(it[E_DEADLINE])) return 0;
    if (q != 0) return hand_over(f, e); /* the route waits longer, or raises the error */
    return finish(f, r, e);
}

/* The second pass, for an entry whose stream got later work: done if the first pass
 * marked its stream done up to it (a later read there finished), else waiting until
 * SPIN_S after its issue, then the route's (an event after that later work). */
static int settle_moved(FastLaunch *f, Refs *r, PyObject *e, double now) {
    int done = passed(r, e);
    if (done != 0) return done < 0 ? -1 : finish(f, r, e);
    return now < PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(e, E_DEADLINE)) ? 0 : hand_over(f, e);
}

/* An entry whose settling raised: its future fails with the error (else: unraisable). */
static void settle_failed(FastLaunch *f, PyObject *e) {
    PyObject *type, *exc, *tb;
    PyErr_Fetch(&type, &exc, &tb);
    PyErr_NormalizeException(&type, &exc, &tb);
    if (tb != NULL && exc != NULL) PyException_SetTraceback(exc, tb);
    PyObject *res = exc == NULL ? NULL
                                : PyObject_CallFunctionObjArgs(f->fail, PyTuple_GET_ITEM(e, E_FUT),
                                                               exc, PyTuple_GET_ITEM(e, E_SID),
                                                               NULL);
    if (res == NULL) PyErr_WriteUnraisable(f->fail);
    Py_XDECREF(res);
    Py_XDECREF(type);
    Py_XDECREF(exc);
    Py_XDECREF(tb);
}

/* Take the deferred entries off f->deferred, as a new list (NULL: an error). */
static PyObject *take_deferred(FastLaunch *f) {
    PyObject *fresh = PyList_New(0);
    if (fresh == NULL) return NULL;
    PyObject *old = f->deferred;
    f->deferred = fresh;
    return old;
}

/* sweep(): the loop callback (once an iteration while reads wait), oldest first. */
PyObject *fast_sweep(PyObject *self, PyObject *unused) {
    FastLaunch *f = (FastLaunch *)self;
    f->sweep_scheduled = 0;
    if (f->deferred == NULL || PyList_GET_SIZE(f->deferred) == 0) Py_RETURN_NONE;
    PyObject *old = take_deferred(f);
    if (old == NULL) return NULL;
    PyObject *rest = PyList_New(0);
    if (rest == NULL) {
        Py_SETREF(f->deferred, old);
        return NULL;
    }
    double now = now_s();
    int waiting = 0;
    long settled = 0;
    for (int pass = 0; pass < 2; pass++) { /* the second: entries whose cursor moved */
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(old); i++) {
            PyObject *e = PyList_GET_ITEM(old, i);
            int rc = 0;
            if (e == Py_None) continue; /* settled in the first pass */
            if (pass == 1 || waiting < SWEEP_WAITING) {
                Refs r;
                r.n = 0;
                rc = pass ? settle_moved(f, &r, e, now) : settle(f, &r, e, now);
                for (int k = 0; k < r.n; k++) Py_DECREF(r.ref[k]);
            }
            if (rc == 2) continue; /* for the second pass */
            if (rc < 0) settle_failed(f, e);
            else if (rc > 0) settled++;
            else if (++waiting, PyList_Append(rest, e) < 0) PyErr_WriteUnraisable(self);
            if (PyList_SetItem(old, i, Py_NewRef(Py_None)) < 0) PyErr_WriteUnraisable(self);
        }
    }
    Py_DECREF(old);
    if (settled) f->crowd = settled;
    /* the entries still waiting go first, before any deferred meanwhile */
    if (PyList_SetSlice(f->deferred, 0, 0, rest) < 0) PyErr_WriteUnraisable(self);
    Py_DECREF(rest);
    if (PyList_GET_SIZE(f->deferred) && !f->sweep_scheduled) {
        PyObject *res = PyObject_CallOneArg(f->call_soon, f->sweep_cb);
        if (res == NULL) return NULL;
        Py_DECREF(res);
        f->sweep_scheduled = 1;
    }
    Py_RETURN_NONE;
}

/* flush_reads(): the server's close: every deferred read to the route (whose close
 * settles it), or, its future already done (failed by the actor's death, cancelled),
 * its buffer back on the spares, which the close thread releases after its sync. */
PyObject *fast_flush_reads(PyObject *self, PyObject *unused) {
    FastLaunch *f = (FastLaunch *)self;
    if (f->deferred == NULL || PyList_GET_SIZE(f->deferred) == 0) Py_RETURN_NONE;
    PyObject *old = take_deferred(f);
    if (old == NULL) return NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(old); i++) {
        PyObject *e = PyList_GET_ITEM(old, i), *fut = PyTuple_GET_ITEM(e, E_FUT);
        PyObject *done = PyObject_CallMethod(fut, "done", NULL);
        int rc = done == NULL ? -1 : PyObject_IsTrue(done);
        Py_XDECREF(done);
        if (rc == 1) {
            PySet_Discard(f->pending_set, fut);
            rc = PyList_Append(PyTuple_GET_ITEM(e, E_SPARE), PyTuple_GET_ITEM(e, E_BUF));
        } else if (rc == 0) {
            rc = hand_over(f, e);
        }
        if (rc < 0) settle_failed(f, e);
    }
    Py_DECREF(old);
    Py_RETURN_NONE;
}
