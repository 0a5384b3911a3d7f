/* asynccube._core.cuda.native._native: declarations shared by its parts (_native.c: module,
 * argument checks, driver loading; _native_launch.c: argument blocks and launches;
 * _native_copies.c: events, copies, pointers; _native_notify.c: completion pipes;
 * _native_fast.c, _native_plan.c, _native_read.c, _native_alloc.c: FastLaunch).
 * Built with -fvisibility=hidden: nothing but PyInit__native leaves the module. */
#ifndef ASYNCCUBE_NATIVE_H
#define ASYNCCUBE_NATIVE_H
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
#define CUDA_ERROR_NOT_READY 600

/* Seconds on CLOCK_MONOTONIC (time.perf_counter's clock on Linux). */
static inline double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef struct {
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
    CUresult (*stream_query)(CUh);
} CuDriver;

extern CuDriver cu; /* the driver's entry points, filled by open_driver() */


extern PyObject *InvalidArgument; /* asynccube._core.errors.InvalidArgument */
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

extern PyTypeObject PackStateType;

/* Copy the bytes of `src` (a buffer) into the pack's slot [off, off + cap) (exact: the
 * sizes must match); raises InvalidArgument naming `what`. */
int pack_put(PackState *s, PyObject *src, Py_ssize_t off, Py_ssize_t cap, const char *what,
             int exact);

/* Argument checks shared by every part (_native.c): each sets InvalidArgument (or
 * TypeError for a wrong argument count) and returns NULL / -1. */
PyObject *bad(const char *fmt, ...);
int as_u64(PyObject *o, const char *what, unsigned long long *out);
int as_handle(PyObject *o, const char *what, unsigned long long *out);
int as_u32(PyObject *o, const char *what, unsigned *out);
int as_size(PyObject *o, const char *what, size_t *out);
int need_driver(void);
int nargs_ok(Py_ssize_t n, Py_ssize_t want, const char *name);

/* The module's functions, one part each (see the method table in _native.c). */
PyObject *launch(PyObject *self, PyObject *const *a, Py_ssize_t n);          /* _native_launch.c */
PyObject *event_record(PyObject *self, PyObject *const *a, Py_ssize_t n);    /* _native_copies.c */
PyObject *stream_wait_event(PyObject *self, PyObject *const *a, Py_ssize_t n);
PyObject *event_query(PyObject *self, PyObject *event);
PyObject *stream_query(PyObject *self, PyObject *stream);
PyObject *memcpy_async(PyObject *self, PyObject *const *a, Py_ssize_t n);
PyObject *param_sizes(PyObject *self, PyObject *function);
PyObject *is_pinned(PyObject *self, PyObject *address);
PyObject *address(PyObject *self, PyObject *data);
PyObject *copy_into(PyObject *self, PyObject *const *a, Py_ssize_t n);
PyObject *notify_close(PyObject *self, PyObject *const *a, Py_ssize_t n);    /* _native_notify.c */
PyObject *notify_spin(PyObject *self, PyObject *const *a, Py_ssize_t n);
PyObject *notify_drain(PyObject *self, PyObject *timeout);
extern PyTypeObject FastLaunchType;                                          /* _native_fast.c */
int fast_init_names(void);

#endif
