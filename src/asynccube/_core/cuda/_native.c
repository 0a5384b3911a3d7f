/* asynccube._core.cuda._native: the CUDA hot path in C (see hotpath.py for the interface,
 * and _twin.py for the pure-Python twin with the same behaviour).
 *
 * Built without any CUDA header or toolkit: the few driver types are declared here and
 * the entry points are resolved from libcuda.so.1 by open_driver() (dlopen + dlsym), when
 * a GPU client opens. Mechanism only: every function takes plain integers (handles,
 * addresses) or buffers, returns the driver's CUresult as an int, and never decides
 * order, lifetime or errors. Bad arguments raise InvalidArgument (asynccube's, a
 * ValueError): wrong types, out-of-range integers, argument blocks and values of the
 * wrong size. What cannot be checked without the driver's own bookkeeping is trusted,
 * as in cuda.bindings: driver handles and raw host/device addresses must come from the
 * driver (the server passes only its own).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef void *CUh; /* CUfunction, CUstream, CUevent: opaque pointers */
typedef unsigned long long CUdeviceptr;
typedef void (*CUhostFn)(void *);

#define CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define CU_MEMORYTYPE_HOST 1
#define NO_DRIVER (-1)

static struct {
    void *lib;
    CUresult (*launch)(CUh, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                       unsigned, CUh, void **, void **);
    CUresult (*event_record)(CUh, CUh);
    CUresult (*event_query)(CUh);
    CUresult (*wait_event)(CUh, CUh, unsigned);
    CUresult (*htod)(CUdeviceptr, const void *, size_t, CUh);
    CUresult (*dtoh)(void *, CUdeviceptr, size_t, CUh);
    CUresult (*host_func)(CUh, CUhostFn, void *);
    CUresult (*param_count)(CUh, size_t *);
    CUresult (*param_info)(CUh, size_t, size_t *, size_t *);
    CUresult (*ptr_attrs)(unsigned, int *, void **, CUdeviceptr);
    CUresult (*event_create)(CUh *, unsigned);
    CUresult (*event_destroy)(CUh);
    CUresult (*ctx_get)(CUh *);
    CUresult (*ctx_set)(CUh);
} cu;

static PyObject *InvalidArgument; /* asynccube._core.errors.InvalidArgument */

static PyObject *bad(const char *fmt, ...) {
    va_list va;
    va_start(va, fmt);
    PyObject *msg = PyUnicode_FromFormatV(fmt, va);
    va_end(va);
    if (msg != NULL) {
        PyErr_SetObject(InvalidArgument, msg);
        Py_DECREF(msg);
    }
    return NULL;
}

/* An unsigned 64-bit integer from an int or anything with __int__ (a cuda.bindings
 * handle); raises InvalidArgument naming `what` otherwise. */
static int as_u64(PyObject *o, const char *what, unsigned long long *out) {
    PyObject *n = PyLong_Check(o) ? (Py_INCREF(o), o) : NULL;
    if (n == NULL && o != Py_None && !PyFloat_Check(o) && Py_TYPE(o)->tp_as_number != NULL &&
        Py_TYPE(o)->tp_as_number->nb_int != NULL)
        n = PyNumber_Long(o);
    if (n == NULL) {
        PyErr_Clear();
        bad("%s must be an int or a driver handle, got %R", what, o);
        return -1;
    }
    *out = PyLong_AsUnsignedLongLong(n);
    Py_DECREF(n);
    if (*out == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        bad("%s must be an int in [0, 2**64), got %R", what, o);
        return -1;
    }
    return 0;
}

/* A driver handle: None is the null handle (as in cuda.bindings). */
static int as_handle(PyObject *o, const char *what, unsigned long long *out) {
    if (o == Py_None) {
        *out = 0;
        return 0;
    }
    return as_u64(o, what, out);
}

static int as_u32(PyObject *o, const char *what, unsigned *out) {
    unsigned long long v;
    if (as_u64(o, what, &v) < 0) return -1;
    if (v > 0xFFFFFFFFull) {
        bad("%s must fit in 32 bits, got %R", what, o);
        return -1;
    }
    *out = (unsigned)v;
    return 0;
}

