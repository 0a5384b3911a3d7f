/* asynccube._core.cuda.native._native: FastLaunch's plan, everything a launch needs found
 * before any state changes (see _native_fast.c and fast.py). */
#include "_native.h"

/* The caller's StreamId when it owns one already (else 0: the Python route mints). */
int stream_of(FastLaunch *f, Refs *r, Plan *p) {
    PyObject *v;
    if (PyContextVar_Get(f->pinned, NULL, &v) < 0 || keep(r, v) == NULL) return 0;
    if (v != Py_None) return (p->sid = v) != NULL;
    PyObject *owned;
    if (PyContextVar_Get(f->owned, NULL, &owned) < 0 || keep(r, owned) == NULL) return 0;
    if (owned == Py_None) return (p->sid = keep(r, PyObject_CallNoArgs(f->current_sid))) != NULL;
    if (!PyTuple_Check(owned) || PyTuple_GET_SIZE(owned) != 2) return 0;
    PyObject *task = keep(r, f->task_arg == Py_None ? PyObject_CallNoArgs(f->task_fn)
                                                    : PyObject_CallOneArg(f->task_fn, f->task_arg));
    PyObject *owner = PyTuple_GET_ITEM(owned, 0);
    if (task == NULL || task == Py_None || !PyWeakref_CheckRef(owner)) return 0;
    if (PyWeakref_GetObject(owner) == task) {
        p->sid = PyTuple_GET_ITEM(owned, 1);
        return 1;
    }
    /* The task's first command: StreamId.current() mints its stream, as the route would. */
    return (p->sid = keep(r, PyObject_CallNoArgs(f->current_sid))) != NULL;
}

/* The channel is open and capture-free, no recorder is on, and the device's context is
 * current, as driver.set_current last made it on this thread (the Python route's
 * activate(); asking the driver costs a driver call). */
static int device_ready(FastLaunch *f, Refs *r) {
    PyObject *c = f->channel, *o;
    if ((o = get(r, c, N_STATE)) == NULL || o != f->open_state) return 0;
    if ((o = get(r, c, N_GUARD)) == NULL || o != Py_None) return 0;
    if (get(r, f->recorder, N_ENABLED) != Py_False) return 0;
    return get(r, f->tls, N_CONTEXT) == f->context && cu.lib != NULL;
}

/* device_ready, called on the channel's loop, and its actor idle with nothing queued,
 * or (with a footprint) every queued command tracked and the actor not awaiting one:
 * p->ahead, and clear_of() then checks the command's stream and buffers against them.
 * Unlike a command of the Python route, a launch taken here runs inline past the
 * channel's budget: it costs the caller about what queueing it would (the caller
 * holds the loop either way), and the actor would only spend more on it later. */
int channel_ready(FastLaunch *f, Refs *r, Plan *p) {
    PyObject *c = f->channel, *o;
    if (!device_ready(f, r)) return 0;
    PyObject *loop = keep(r, PyObject_CallNoArgs(f->get_loop));
    if (loop == NULL) return 0;
    if (loop != f->loop) {
        if (f->on_loop == Py_None) return 0;
        PyObject *ok = keep(r, PyObject_CallNoArgs(f->on_loop));
        if (ok != Py_True) return 0;
    }
    if ((o = get(r, c, N_STOP)) == NULL || o != Py_False) return 0;
    Py_ssize_t n = (o = get(r, c, N_QUEUE)) == NULL ? -1 : PyObject_Length(o);
    if (n < 0) return 0;
    if (n == 0) {
        if ((o = get(r, c, N_WAKEUP)) == NULL || o == Py_None) return 0;
    } else {
        long queued;
        if (f->fp == NULL || (o = get(r, c, N_BLOCKED)) == NULL || o != Py_False) return 0;
        if ((o = get(r, f->fp, N_QUEUED)) == NULL || as_long(o, &queued) < 0 || queued != n)
            return 0;
        p->ahead = 1;
    }
    if ((o = get(r, c, N_SCHEDULED)) == NULL) return 0;
    p->scheduled = o == Py_True;
    return 1;
}

int clear_of(FastLaunch *f, Refs *r, Plan *p, PyObject *const *mids, Py_ssize_t n) {
    if (!p->ahead) return 1;
    PyObject *value = get(r, p->sid, N_VALUE);
    int hit = value == NULL ? -1 : PyDict_Contains(f->fp_streams, value);
    for (Py_ssize_t i = 0; hit == 0 && i < n; i++) hit = PyDict_Contains(f->fp_buffers, mids[i]);
    return hit == 0;
}

