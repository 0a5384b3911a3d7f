/* The driver's floor, measured from C: built at bench time by benchmarks/_floor.py.
 *
 * No CUDA headers: the few driver types and entry points are declared here and
 * resolved with dlopen("libcuda.so.1"), as asynccube's own extension does.
 *
 * Built two ways from this one file:
 *   gcc -O2 -DFLOOR_MAIN floor.c -ldl -o floor     a C program: timed loops of
 *       cuLaunchKernel (4-arg add4, empty kernel), launch + cuStreamSynchronize,
 *       1 KiB cuMemcpyDtoHAsync + sync, cuMemAllocAsync + cuMemFreeAsync 1 MiB;
 *       prints one JSON object. argv: CUBIN_PATH
 *     (the same program) floor CUBIN_PATH request SYMBOL BYTES...: the request of
 *       benchmarks/bench_requests.py in C, blocking, for each body size: the body copied
 *       into pinned memory and on to a new device buffer, a new output buffer, the
 *       kernel SYMBOL (y = 2x + 1 over floats), the result read back through pinned
 *       memory into a new host buffer, both device buffers freed in stream order, one
 *       cuStreamSynchronize; prints {"c_request_us": {"BYTES": us, ...}}
 *   gcc -O2 -shared -fPIC -DFLOOR_EXT -I<python include> floor.c -ldl -o _floor.so
 *       a CPython extension: launch() does one pre-packed cuLaunchKernel per Python
 *       call (the C-extension-call floor).
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef FLOOR_EXT
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#endif

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream;
typedef unsigned long long CUdeviceptr;

static CUresult (*cuInit)(unsigned);
static CUresult (*cuDeviceGet)(CUdevice *, int);
static CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
static CUresult (*cuCtxSetCurrent)(CUcontext);
static CUresult (*cuModuleLoadData)(CUmodule *, const void *);
static CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *);
static CUresult (*cuStreamCreate)(CUstream *, unsigned);
static CUresult (*cuStreamSynchronize)(CUstream);
static CUresult (*cuMemAlloc)(CUdeviceptr *, size_t);
static CUresult (*cuMemHostAlloc)(void **, size_t, unsigned);
static CUresult (*cuMemcpyDtoHAsync)(void *, CUdeviceptr, size_t, CUstream);
static CUresult (*cuMemAllocAsync)(CUdeviceptr *, size_t, CUstream);
static CUresult (*cuMemFreeAsync)(CUdeviceptr, CUstream);
static CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned,
                                  unsigned, unsigned, unsigned, CUstream, void **, void **);
static CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
static CUresult (*cuDeviceGetDefaultMemPool)(void **, CUdevice);
static CUresult (*cuMemPoolSetAttribute)(void *, int, void *);

static const char *floor_error = NULL;
static int floor_code = 0;

/* the _v2 names are the ABI that cuda.h's unversioned names map to */
#define RESOLVE(lib, name)                                       \
    do {                                                         \
        *(void **)(&name) = dlsym(lib, #name "_v2");             \
        if (!name) *(void **)(&name) = dlsym(lib, #name);        \
        if (!name) { floor_error = "dlsym " #name; return -1; }  \
    } while (0)

static int resolve(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) { floor_error = "dlopen libcuda.so.1"; return -1; }
    RESOLVE(lib, cuInit);
    RESOLVE(lib, cuDeviceGet);
    RESOLVE(lib, cuDevicePrimaryCtxRetain);
    RESOLVE(lib, cuCtxSetCurrent);
    RESOLVE(lib, cuModuleLoadData);
    RESOLVE(lib, cuModuleGetFunction);
    RESOLVE(lib, cuStreamCreate);
    RESOLVE(lib, cuStreamSynchronize);
    RESOLVE(lib, cuMemHostAlloc);
    RESOLVE(lib, cuMemcpyDtoHAsync);
    RESOLVE(lib, cuMemAllocAsync);
    RESOLVE(lib, cuMemFreeAsync);
    RESOLVE(lib, cuLaunchKernel);
    RESOLVE(lib, cuMemAlloc);
    RESOLVE(lib, cuMemcpyHtoDAsync);
    RESOLVE(lib, cuDeviceGetDefaultMemPool);
    RESOLVE(lib, cuMemPoolSetAttribute);
    return 0;
}

#define CK(call)                                                        \
    do {                                                                \
        CUresult e_ = (call);                                           \
        if (e_) { floor_error = #call; floor_code = e_; return -1; }    \
    } while (0)

static CUstream stream;
static CUfunction add4, empty;
static CUdeviceptr bufs[3];
static unsigned n_elems = 4096;
static void *add4_params[4];
static unsigned grid;

static CUdevice device;
static CUmodule cubin_module;

/* the driver, the primary context of GPU 0, the cubin loaded and the floor's stream */
static int open_module(const void *cubin) {
    CUcontext ctx;
    if (resolve()) return -1;
    CK(cuInit(0));
    CK(cuDeviceGet(&device, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, device));
    CK(cuCtxSetCurrent(ctx));
    CK(cuModuleLoadData(&cubin_module, cubin));
    CK(cuStreamCreate(&stream, 1 /* CU_STREAM_NON_BLOCKING */));
    return 0;
}

static int setup(const void *cubin) {
    if (open_module(cubin)) return -1;
    CK(cuModuleGetFunction(&add4, cubin_module, "add4"));
    CK(cuModuleGetFunction(&empty, cubin_module, "empty_kernel"));
    for (int i = 0; i < 3; ++i) CK(cuMemAlloc(&bufs[i], 4 * (size_t)n_elems));
    for (int i = 0; i < 3; ++i) add4_params[i] = &bufs[i];
    add4_params[3] = &n_elems;
    grid = (n_elems + 255) / 256;
    return 0;
}

static inline CUresult launch_add4(void) {
    return cuLaunchKernel(add4, grid, 1, 1, 256, 1, 1, 0, stream, add4_params, NULL);
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* best of 3 rounds of `reps` launches, amortized (the Python figures use the same) */
static int launch_floor(CUfunction f, unsigned g, unsigned b, void **params, double *us) {
    const int reps = 20000;
    double best = 1e9;
    for (int round = 0; round < 3; ++round) {
        double t0 = now();
        for (int i = 0; i < reps; ++i)
            CK(cuLaunchKernel(f, g, 1, 1, b, 1, 1, 0, stream, params, NULL));
        CK(cuStreamSynchronize(stream));
        double t = (now() - t0) / reps * 1e6;
        if (t < best) best = t;
    }
    *us = best;
    return 0;
}

#ifdef FLOOR_MAIN
static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *xs, int n) {
    qsort(xs, n, sizeof(double), cmp);
    return xs[n / 2];
}

static double samples[2200];

static int run(void) {
    double add4_us, empty_us, sync_us, read_us, alloc_us, t0;
    void *pinned;
    CK(launch_add4());
    CK(cuStreamSynchronize(stream));
    if (launch_floor(add4, grid, 256, add4_params, &add4_us)) return -1;
    if (launch_floor(empty, 1, 1, NULL, &empty_us)) return -1;
    for (int i = 0; i < 2200; ++i) {
        t0 = now();
        CK(cuLaunchKernel(empty, 1, 1, 1, 1, 1, 1, 0, stream, NULL, NULL));
        CK(cuStreamSynchronize(stream));
        samples[i] = now() - t0;
    }
    sync_us = median(samples + 200, 2000) * 1e6;
    CK(cuMemHostAlloc(&pinned, 1024, 0));
    for (int i = 0; i < 2200; ++i) {
        t0 = now();
        CK(cuMemcpyDtoHAsync(pinned, bufs[0], 1024, stream));
        CK(cuStreamSynchronize(stream));
        samples[i] = now() - t0;
    }
    read_us = median(samples + 200, 2000) * 1e6;
    t0 = now();
    for (int i = 0; i < 20000; ++i) {
        CUdeviceptr p;
        CK(cuMemAllocAsync(&p, 1 << 20, stream));
        CK(cuMemFreeAsync(p, stream));
    }
    alloc_us = (now() - t0) / 20000 * 1e6;
    CK(cuStreamSynchronize(stream));
    printf("{\"c_launch_add4_us\": %.4f, \"c_launch_empty_us\": %.4f, "
           "\"c_launch_sync_us\": %.4f, \"c_read_1KiB_sync_us\": %.4f, "
           "\"c_alloc_free_async_1MiB_us\": %.4f}\n",
           add4_us, empty_us, sync_us, read_us, alloc_us);
    return 0;
}

/* One request (see the header), blocking; the answer in a new host buffer (*out). */
static int one_request(CUfunction f, const void *body, void *pin_in, void *pin_out,
                       size_t nbytes, void **out) {
    CUdeviceptr x, y;
    unsigned n = (unsigned)(nbytes / 4), g = (n + 255) / 256;
    void *params[3] = {&x, &y, &n};
    memcpy(pin_in, body, nbytes);
    CK(cuMemAllocAsync(&x, nbytes, stream));
    CK(cuMemcpyHtoDAsync(x, pin_in, nbytes, stream));
    CK(cuMemAllocAsync(&y, nbytes, stream));
    CK(cuLaunchKernel(f, g, 1, 1, 256, 1, 1, 0, stream, params, NULL));
    CK(cuMemcpyDtoHAsync(pin_out, y, nbytes, stream));
    CK(cuMemFreeAsync(x, stream));
    CK(cuMemFreeAsync(y, stream));
    CK(cuStreamSynchronize(stream));
    *out = malloc(nbytes);
    if (!*out) { floor_error = "malloc"; return -1; }
    memcpy(*out, pin_out, nbytes);
    return 0;
}

/* µs per request for each body size: best of 3 rounds (200 warm-up requests first);
 * the first answer checked against 2x + 1. The default memory pool keeps what is freed
 * (release threshold: all), as the frameworks' caching allocators do. */
static int run_requests(const char *symbol, int count, char **sizes) {
    CUfunction f;
    void *pool;
    unsigned long long keep = ~0ULL;
    CK(cuModuleGetFunction(&f, cubin_module, symbol));
    CK(cuDeviceGetDefaultMemPool(&pool, device));
    CK(cuMemPoolSetAttribute(pool, 4 /* CU_MEMPOOL_ATTR_RELEASE_THRESHOLD */, &keep));
    printf("{\"c_request_us\": {");
    for (int k = 0; k < count; ++k) {
        size_t nbytes = strtoull(sizes[k], NULL, 10);
        int reps = nbytes >= (1u << 20) ? 1000 : 3000;
        float *body = malloc(nbytes);
        void *pin_in, *pin_out, *out;
        double best = 1e9;
        if (!body || nbytes < 4 || nbytes % 4) { floor_error = "body size"; return -1; }
        for (size_t i = 0; i < nbytes / 4; ++i) body[i] = (float)(i % 1000) * 0.25f - 3.0f;
        CK(cuMemHostAlloc(&pin_in, nbytes, 0));
        CK(cuMemHostAlloc(&pin_out, nbytes, 0));
        if (one_request(f, body, pin_in, pin_out, nbytes, &out)) return -1;
        for (size_t i = 0; i < nbytes / 4; ++i) {
            if (((float *)out)[i] != 2.0f * body[i] + 1.0f) {
                floor_error = "wrong answer";
                return -1;
            }
        }
        free(out);
        for (int i = 0; i < 200; ++i) {
            if (one_request(f, body, pin_in, pin_out, nbytes, &out)) return -1;
            free(out);
        }
        for (int round = 0; round < 3; ++round) {
            double t0 = now();
            for (int i = 0; i < reps; ++i) {
                if (one_request(f, body, pin_in, pin_out, nbytes, &out)) return -1;
                free(out);
            }
            double t = (now() - t0) / reps * 1e6;
            if (t < best) best = t;
        }
        printf("%s\"%zu\": %.4f", k ? ", " : "", nbytes, best);
        free(body);
    }
    printf("}}\n");
    return 0;
}

int main(int argc, char **argv) {
    int requests = argc >= 4 && strcmp(argv[2], "request") == 0;
    if (argc != 2 && !requests) {
        fprintf(stderr, "usage: floor CUBIN [request SYMBOL BYTES...]\n");
        return 2;
    }
    FILE *f = fopen(argv[1], "rb");
    if (!f) { perror(argv[1]); return 2; }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *cubin = malloc(size);
    if (!cubin || fread(cubin, 1, size, f) != (size_t)size) { fprintf(stderr, "read\n"); return 2; }
    fclose(f);
    int failed = requests ? open_module(cubin) || run_requests(argv[3], argc - 4, argv + 4)
                          : setup(cubin) || run();
    if (failed) {
        printf("\n{\"error\": \"%s\", \"code\": %d}\n", floor_error, floor_code);
        return 1;
    }
    return 0;
}
#endif

#ifdef FLOOR_EXT
static PyObject *fail(void) {
    return PyErr_Format(PyExc_RuntimeError, "%s failed (CUresult %d)", floor_error, floor_code);
}

static PyObject *py_setup(PyObject *self, PyObject *cubin) {
    Py_buffer view;
    if (PyObject_GetBuffer(cubin, &view, PyBUF_SIMPLE)) return NULL;
    int bad = setup(view.buf);
    PyBuffer_Release(&view);
    if (bad) return fail();
    Py_RETURN_NONE;
}

static PyObject *py_launch(PyObject *self, PyObject *unused) {
    CUresult e = launch_add4();
    if (e) { floor_error = "cuLaunchKernel"; floor_code = e; return fail(); }
    Py_RETURN_NONE;
}

static PyObject *py_sync(PyObject *self, PyObject *unused) {
    CUresult e = cuStreamSynchronize(stream);
    if (e) { floor_error = "cuStreamSynchronize"; floor_code = e; return fail(); }
    Py_RETURN_NONE;
}

/* The C loop's floor inside this process: best of 3 rounds of 20000 launches (µs). */
static PyObject *py_loop(PyObject *self, PyObject *unused) {
    double us;
    if (launch_floor(add4, grid, 256, add4_params, &us)) return fail();
    return PyFloat_FromDouble(us);
}

static PyMethodDef methods[] = {
    {"setup", py_setup, METH_O, "setup(cubin): load add4 from the cubin, allocate buffers"},
    {"loop", py_loop, METH_NOARGS, "the C loop's µs per launch, run in this process"},
    {"launch", py_launch, METH_NOARGS, "one cuLaunchKernel of add4, pre-packed"},
    {"sync", py_sync, METH_NOARGS, "cuStreamSynchronize of the floor's stream"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_floor", NULL, -1, methods};

PyMODINIT_FUNC PyInit__floor(void) { return PyModule_Create(&module); }
#endif