static int as_size(PyObject *o, const char *what, size_t *out) {
    unsigned long long v;
    if (as_u64(o, what, &v) < 0) return -1;
    if (v > (unsigned long long)PY_SSIZE_T_MAX) {
        bad("%s is too large: %R", what, o);
        return -1;
    }
    *out = (size_t)v;
    return 0;
}

static int need_driver(void) {
    if (cu.lib == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the CUDA driver is not open (call open_driver())");
        return -1;
    }
    return 0;
}

static int nargs_ok(Py_ssize_t n, Py_ssize_t want, const char *name) {
    if (n == want) return 0;
    PyErr_Format(PyExc_TypeError, "%s() takes %zd arguments (%zd given)", name, want, n);
    return -1;
}

/* ---------------------------------------------------------------- driver loading */

#define RESOLVE(field, name, required)                                         \
    do {                                                                       \
        *(void **)(&cu.field) = dlsym(lib, name);                              \
        if (cu.field == NULL && (required)) {                                  \
            dlclose(lib);                                                      \
            memset(&cu, 0, sizeof(cu));                                        \
            return PyErr_Format(PyExc_OSError, "libcuda.so.1 lacks %s", name); \
        }                                                                      \
    } while (0)

static PyObject *open_driver(PyObject *self, PyObject *unused) {
    if (cu.lib != NULL) Py_RETURN_NONE;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        const char *why = dlerror();
        return PyErr_Format(PyExc_OSError, "cannot load libcuda.so.1: %s", why ? why : "?");
    }
    RESOLVE(launch, "cuLaunchKernel", 1);
    RESOLVE(event_record, "cuEventRecord", 1);
    RESOLVE(event_query, "cuEventQuery", 1);
    RESOLVE(wait_event, "cuStreamWaitEvent", 1);
    RESOLVE(htod, "cuMemcpyHtoDAsync_v2", 1);
    RESOLVE(dtoh, "cuMemcpyDtoHAsync_v2", 1);
    RESOLVE(host_func, "cuLaunchHostFunc", 1);
    RESOLVE(ptr_attrs, "cuPointerGetAttributes", 1);
    RESOLVE(event_create, "cuEventCreate", 1);
    RESOLVE(event_destroy, "cuEventDestroy_v2", 1);
    RESOLVE(ctx_get, "cuCtxGetCurrent", 1);
    RESOLVE(ctx_set, "cuCtxSetCurrent", 1);
    RESOLVE(param_count, "cuFuncGetParamCount", 0);
    RESOLVE(param_info, "cuFuncGetParamInfo", 0);
    cu.lib = lib;
    Py_RETURN_NONE;
}

static PyObject *driver_open(PyObject *self, PyObject *unused) {
    return PyBool_FromLong(cu.lib != NULL);
}

/* ---------------------------------------------------------------- PackState */

/* The argument block of one kernel signature (built once per ArgPack): the storage
 * every argument lives in, the void* array the driver reads, and where the pointer,
 * scalar, metadata and tensor-map values go. Checked once here; launch() only copies. */
typedef struct {
    PyObject_HEAD
    Py_buffer storage;
    Py_buffer params;
    Py_ssize_t ptr_offset, n_ptrs;
    Py_ssize_t n_scalars, *scalar_off, *scalar_cap;
    Py_ssize_t meta_off, meta_size; /* meta_off < 0: no metadata */
    Py_ssize_t n_maps, *map_off;
} PackState;

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

static PyTypeObject PackStateType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "asynccube._core.cuda._native.PackState",
    .tp_basicsize = sizeof(PackState),
    .tp_dealloc = (destructor)pack_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "PackState(storage, params, ptr_offset, n_ptrs, scalars, metadata, tensor_maps)",
    .tp_new = pack_new,
};