static int u32_of(PyObject *o, unsigned *out) {
    long v;
    if (o == NULL || as_long(o, &v) < 0 || v < 0 || v > 0xFFFFFFFFL) return 0;
    *out = (unsigned)v;
    return 1;
}

/* The n unsigned 32-bit ints of tuple t, parsed once per tuple (cached by identity). */
static int u32s(PyObject **cache, unsigned *vals, PyObject *t, int n, unsigned *out) {
    if (t == NULL || !PyTuple_Check(t) || PyTuple_GET_SIZE(t) != n) return 0;
    if (t != *cache) {
        unsigned parsed[4];
        for (int i = 0; i < n; i++)
            if (!u32_of(PyTuple_GET_ITEM(t, i), &parsed[i])) return 0;
        memcpy(vals, parsed, sizeof(unsigned) * (size_t)n);
        Py_XSETREF(*cache, Py_NewRef(t));
    }
    memcpy(out, vals, sizeof(unsigned) * (size_t)n);
    return 1;
}

/* The device address of each buffer, as ServerCore._pointers finds it on its fast path. */
static int pointers_of(FastLaunch *f, Refs *r, Plan *p, PyObject *buffers) {
    PyObject *queue = get(r, f->table, N_RQUEUE);
    if (queue == NULL || !PyList_CheckExact(buffers)) return 0;
    p->n = PyList_GET_SIZE(buffers);
    if (p->n > MAX_BUFFERS) return 0;
    for (Py_ssize_t i = 0; i < p->n; i++) {
        PyObject *b = PyList_GET_ITEM(buffers, i), *o;
        PyObject *token = get(r, b, N_MEMORY);
        if (token == NULL || (o = get(r, token, N_RQUEUE)) == NULL || o != queue) return 0;
        PyObject *mid = p->mids[i] = get(r, token, N_ID);
        PyObject *entry = mid == NULL ? NULL : PyDict_GetItemWithError(f->addresses, mid);
        if (entry == NULL && mid != NULL && f->ptr_miss != NULL && !PyErr_Occurred()) {
            /* no route used this buffer yet (a new handle): the server's _ptr finds and
             * caches its address, or raises (a freed handle): left to the route */
            PyObject *res = PyObject_CallOneArg(f->ptr_miss, b);
            if (res == NULL) return 0;
            Py_DECREF(res);
            entry = PyDict_GetItemWithError(f->addresses, mid);
        }
        long base, length, start = 0, end_off = 0, size;
        if (entry == NULL || !PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 2 ||
            as_long(PyTuple_GET_ITEM(entry, 0), &base) < 0 ||
            as_long(PyTuple_GET_ITEM(entry, 1), &length) < 0)
            return 0;
        if ((o = get(r, b, N_OSTART)) == NULL || (o != Py_None && as_long(o, &start) < 0)) return 0;
        if ((o = get(r, b, N_OEND)) == NULL || (o != Py_None && as_long(o, &end_off) < 0)) return 0;
        if ((o = get(r, b, N_BSIZE)) == NULL || as_long(o, &size) < 0) return 0;
        if (!(0 <= start && start <= size - end_off && size - end_off <= length)) return 0;
        p->ptrs[i] = (unsigned long long)base + (unsigned long long)start;
        p->nbytes = size - end_off - start;
    }
    return 1;
}

/* The pack of key (n buffers, metadata size, scalar groups, then each group's dtype num
 * and length, in ABI order; `nums`/`lens` the same as objects): the last one, or
 * ArgPacker's for the key it builds, (n, 0, ((num, length), ...), metadata size). */
