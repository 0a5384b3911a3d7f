/* asynccube._core.cuda.native._native: the argument block of a kernel signature and launch() (see _native.h). */
#include "_native.h"

/* ---------------------------------------------------------------- PackState */

/* PackState (declared in _native.h): the argument block of one kernel signature. */

static void pack_dealloc(PackState *s) {
    if (s->storage.obj != NULL) PyBuffer_Release(&s->storage);
    if (s->params.obj != NULL) PyBuffer_Release(&s->params);
    PyMem_Free(s->scalar_off);
    PyMem_Free(s->map_off);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static int in_storage(PackState *s, Py_ssize_t off, Py_ssize_t n, const char *what) {
    if (off < 0 || n < 0 || off > s->storage.len - n) {
        bad("%s at offset %zd (%zd bytes) lies outside the %zd-byte argument storage", what,
            off, n, s->storage.len);
        return -1;
    }
    return 0;
}

static int read_slots(PyObject *seq, Py_ssize_t **off, Py_ssize_t **cap, Py_ssize_t *n,
                      const char *what) {
    PyObject *fast = PySequence_Fast(seq, what);
    if (fast == NULL) return -1;
    *n = PySequence_Fast_GET_SIZE(fast);
    *off = PyMem_Calloc((size_t)*n + 1, sizeof(Py_ssize_t));
    if (cap != NULL) *cap = PyMem_Calloc((size_t)*n + 1, sizeof(Py_ssize_t));
    if (*off == NULL || (cap != NULL && *cap == NULL)) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < *n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(fast, i);
        int ok = cap != NULL ? PyArg_ParseTuple(item, "nn", &(*off)[i], &(*cap)[i])
                             : ((*off)[i] = PyLong_AsSsize_t(item), !PyErr_Occurred());
        if (!ok) {
            Py_DECREF(fast);
            PyErr_Clear();
            bad("%s must hold %s, got %R", what, cap ? "(offset, size) pairs" : "offsets",
                item);
            return -1;
        }
    }
    Py_DECREF(fast);
    return 0;
}

static int check_params(PackState *s) {
    if (s->params.len < 8 || s->params.len % 8 != 0) {
        bad("the parameter array must be a whole number of 8-byte addresses, got %zd bytes",
            s->params.len);
        return -1;
    }
    uintptr_t lo = (uintptr_t)s->storage.buf, hi = lo + (uintptr_t)s->storage.len;
    const uint64_t *p = (const uint64_t *)s->params.buf;
    for (Py_ssize_t i = 0; i < s->params.len / 8; i++)
        if (p[i] != 0 && (p[i] < lo || p[i] >= hi)) {
            bad("parameter %zd points outside the argument storage", i);
            return -1;
        }
    return 0;
}

static PyObject *pack_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    static char *names[] = {"storage", "params", "ptr_offset", "n_ptrs", "scalars",
                            "metadata", "tensor_maps", NULL};
    PyObject *storage, *params, *scalars, *meta, *maps;
    Py_ssize_t ptr_offset, n_ptrs;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOnnOOO:PackState", names, &storage, &params,
                                     &ptr_offset, &n_ptrs, &scalars, &meta, &maps))
        return NULL;
    PackState *s = (PackState *)type->tp_alloc(type, 0);
    if (s == NULL) return NULL;
    s->meta_off = -1;
    if (PyObject_GetBuffer(storage, &s->storage, PyBUF_WRITABLE) < 0 ||
        PyObject_GetBuffer(params, &s->params, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        bad("storage must be a writable buffer and params a buffer");
        goto fail;
    }
    s->ptr_offset = ptr_offset;
    s->n_ptrs = n_ptrs;
    if (n_ptrs < 0 || n_ptrs > PY_SSIZE_T_MAX / 8) {
        bad("n_ptrs must be in [0, %zd), got %zd", PY_SSIZE_T_MAX / 8, n_ptrs);
        goto fail;
    }
    if (in_storage(s, ptr_offset, 8 * n_ptrs, "the pointers") < 0 || check_params(s) < 0)
        goto fail;
    if (read_slots(scalars, &s->scalar_off, &s->scalar_cap, &s->n_scalars, "scalars") < 0 ||
        read_slots(maps, &s->map_off, NULL, &s->n_maps, "tensor_maps") < 0)
        goto fail;
    for (Py_ssize_t i = 0; i < s->n_scalars; i++)
        if (in_storage(s, s->scalar_off[i], s->scalar_cap[i], "a scalar group") < 0) goto fail;
    for (Py_ssize_t i = 0; i < s->n_maps; i++)
        if (in_storage(s, s->map_off[i], 128, "a tensor map") < 0) goto fail;
    if (meta != Py_None) {
        if (!PyArg_ParseTuple(meta, "nn", &s->meta_off, &s->meta_size)) {
            PyErr_Clear();
            bad("metadata must be None or an (offset, size) pair, got %R", meta);
            goto fail;
        }
        if (in_storage(s, s->meta_off, s->meta_size, "the metadata") < 0) goto fail;
    }
    return (PyObject *)s;
fail:
    Py_DECREF(s);
    return NULL;
}