/* Copy the bytes of `src` (a buffer) into the slot [off, off + cap). */
static int put(PackState *s, PyObject *src, Py_ssize_t off, Py_ssize_t cap, const char *what,
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
        rc = put(s, PySequence_Fast_GET_ITEM(fast, i), off[i], cap ? cap[i] : 128, what,
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
static PyObject *launch(PyObject *self, PyObject *const *a, Py_ssize_t n) {
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
        if (put(s, a[12], s->meta_off, s->meta_size, "metadata", 1) < 0) return NULL;
    }
    if (a[13] != Py_None && fill_group(s, a[13], s->n_maps, s->map_off, NULL, "tensor maps") < 0)
        return NULL;
    if (need_driver() < 0) return NULL;
    CUresult err = cu.launch((CUh)(uintptr_t)fn, d[0], d[1], d[2], d[3], d[4], d[5], d[6],
                             (CUh)(uintptr_t)stream, (void **)s->params.buf, NULL);
    return PyLong_FromLong(err);
}

/* ---------------------------------------------------------------- events, copies */

static PyObject *two_handles(PyObject *const *a, Py_ssize_t n, const char *name,
                             const char *w0, const char *w1, unsigned long long *h) {
    if (nargs_ok(n, 2, name) < 0 || as_handle(a[0], w0, &h[0]) < 0 ||
        as_handle(a[1], w1, &h[1]) < 0)
        return NULL;
    if (need_driver() < 0) return NULL;
    return Py_None;
}

static PyObject *event_record(PyObject *self, PyObject *const *a, Py_ssize_t n) {
    unsigned long long h[2];
    if (two_handles(a, n, "event_record", "event", "stream", h) == NULL) return NULL;
    return PyLong_FromLong(cu.event_record((CUh)(uintptr_t)h[0], (CUh)(uintptr_t)h[1]));
}

static PyObject *stream_wait_event(PyObject *self, PyObject *const *a, Py_ssize_t n) {
    unsigned long long h[2];
    if (two_handles(a, n, "stream_wait_event", "stream", "event", h) == NULL) return NULL;
    return PyLong_FromLong(cu.wait_event((CUh)(uintptr_t)h[0], (CUh)(uintptr_t)h[1], 0));
}

static PyObject *event_query(PyObject *self, PyObject *event) {
    unsigned long long h;
    if (as_handle(event, "event", &h) < 0 || need_driver() < 0) return NULL;
    return PyLong_FromLong(cu.event_query((CUh)(uintptr_t)h));
}

/* memcpy_async(to_device, device, host, nbytes, stream) -> CUresult */
static PyObject *memcpy_async(PyObject *self, PyObject *const *a, Py_ssize_t n) {
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

static void close_fd(void *data) { close((int)(intptr_t)data); }

/* notify_close(stream, fd) -> CUresult: the driver's thread closes fd once the stream
 * reaches this point (a plain C host function: no Python, no GIL). */
static PyObject *notify_close(PyObject *self, PyObject *const *a, Py_ssize_t n) {
    unsigned long long stream;
    unsigned fd;
    if (nargs_ok(n, 2, "notify_close") < 0 || as_handle(a[0], "stream", &stream) < 0 ||
        as_u32(a[1], "fd", &fd) < 0)
        return NULL;
    if (fd > INT32_MAX) return bad("fd out of range: %u", fd);
    if (need_driver() < 0) return NULL;
    return PyLong_FromLong(cu.host_func((CUh)(uintptr_t)stream, close_fd, (void *)(intptr_t)fd));
}

static PyObject *param_sizes(PyObject *self, PyObject *function) {
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

static PyObject *is_pinned(PyObject *self, PyObject *address) {
    unsigned long long addr;
    if (as_u64(address, "address", &addr) < 0 || need_driver() < 0) return NULL;
    int attr = CU_POINTER_ATTRIBUTE_MEMORY_TYPE;
    unsigned kind = 0;
    void *data[1] = {&kind};
    CUresult err = cu.ptr_attrs(1, &attr, data, (CUdeviceptr)addr);
    return PyBool_FromLong(!err && kind == CU_MEMORYTYPE_HOST);
}

static PyObject *address(PyObject *self, PyObject *data) {
    Py_buffer b;
    if (PyObject_GetBuffer(data, &b, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        return bad("need a contiguous bytes-like object, got %R", data);
    }
    PyObject *out = PyLong_FromVoidPtr(b.buf);
    PyBuffer_Release(&b);
    return out;
}

/* ---------------------------------------------------------------- spinning notifier */

/* A driver host function wakes its callback thread some 0.1-0.7 ms after the work it
 * follows (measured on H200s, driver 580): far more than a copy of a few MiB takes.
 * notify_spin() gives the pipe's write end to one C thread (no Python, no GIL) that polls
 * an event of its own, recorded on the notify stream after the waits, and closes the fd
 * the moment the event completes; an item still pending after its spin budget is handed
 * to the driver instead (the same close_fd host function, enqueued by that thread), so a
 * long kernel costs no CPU. The thread sleeps on a condition variable while idle. */

typedef struct SpinItem {
    struct SpinItem *next;
    CUh ctx, event, stream;
    int fd;
    double deadline;
} SpinItem;

static pthread_mutex_t sp_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t sp_wake = PTHREAD_COND_INITIALIZER;
static pthread_cond_t sp_idle = PTHREAD_COND_INITIALIZER;
static SpinItem *sp_incoming;
static long sp_in_flight;
static int sp_started;

#define CU_EVENT_DISABLE_TIMING 2
#define CUDA_ERROR_NOT_READY 600

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Finish an item whose event completed (or failed, or timed out into a host function). */
static void sp_retire(SpinItem *it, int hand_to_driver) {
    cu.ctx_set(it->ctx);
    if (!hand_to_driver || cu.host_func(it->stream, close_fd, (void *)(intptr_t)it->fd))
        close(it->fd); /* done (or the driver refused: the loop's own poll sees why) */
    cu.event_destroy(it->event);
    free(it);
}

static void *sp_main(void *unused) {
    SpinItem *mine = NULL;
    for (;;) {
        pthread_mutex_lock(&sp_lock);
        while (mine == NULL && sp_incoming == NULL) pthread_cond_wait(&sp_wake, &sp_lock);
        while (sp_incoming != NULL) {
            SpinItem *it = sp_incoming;
            sp_incoming = it->next;
            it->next = mine;
            mine = it;
        }
        pthread_mutex_unlock(&sp_lock);
        double now = now_s();
        long finished = 0;
        CUh current = NULL;
        for (SpinItem **at = &mine; *at != NULL;) {
            SpinItem *it = *at;
            if (it->ctx != current) {
                cu.ctx_set(it->ctx);
                current = it->ctx;
            }
            CUresult r = cu.event_query(it->event);
            if (r == CUDA_ERROR_NOT_READY && now < it->deadline) {
                at = &it->next;
                continue;
            }
            *at = it->next;
            sp_retire(it, r == CUDA_ERROR_NOT_READY);
            current = NULL;
            finished++;
        }
        if (finished) {
            pthread_mutex_lock(&sp_lock);
            sp_in_flight -= finished;
            if (sp_in_flight == 0) pthread_cond_broadcast(&sp_idle);
            pthread_mutex_unlock(&sp_lock);
        }
    }
    return NULL;
}

/* notify_spin(stream, fd, spin_ns) -> CUresult: like notify_close, but the fd is closed
 * by the spinning thread as soon as the stream gets here, within spin_ns; after that by
 * a host function. The calling thread's current context must own the stream. */
static PyObject *notify_spin(PyObject *self, PyObject *const *a, Py_ssize_t n) {
    unsigned long long stream, spin_ns;
    unsigned fd;
    if (nargs_ok(n, 3, "notify_spin") < 0 || as_handle(a[0], "stream", &stream) < 0 ||
        as_u32(a[1], "fd", &fd) < 0 || as_u64(a[2], "spin_ns", &spin_ns) < 0)
        return NULL;
    if (fd > INT32_MAX) return bad("fd out of range: %u", fd);
    if (need_driver() < 0) return NULL;
    SpinItem *it = calloc(1, sizeof(SpinItem));
    if (it == NULL) return PyErr_NoMemory();
    CUresult err = cu.ctx_get(&it->ctx);
    if (!err && it->ctx == NULL) err = 201; /* CUDA_ERROR_INVALID_CONTEXT */
    if (!err) err = cu.event_create(&it->event, CU_EVENT_DISABLE_TIMING);
    if (!err) {
        err = cu.event_record(it->event, (CUh)(uintptr_t)stream);
        if (err) cu.event_destroy(it->event);
    }
    if (err) {
        free(it);
        return PyLong_FromLong(err);
    }
    it->stream = (CUh)(uintptr_t)stream;
    it->fd = (int)fd;
    it->deadline = now_s() + 1e-9 * (double)spin_ns;
    pthread_mutex_lock(&sp_lock);
    if (!sp_started) {
        pthread_t id;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        sp_started = pthread_create(&id, &attr, sp_main, NULL) == 0;
        pthread_attr_destroy(&attr);
    }
    if (!sp_started) { /* no thread: the driver closes it, as notify_close does */
        pthread_mutex_unlock(&sp_lock);
        err = cu.host_func(it->stream, close_fd, (void *)(intptr_t)it->fd);
        cu.event_destroy(it->event);
        free(it);
        return PyLong_FromLong(err);
    }
    it->next = sp_incoming;
    sp_incoming = it;
    sp_in_flight++;
    pthread_cond_signal(&sp_wake);
    pthread_mutex_unlock(&sp_lock);
    return PyLong_FromLong(0);
}

/* notify_drain(timeout_s) -> bool: wait (GIL released) until the spinning thread holds
 * no item, so a context can be destroyed under none of its events; False on timeout. */
static PyObject *notify_drain(PyObject *self, PyObject *timeout) {
    double t = PyFloat_AsDouble(timeout);
    if (t == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return bad("timeout must be a number of seconds, got %R", timeout);
    }
    if (!(t >= 0)) return bad("timeout must be >= 0, got %R", timeout);
    long left;
    Py_BEGIN_ALLOW_THREADS
    double until = now_s() + t;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double rt = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec + t;
    ts.tv_sec = (time_t)rt;
    ts.tv_nsec = (long)((rt - (double)ts.tv_sec) * 1e9);
    pthread_mutex_lock(&sp_lock);
    while (sp_in_flight > 0 && now_s() < until)
        if (pthread_cond_timedwait(&sp_idle, &sp_lock, &ts) != 0) break;
    left = sp_in_flight;
    pthread_mutex_unlock(&sp_lock);
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(left == 0);
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
static PyObject *copy_into(PyObject *self, PyObject *const *a, Py_ssize_t n) {
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

/* ---------------------------------------------------------------- module */

static PyMethodDef methods[] = {
    {"open_driver", open_driver, METH_NOARGS, "Load libcuda.so.1 and resolve the entry points."},
    {"driver_open", driver_open, METH_NOARGS, "True once open_driver() succeeded."},
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL,
     "launch(state, function, gx, gy, gz, bx, by, bz, shared, stream, pointers, scalars, "
     "metadata, tensor_maps) -> CUresult"},
    {"event_record", (PyCFunction)(void (*)(void))event_record, METH_FASTCALL,
     "event_record(event, stream) -> CUresult"},
    {"event_query", event_query, METH_O, "event_query(event) -> CUresult"},
    {"stream_wait_event", (PyCFunction)(void (*)(void))stream_wait_event, METH_FASTCALL,
     "stream_wait_event(stream, event) -> CUresult"},
    {"memcpy_async", (PyCFunction)(void (*)(void))memcpy_async, METH_FASTCALL,
     "memcpy_async(to_device, device, host, nbytes, stream) -> CUresult"},
    {"notify_close", (PyCFunction)(void (*)(void))notify_close, METH_FASTCALL,
     "notify_close(stream, fd) -> CUresult"},
    {"notify_spin", (PyCFunction)(void (*)(void))notify_spin, METH_FASTCALL,
     "notify_spin(stream, fd, spin_ns) -> CUresult"},
    {"notify_drain", notify_drain, METH_O, "notify_drain(timeout_s) -> bool"},
    {"param_sizes", param_sizes, METH_O,
     "param_sizes(function) -> (CUresult, sizes) or None where the driver cannot say"},
    {"is_pinned", is_pinned, METH_O, "is_pinned(address) -> bool (page-locked host memory)"},
    {"address", address, METH_O, "address(buffer) -> int: the address of its first byte"},
    {"copy_into", (PyCFunction)(void (*)(void))copy_into, METH_FASTCALL,
     "copy_into(dst, src, threads) -> None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_native", "asynccube's compiled CUDA hot path.", -1, methods,
};

PyMODINIT_FUNC PyInit__native(void) {
    PyObject *errors = PyImport_ImportModule("asynccube._core.errors");
    if (errors == NULL) return NULL;
    InvalidArgument = PyObject_GetAttrString(errors, "InvalidArgument");
    Py_DECREF(errors);
    if (InvalidArgument == NULL || PyType_Ready(&PackStateType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&PackStateType);
    if (PyModule_AddObject(m, "PackState", (PyObject *)&PackStateType) < 0) {
        Py_DECREF(&PackStateType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