static PyObject *pack_for(FastLaunch *f, Refs *r, long key[PK_KEY], PyObject **nums,
                          PyObject **lens) {
    if (f->pk_pack != NULL && memcmp(key, f->pk_key, sizeof(f->pk_key)) == 0) return f->pk_pack;
    Py_ssize_t groups = key[2];
    PyObject *skey = keep(r, PyTuple_New(groups));
    if (skey == NULL) return NULL;
    for (Py_ssize_t i = 0; i < groups; i++) {
        PyObject *pair = PyTuple_Pack(2, nums[i], lens[i]);
        if (pair == NULL) return NULL;
        PyTuple_SET_ITEM(skey, i, pair);
    }
    PyObject *msize = keep(r, PyLong_FromLong(key[1]));
    PyObject *nbuf = keep(r, PyLong_FromLong(key[0])), *zero = keep(r, PyLong_FromLong(0));
    if (nbuf == NULL || zero == NULL || msize == NULL) return NULL;
    PyObject *k = keep(r, PyTuple_Pack(4, nbuf, zero, skey, msize));
    PyObject *pack = k == NULL ? NULL : PyDict_GetItemWithError(f->packs, k);
    if (pack != NULL) {
        Py_XSETREF(f->pk_pack, Py_NewRef(pack));
        memcpy(f->pk_key, key, sizeof(f->pk_key));
    }
    return pack;
}

/* One scalar group's dtype num (read once per dtype object for the last one seen),
 * length and bytes, into the key's slots 3 + 2i and 4 + 2i. */
static int group_of(FastLaunch *f, Refs *r, Plan *p, PyObject *sb, int i, long *key,
                    PyObject **nums, PyObject **lens) {
    PyObject *ty = get(r, sb, N_TY), *num;
    if (ty == NULL) return 0;
    if (ty == f->ty_obj) {
        num = f->ty_num;
        key[3 + 2 * i] = f->ty_val;
    } else if ((num = get(r, ty, N_NUM)) == NULL || as_long(num, &key[3 + 2 * i]) < 0) {
        return 0;
    } else if (i == 0) { /* a dtype's num never changes: the first group's is kept */
        f->ty_val = key[3];
        Py_XSETREF(f->ty_num, Py_NewRef(num));
        Py_XSETREF(f->ty_obj, Py_NewRef(ty));
    }
    nums[i] = num;
    return (lens[i] = get(r, sb, N_LENGTH)) != NULL &&
           (p->scalar_data[i] = get(r, sb, N_DATA)) != NULL && as_long(lens[i], &key[4 + 2 * i]) == 0;
}

/* The pack of the bindings' signature, already checked against the kernel. Up to
 * MAX_SCALAR_GROUPS scalar groups: one is the dict's only value; several are put in ABI
 * order by the bindings' own ordered_scalars() (ArgPacker's order: a pack is found only
 * under the key ArgPacker stored, so an order that differed would decline, not
 * mis-pack). */
static int pack_of(FastLaunch *f, Refs *r, Plan *p, PyObject *loaded, PyObject *bindings) {
    PyObject *scalars = get(r, bindings, N_SCALARS), *md = get(r, bindings, N_METADATA);
    if (scalars == NULL || !PyDict_CheckExact(scalars) ||
        PyDict_GET_SIZE(scalars) > MAX_SCALAR_GROUPS || md == NULL ||
        (p->meta = get(r, md, N_DATA)) == NULL)
        return 0;
    if (p->meta != f->ms_obj) {
        PyObject *msize = get(r, p->meta, N_SIZE);
        Py_ssize_t size = msize == NULL || !PyLong_Check(msize) ? -1 : PyLong_AsSsize_t(msize);
        if (size < 0) return 0;
        Py_XSETREF(f->ms_obj, Py_NewRef(p->meta));
        f->ms_val = size;
    }
    p->meta_size = f->ms_val;
    long key[PK_KEY] = {0};
    PyObject *nums[MAX_SCALAR_GROUPS], *lens[MAX_SCALAR_GROUPS];
    int groups = (int)PyDict_GET_SIZE(scalars);
    key[0] = (long)p->n;
    key[1] = (long)p->meta_size;
    key[2] = groups;
    if (groups == 1) {
        Py_ssize_t pos = 0;
        PyObject *k, *sb;
        PyDict_Next(scalars, &pos, &k, &sb);
        if (!group_of(f, r, p, sb, 0, key, nums, lens)) return 0;
    } else if (groups > 1) {
        PyObject *ordered =
            keep(r, PyObject_CallMethodNoArgs(bindings, attr_names[N_ORDERED]));
        if (ordered == NULL || !PyList_CheckExact(ordered) || PyList_GET_SIZE(ordered) != groups)
            return 0;
        for (int i = 0; i < groups; i++)
            if (!group_of(f, r, p, PyList_GET_ITEM(ordered, i), i, key, nums, lens)) return 0;
    }
    p->n_groups = groups;
    PyObject *pack = pack_for(f, r, key, nums, lens);
    PyObject *checked = get(r, loaded, N_CHECKED);
    if (pack == NULL || checked == NULL || !PyAnySet_Check(checked)) return 0;
    if (PySet_Contains(checked, pack) != 1) return 0;
    PyObject *state = get(r, pack, N_STATE);
    if (state == NULL || !PyObject_TypeCheck(state, &PackStateType)) return 0;
    p->pack = (PackState *)state;
    return 1;
}

