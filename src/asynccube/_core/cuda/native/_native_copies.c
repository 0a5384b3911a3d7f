/* asynccube._core.cuda.native._native: events, copies, pointer queries and host copies (see _native.h). */
#include "_native.h"

/* ---------------------------------------------------------------- events, copies */

static PyObject *two_handles(PyObject *const *a, Py_ssize_t n, const char *name,
                             const char *w0, const char *w1, unsigned long long *h) {
    if (nargs_ok(n, 2, name) < 0 || as_handle(a[0], w0, &h[0]) < 0 ||
        as_handle(a[1], w1, &h[1]) < 0)
        return NULL;
    if (need_driver() < 0) return NULL;
    return Py_None;
}

PyObject *event_record(PyObject *self, PyObject *const *a, Py_ssize_t n) {
    unsigned long long h[2];
    if (two_handles(a, n, "event_record", "event", "stream", h) == NULL) return NULL;
    return PyLong_FromLong(cu.event_record((CUh)(uintptr_t)h[0], (CUh)(uintptr_t)h[1]));
}

PyObject *stream_wait_event(PyObject *self, PyObject *const *a, Py_ssize_t n) {
    unsigned long long h[2];
    if (two_handles(a, n, "stream_wait_event", "stream", "event", h) == NULL) return NULL;
    return PyLong_FromLong(cu.wait_event((CUh)(uintptr_t)h[0], (CUh)(uintptr_t)h[1], 0));
}

PyObject *event_query(PyObject *self, PyObject *event) {
    unsigned long long h;
    if (as_handle(event, "event", &h) < 0 || need_driver() < 0) return NULL;
    return PyLong_FromLong(cu.event_query((CUh)(uintptr_t)h));
}

PyObject *stream_query(PyObject *self, PyObject *stream) {
    unsigned long long h;
    if (as_handle(stream, "stream", &h) < 0 || need_driver() < 0) return NULL;
    return PyLong_FromLong(cu.stream_query((CUh)(uintptr_t)h));
}

/* memcpy_async(to_device, device, host, nbytes, stream) -> CUresult */
PyObject *memcpy_async(PyObject *self, PyObject *const *a, Py_ssize_t n) {
    unsigned long long dev, host, stream;
    size_t nbytes;
    if (nargs_ok(n, 5, "memcpy_async") < 0) return NULL;
    int to_device = PyObject_IsTrue(a[0]);
    if (to_device < 0 || as_u64(a[1], "device address", &dev) < 0 ||
        as_u64(a[2], "host address", &host) < 0 || as_size(a[3], "nbytes", &nbytes) < 0 ||
        as_handle(a[4], "stream", &stream) < 0)
        return NULL;
    if (host == 0 && nbytes) return bad("host address must not be 0");
    if (need_driver() < 0) return NULL;
    CUresult err = to_device
                       ? cu.htod(dev, (const void *)(uintptr_t)host, nbytes, (CUh)(uintptr_t)stream)
                       : cu.dtoh((void *)(uintptr_t)host, dev, nbytes, (CUh)(uintptr_t)stream);
    return PyLong_FromLong(err);
}

/* memcpy_peer(dst, dst_context, src, src_context, nbytes, stream) -> CUresult, or None
 * where the driver has no cuMemcpyPeerAsync (the caller takes cuda.bindings' then) */
PyObject *memcpy_peer(PyObject *self, PyObject *const *a, Py_ssize_t n) {
    unsigned long long dst, dctx, src, sctx, stream;
    size_t nbytes;
    if (nargs_ok(n, 6, "memcpy_peer") < 0 || as_u64(a[0], "destination address", &dst) < 0 ||
        as_handle(a[1], "destination context", &dctx) < 0 ||
        as_u64(a[2], "source address", &src) < 0 ||
        as_handle(a[3], "source context", &sctx) < 0 || as_size(a[4], "nbytes", &nbytes) < 0 ||
        as_handle(a[5], "stream", &stream) < 0)
        return NULL;
    if (need_driver() < 0) return NULL;
    if (cu.peer == NULL) Py_RETURN_NONE;
    return PyLong_FromLong(cu.peer(dst, (CUh)(uintptr_t)dctx, src, (CUh)(uintptr_t)sctx, nbytes,
                                   (CUh)(uintptr_t)stream));
}

