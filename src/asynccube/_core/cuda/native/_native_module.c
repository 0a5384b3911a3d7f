/* asynccube._core.cuda.native._native: the module itself: loading the driver
 * (open_driver), the method table and PyInit__native, which readies the types of the
 * other parts and interns the attribute names FastLaunch reads. Nothing includes or
 * calls this file: it stands above the other parts (see DESIGN.md). */
#include "_native.h"

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
    RESOLVE(stream_query, "cuStreamQuery", 1);
    RESOLVE(stream_ctx, "cuStreamGetCtx", 1);
    RESOLVE(stream_capturing, "cuStreamIsCapturing", 1);
    RESOLVE(param_count, "cuFuncGetParamCount", 0);
    RESOLVE(param_info, "cuFuncGetParamInfo", 0);
    RESOLVE(peer, "cuMemcpyPeerAsync", 0);
    cu.lib = lib;
    Py_RETURN_NONE;
}

static PyObject *driver_open(PyObject *self, PyObject *unused) {
    return PyBool_FromLong(cu.lib != NULL);
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
    {"stream_query", stream_query, METH_O, "stream_query(stream) -> CUresult"},
    {"stream_check", stream_check, METH_O,
     "stream_check(stream) -> (CUresult of cuStreamGetCtx, context, CUresult of "
     "cuStreamIsCapturing, capture status)"},
    {"ctx_set", ctx_set, METH_O, "ctx_set(context) -> CUresult (cuCtxSetCurrent)"},
    {"stream_wait_event", (PyCFunction)(void (*)(void))stream_wait_event, METH_FASTCALL,
     "stream_wait_event(stream, event) -> CUresult"},
    {"memcpy_async", (PyCFunction)(void (*)(void))memcpy_async, METH_FASTCALL,
     "memcpy_async(to_device, device, host, nbytes, stream) -> CUresult"},
    {"memcpy_peer", (PyCFunction)(void (*)(void))memcpy_peer, METH_FASTCALL,
     "memcpy_peer(dst, dst_context, src, src_context, nbytes, stream) -> CUresult, or None "
     "where the driver lacks cuMemcpyPeerAsync"},
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
    {"bytes_at", (PyCFunction)(void (*)(void))bytes_at, METH_FASTCALL,
     "bytes_at(address, nbytes, threads) -> bytes"},
    {"copy_stats", (PyCFunction)copy_stats, METH_NOARGS,
     "copy_stats() -> (copies through the copy helpers, pieces they copied)"},
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
    if (InvalidArgument == NULL || PyType_Ready(&PackStateType) < 0 ||
        PyType_Ready(&FastLaunchType) < 0 || fast_init_names() < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&PackStateType);
    if (PyModule_AddObject(m, "PackState", (PyObject *)&PackStateType) < 0) {
        Py_DECREF(&PackStateType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&FastLaunchType);
    if (PyModule_AddObject(m, "FastLaunch", (PyObject *)&FastLaunchType) < 0) {
        Py_DECREF(&FastLaunchType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