/* Every buffer last used on this stream's slot (else the Python route syncs streams). */
static int own_slot(FastLaunch *f, Refs *r, Plan *p, PyObject *buffers, long *own) {
    long sid;
    PyObject *value = get(r, p->sid, N_VALUE);
    if (value == NULL || as_long(value, &sid) < 0) return 0;
    long m = f->max_streams;
    *own = ((sid % m) + m) % m;
    for (Py_ssize_t i = 0; i < p->n; i++) {
        PyObject *origin = PyDict_GetItemWithError(f->last_use, p->mids[i]), *s;
        if (origin == NULL && PyErr_Occurred()) return 0;
        if (origin != NULL)
            s = PyTuple_Check(origin) && PyTuple_GET_SIZE(origin) == 2 ? PyTuple_GET_ITEM(origin, 0)
                                                                       : NULL;
        else
            s = get(r, PyList_GET_ITEM(buffers, i), N_STREAM);
        long v;
        if (s == NULL || (value = get(r, s, N_VALUE)) == NULL || as_long(value, &v) < 0)
            return 0;
        if (((v % m) + m) % m != *own) return 0;
    }
    return clear_of(f, r, p, p->mids, p->n) && wrapper_of(f, r, p, *own);
}

int wrapper_of(FastLaunch *f, Refs *r, Plan *p, long own) {
    if (own >= PyList_GET_SIZE(f->slots)) return 0;
    p->wrapper = PyList_GET_ITEM(f->slots, own);
    if (p->wrapper != Py_None) return 1;
    /* The stream's first operation: StreamPool.get_index creates it, as resolve would. */
    PyObject *index = keep(r, PyLong_FromLong(own));
    p->wrapper = index == NULL ? NULL : keep(r, PyObject_CallOneArg(f->get_index, index));
    return p->wrapper != NULL && p->wrapper != Py_None;
}

static int types_ok(FastLaunch *f, PyObject *const *a) {
    return Py_TYPE(a[0]) == (PyTypeObject *)f->kernel_t &&
           Py_TYPE(a[1]) == (PyTypeObject *)f->count_t &&
           Py_TYPE(a[2]) == (PyTypeObject *)f->bindings_t &&
           Py_TYPE(a[3]) == (PyTypeObject *)f->mode_t;
}

/* Everything after the stream (p->sid): the launch's own checks and lookups. */
/* 1 when no buffer is tainted by a failed command (HeldErrors._tainted is empty): else
 * the Python route runs the command (a launch clears its buffers' taints, a read raises). */
static int untainted(FastLaunch *f, Refs *r) {
    PyObject *held = get(r, f->channel, N_HELD), *tainted;
    return held != NULL && (tainted = get(r, held, N_TAINTED)) != NULL &&
           PyDict_Check(tainted) && PyDict_GET_SIZE(tainted) == 0;
}