PyObject *param_sizes(PyObject *self, PyObject *function) {
    unsigned long long fn;
    if (as_handle(function, "function", &fn) < 0) return NULL;
    if (fn == 0) return bad("function must be a loaded kernel, got 0");
    if (need_driver() < 0) return NULL;
    if (cu.param_count == NULL || cu.param_info == NULL) Py_RETURN_NONE;
    size_t count = 0, off, size;
    CUresult err = cu.param_count((CUh)(uintptr_t)fn, &count);
    if (err) return Py_BuildValue("(iO)", err, Py_None);
    PyObject *out = PyTuple_New((Py_ssize_t)count);
    for (size_t i = 0; out != NULL && i < count; i++) {
        err = cu.param_info((CUh)(uintptr_t)fn, i, &off, &size);
        if (err) {
            Py_DECREF(out);
            return Py_BuildValue("(iO)", err, Py_None);
        }
        PyTuple_SET_ITEM(out, (Py_ssize_t)i, PyLong_FromSize_t(size));
    }
    if (out == NULL) return NULL;
    return Py_BuildValue("(iN)", 0, out);
}

PyObject *is_pinned(PyObject *self, PyObject *address) {
    unsigned long long addr;
    if (as_u64(address, "address", &addr) < 0 || need_driver() < 0) return NULL;
    int attr = CU_POINTER_ATTRIBUTE_MEMORY_TYPE;
    unsigned kind = 0;
    void *data[1] = {&kind};
    CUresult err = cu.ptr_attrs(1, &attr, data, (CUdeviceptr)addr);
    return PyBool_FromLong(!err && kind == CU_MEMORYTYPE_HOST);
}

PyObject *address(PyObject *self, PyObject *data) {
    Py_buffer b;
    if (PyObject_GetBuffer(data, &b, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        return bad("need a contiguous bytes-like object, got %R", data);
    }
    PyObject *out = PyLong_FromVoidPtr(b.buf);
    PyBuffer_Release(&b);
    return out;
}

/* ---------------------------------------------------------------- host copies */

typedef struct {
    char *dst;
    const char *src;
    size_t n;
} Chunk;

static void *copy_chunk(void *arg) {
    Chunk *c = arg;
    memcpy(c->dst, c->src, c->n);
    return NULL;
}

#define MAX_THREADS 16

static void parallel_copy(char *dst, const char *src, size_t n, int threads) {
    Chunk chunks[MAX_THREADS];
    pthread_t ids[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    size_t step = ((n / (size_t)threads) + 4095) & ~(size_t)4095;
    for (int i = 0; i < threads; i++) {
        size_t at = step * (size_t)i;
        chunks[i].dst = dst + at;
        chunks[i].src = src + at;
        chunks[i].n = at >= n ? 0 : (n - at < step ? n - at : step);
        started[i] = i > 0 && pthread_create(&ids[i], NULL, copy_chunk, &chunks[i]) == 0;
    }
    for (int i = 0; i < threads; i++)
        if (!started[i]) copy_chunk(&chunks[i]);
    for (int i = 1; i < threads; i++)
        if (started[i]) pthread_join(ids[i], NULL);
}

/* copy_into(dst, src, threads) -> None: copy buffer src into the start of writable
 * buffer dst; the GIL is released from 1 MiB; threads > 1 split copies of 16 MiB+. */
PyObject *copy_into(PyObject *self, PyObject *const *a, Py_ssize_t n) {
    Py_buffer dst, src;
    unsigned threads;
    if (nargs_ok(n, 3, "copy_into") < 0 || as_u32(a[2], "threads", &threads) < 0) return NULL;
    if (PyObject_GetBuffer(a[0], &dst, PyBUF_WRITABLE) < 0) {
        PyErr_Clear();
        return bad("dst must be a writable buffer, got %R", a[0]);
    }
    if (PyObject_GetBuffer(a[1], &src, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        PyBuffer_Release(&dst);
        return bad("src must be a contiguous bytes-like object, got %R", a[1]);
    }
    PyObject *out = Py_None;
    if (src.len > dst.len) {
        out = bad("src has %zd bytes, dst only %zd", src.len, dst.len);
    } else if (src.len < (1 << 20)) {
        memcpy(dst.buf, src.buf, (size_t)src.len);
    } else {
        int t = threads < 1 ? 1 : (threads > MAX_THREADS ? MAX_THREADS : (int)threads);
        if (src.len < (16 << 20)) t = 1;
        Py_BEGIN_ALLOW_THREADS parallel_copy(dst.buf, src.buf, (size_t)src.len, t);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    return out == NULL ? NULL : Py_NewRef(out);
}