PyTypeObject PackStateType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "asynccube._core.cuda.native._native.PackState",
    .tp_basicsize = sizeof(PackState),
    .tp_dealloc = (destructor)pack_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "PackState(storage, params, ptr_offset, n_ptrs, scalars, metadata, tensor_maps)",
    .tp_new = pack_new,
};

/* Copy the bytes of `src` (a buffer) into the slot [off, off + cap). */
int pack_put(PackState *s, PyObject *src, Py_ssize_t off, Py_ssize_t cap, const char *what,
               int exact) {
    Py_buffer b;
    if (PyObject_GetBuffer(src, &b, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        bad("%s must be bytes-like, got %R", what, src);
        return -1;
    }
    int wrong = exact ? b.len != cap : b.len > cap;
    if (wrong) {
        bad("%s has %zd bytes; its parameter slot holds %zd", what, b.len, cap);
        PyBuffer_Release(&b);
        return -1;
    }
    memcpy((char *)s->storage.buf + off, b.buf, (size_t)b.len);
    PyBuffer_Release(&b);
    return 0;
}

static int fill_group(PackState *s, PyObject *items, Py_ssize_t n, Py_ssize_t *off,
                      Py_ssize_t *cap, const char *what) {
    PyObject *fast = PySequence_Fast(items, what);
    if (fast == NULL) return -1;
    Py_ssize_t got = PySequence_Fast_GET_SIZE(fast);
    int rc = 0;
    if (got != n) {
        bad("%zd %s given; the signature has %zd", got, what, n);
        rc = -1;
    }
    for (Py_ssize_t i = 0; rc == 0 && i < n; i++)
        rc = pack_put(s, PySequence_Fast_GET_ITEM(fast, i), off[i], cap ? cap[i] : 128, what,
                 cap == NULL);
    Py_DECREF(fast);
    return rc;
}

static int fill_pointers(PackState *s, PyObject *pointers) {
    PyObject *fast = PySequence_Fast(pointers, "pointers must be a sequence of ints");
    if (fast == NULL) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    if (n != s->n_ptrs) {
        Py_DECREF(fast);
        bad("%zd buffer pointers given; the signature has %zd", n, s->n_ptrs);
        return -1;
    }
    unsigned long long *dst = (unsigned long long *)((char *)s->storage.buf + s->ptr_offset);
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned long long v;
        if (as_u64(PySequence_Fast_GET_ITEM(fast, i), "a buffer pointer", &v) < 0) {
            Py_DECREF(fast);
            return -1;
        }
        memcpy(dst + i, &v, 8);
    }
    Py_DECREF(fast);
    return 0;
}

/* launch(state, function, gx, gy, gz, bx, by, bz, shared, stream, pointers, scalars,
 *        metadata, tensor_maps) -> CUresult */
PyObject *launch(PyObject *self, PyObject *const *a, Py_ssize_t n) {
    if (nargs_ok(n, 14, "launch") < 0) return NULL;
    if (!PyObject_TypeCheck(a[0], &PackStateType))
        return bad("state must be a PackState, got %R", a[0]);
    PackState *s = (PackState *)a[0];
    unsigned long long fn, stream;
    unsigned d[7];
    static const char *dims[] = {"grid x", "grid y", "grid z", "block x",
                                 "block y", "block z", "shared memory bytes"};
    if (as_handle(a[1], "function", &fn) < 0) return NULL;
    if (fn == 0) return bad("function must be a loaded kernel, got 0");
    for (int i = 0; i < 7; i++)
        if (as_u32(a[2 + i], dims[i], &d[i]) < 0) return NULL;
    if (as_handle(a[9], "stream", &stream) < 0 || fill_pointers(s, a[10]) < 0) return NULL;
    if (a[11] != Py_None &&
        fill_group(s, a[11], s->n_scalars, s->scalar_off, s->scalar_cap, "scalar groups") < 0)
        return NULL;
    if (a[12] != Py_None) {
        if (s->meta_off < 0) return bad("metadata given, but the signature has none");
        if (pack_put(s, a[12], s->meta_off, s->meta_size, "metadata", 1) < 0) return NULL;
    }
    if (a[13] != Py_None && fill_group(s, a[13], s->n_maps, s->map_off, NULL, "tensor maps") < 0)
        return NULL;
    if (need_driver() < 0) return NULL;
    CUresult err = cu.launch((CUh)(uintptr_t)fn, d[0], d[1], d[2], d[3], d[4], d[5], d[6],
                             (CUh)(uintptr_t)stream, (void **)s->params.buf, NULL);
    return PyLong_FromLong(err);
}