static int plan_launch(FastLaunch *f, Refs *r, Plan *p, PyObject *const *a) {
    PyObject *kernel = a[0], *count = a[1], *bindings = a[2], *mode = a[3], *o;
    if ((o = get(r, count, N_BINDING)) == NULL || o != Py_None) return 0;
    if (!untainted(f, r)) return 0;
    if ((o = get(r, bindings, N_TMAPS)) == NULL ||
        (PyList_CheckExact(o) ? PyList_GET_SIZE(o) : PyObject_Length(o)) != 0)
        return 0;
    if ((p->kernel_id = get(r, kernel, N_ID)) == NULL) return 0;
    PyObject *loaded = PyDict_GetItemWithError(f->kernels, p->kernel_id);
    if (loaded == NULL || keep(r, Py_NewRef(loaded)) == NULL) return 0;
    PyObject *buffers = get(r, bindings, N_BUFFERS);
    if (buffers == NULL || !pointers_of(f, r, p, buffers)) return 0;
    if (!pack_of(f, r, p, loaded, bindings)) return 0;
    if (!u32_of(get(r, count, N_X), &p->grid[0]) || !u32_of(get(r, count, N_Y), &p->grid[1]) ||
        !u32_of(get(r, count, N_Z), &p->grid[2]))
        return 0;
    if (mode == f->checked) {
        unsigned ok[3];
        if (!u32s(&f->go_obj, f->go_val, get(r, loaded, N_GRID_OK), 3, ok) ||
            memcmp(ok, p->grid, sizeof(ok)) != 0)
            return 0;
    }
    if (!u32s(&f->sh_obj, f->sh_val, get(r, loaded, N_SHAPE), 4, p->shape)) return 0;
    if ((p->function = get(r, loaded, N_FUNCTION)) == NULL) return 0;
    long own;
    if (!own_slot(f, r, p, buffers, &own)) return 0;
    return (p->stream = get(r, p->wrapper, N_STREAM)) != NULL;
}

int plan(FastLaunch *f, Refs *r, Plan *p, PyObject *const *a) {
    if (!types_ok(f, a) || !channel_ready(f, r, p) || !stream_of(f, r, p)) return 0;
    return plan_launch(f, r, p, a);
}

/* A launch the actor runs from its queue (a[4]: the StreamId it was sent with). */
int plan_queued(FastLaunch *f, Refs *r, Plan *p, PyObject *const *a) {
    if (!types_ok(f, a) || !device_ready(f, r)) return 0;
    p->sid = a[4];
    return plan_launch(f, r, p, a);
}


/* plan_read and plan_export: one buffer of at most `max` bytes, no error held and no buffer
 * tainted, the task's stream, the buffer last used on its slot. */
static int plan_one(FastLaunch *f, Refs *r, Plan *p, PyObject *item, long max) {
    if (Py_TYPE(item) != (PyTypeObject *)f->handle_t &&
        Py_TYPE(item) != (PyTypeObject *)f->binding_t)
        return 0;
    if (!channel_ready(f, r, p)) return 0;
    PyObject *held = get(r, f->channel, N_HELD), *errors;
    if (held == NULL || (errors = get(r, held, N_HELD)) == NULL || !PyDict_Check(errors) ||
        PyDict_GET_SIZE(errors) != 0 || !untainted(f, r))
        return 0; /* an error is held or a buffer tainted: the route raises it */
    if (!stream_of(f, r, p)) return 0;
    PyObject *one = keep(r, PyList_New(1));
    if (one == NULL) return 0;
    PyList_SET_ITEM(one, 0, Py_NewRef(item));
    long own;
    if (!pointers_of(f, r, p, one) || p->nbytes <= 0 || p->nbytes > max) return 0;
    if (!own_slot(f, r, p, one, &own)) return 0;
    return (p->stream = get(r, p->wrapper, N_STREAM)) != NULL;
}

int plan_read(FastLaunch *f, Refs *r, Plan *p, PyObject *item) {
    return plan_one(f, r, p, item, f->small_max);
}

int plan_export(FastLaunch *f, Refs *r, Plan *p, PyObject *item) {
    return plan_one(f, r, p, item, LONG_MAX);
}


int plan_write(FastLaunch *f, Refs *r, Plan *p, PyObject *item, PyObject *data) {
    if (Py_TYPE(item) != (PyTypeObject *)f->handle_t &&
        Py_TYPE(item) != (PyTypeObject *)f->binding_t)
        return 0;
    if (!PyBytes_CheckExact(data) || !channel_ready(f, r, p) || !untainted(f, r))
        return 0; /* a tainted buffer: the route's write clears its taint */
    if (!stream_of(f, r, p)) return 0;
    PyObject *one = keep(r, PyList_New(1));
    if (one == NULL) return 0;
    PyList_SET_ITEM(one, 0, Py_NewRef(item));
    long own;
    if (!pointers_of(f, r, p, one) || p->nbytes <= 0 || p->nbytes > f->write_max ||
        p->nbytes != PyBytes_GET_SIZE(data))
        return 0;
    if (!own_slot(f, r, p, one, &own)) return 0;
    return (p->stream = get(r, p->wrapper, N_STREAM)) != NULL;
}
