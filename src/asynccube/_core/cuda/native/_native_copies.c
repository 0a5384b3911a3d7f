/* asynccube._core.cuda.native._native: events, copies, pointer and stream queries and host copies (see _native.h). */
#include "_native.h"
#include <sched.h>
#include <stdatomic.h>

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

/* stream_check(stream) -> (ctx_err, context, capture_err, status): what client.wait
 * asks of another library's stream, its context (cuStreamGetCtx) and whether it is
 * capturing a graph (cuStreamIsCapturing), in one call without cuda.bindings' objects.
 * The capture is not asked when the context was not found (capture_err 0, status 0). */
PyObject *stream_check(PyObject *self, PyObject *stream) {
    unsigned long long h;
    if (as_handle(stream, "stream", &h) < 0 || need_driver() < 0) return NULL;
    CUh context = NULL;
    int status = 0;
    CUresult ctx_err = cu.stream_ctx((CUh)(uintptr_t)h, &context);
    CUresult capture_err = ctx_err ? 0 : cu.stream_capturing((CUh)(uintptr_t)h, &status);
    return Py_BuildValue("(iKii)", (int)ctx_err, (unsigned long long)(uintptr_t)context,
                         (int)capture_err, status);
}

/* ctx_set(context) -> CUresult: cuCtxSetCurrent (to_client's switches between two
 * devices' contexts, without cuda.bindings' wrapper) */
PyObject *ctx_set(PyObject *self, PyObject *context) {
    unsigned long long h;
    if (as_handle(context, "context", &h) < 0 || need_driver() < 0) return NULL;
    return PyLong_FromLong(cu.ctx_set((CUh)(uintptr_t)h));
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

/* ---------------------------------------------------------------- the copy helpers */

/* A large host copy of at least POOL_MIN bytes (a 1 MiB request body staged into
 * page-locked memory, say) is cut into PIECE-byte pieces that the calling thread and up to
 * POOL_MAX helper threads take in turn from one atomic counter (no Python, no GIL). The
 * helpers are started once; after a copy each watches for the next for SPIN_S, then
 * sleeps on a condition variable. The caller
 * never waits for one to wake: it copies pieces itself until none is left, then waits
 * only for the pieces a helper has in hand (a few µs at most). So the copy costs its
 * thread at worst what a plain memcpy costs, and about 1/(helpers + 1) of it when the
 * helpers join in. One copy at a time uses the helpers: a caller that finds them busy
 * (another thread's copy) copies alone. */

#define POOL_MIN (256u << 10)
#define PIECE (64u << 10)
#define POOL_MAX 3
#define SPIN_S 500e-6 /* a helper's watch for the next copy before it sleeps */

typedef struct {
    char *dst;
    const char *src;
    size_t n, pieces;
    atomic_size_t next;    /* the next piece to take */
    atomic_size_t done;    /* pieces copied */
    atomic_int helpers;    /* helpers inside this job (joined under cp_lock) */
} CopyJob;

static pthread_mutex_t cp_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t cp_caller = PTHREAD_MUTEX_INITIALIZER; /* one pooled copy at a time */
static pthread_cond_t cp_wake = PTHREAD_COND_INITIALIZER;
static CopyJob *cp_job;       /* the copy open to helpers (NULL: none) */
static atomic_ulong cp_gen;   /* bumped for each copy opened */
static int cp_started;        /* helper threads running */
static int cp_fork_hook;
static atomic_ulong cp_helped; /* pieces copied by helpers, ever (copy_stats) */
static atomic_ulong cp_pooled; /* copies that went through the pool, ever */

static void cp_after_fork_child(void) {
    pthread_mutex_init(&cp_lock, NULL);
    pthread_mutex_init(&cp_caller, NULL);
    pthread_cond_init(&cp_wake, NULL);
    cp_job = NULL;
    cp_started = 0;
}

static inline void cp_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* One round of waiting for a helper: a pause, and past a few thousand of them (a helper
 * preempted mid-piece on a busy machine) a yield of the processor. */
static inline void cp_wait(unsigned spins) {
    if (spins < 4096)
        cp_relax();
    else
        sched_yield();
}

/* Copy pieces of ``job`` until none is left to take; the number copied. */
static size_t cp_run(CopyJob *job) {
    size_t mine = 0;
    for (;;) {
        size_t i = atomic_fetch_add(&job->next, 1);
        if (i >= job->pieces) return mine;
        size_t at = i * PIECE, k = job->n - at < PIECE ? job->n - at : PIECE;
        memcpy(job->dst + at, job->src + at, k);
        atomic_fetch_add(&job->done, 1);
        mine++;
    }
}

static void *cp_main(void *unused) {
    unsigned long seen = 0;
    for (;;) {
        /* A while after a copy, watch for the next one before sleeping: a helper woken
         * from its condition variable joins some 20-50 µs late (a 1 MiB copy takes
         * 30-130 µs); copies of concurrent requests come a few hundred µs apart. */
        double until = now_s() + SPIN_S;
        while (atomic_load(&cp_gen) == seen && now_s() < until) cp_relax();
        pthread_mutex_lock(&cp_lock);
        while (cp_job == NULL || atomic_load(&cp_gen) == seen)
            pthread_cond_wait(&cp_wake, &cp_lock);
        CopyJob *job = cp_job;
        seen = atomic_load(&cp_gen);
        atomic_fetch_add(&job->helpers, 1);
        pthread_mutex_unlock(&cp_lock);
        size_t mine = cp_run(job);
        if (mine) atomic_fetch_add(&cp_helped, mine);
        atomic_fetch_sub(&job->helpers, 1); /* the last touch of the caller's job */
    }
    return NULL;
}

/* Start up to ``want`` helpers (under cp_lock); how many run. */
static int cp_start(int want) {
    if (!cp_fork_hook) cp_fork_hook = pthread_atfork(NULL, NULL, cp_after_fork_child) == 0;
    while (cp_started < want) {
        pthread_t id;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int failed = pthread_create(&id, &attr, cp_main, NULL);
        pthread_attr_destroy(&attr);
        if (failed) break;
        cp_started++;
    }
    return cp_started;
}

/* Copy n bytes with up to ``helpers`` helper threads (the GIL released by the caller). */
static void pooled_copy(char *dst, const char *src, size_t n, int helpers) {
    if (helpers < 1 || pthread_mutex_trylock(&cp_caller) != 0) {
        memcpy(dst, src, n); /* no helpers wanted, or another thread's copy has them */
        return;
    }
    CopyJob job = {.dst = dst, .src = src, .n = n, .pieces = (n + PIECE - 1) / PIECE};
    atomic_init(&job.helpers, 0);
    atomic_init(&job.next, 0);
    atomic_init(&job.done, 0);
    pthread_mutex_lock(&cp_lock);
    int open = cp_start(helpers > POOL_MAX ? POOL_MAX : helpers) > 0;
    if (open) {
        cp_job = &job;
        atomic_fetch_add(&cp_gen, 1);
        pthread_cond_broadcast(&cp_wake);
    }
    pthread_mutex_unlock(&cp_lock);
    cp_run(&job);
    for (unsigned spins = 0; atomic_load(&job.done) < job.pieces; spins++)
        cp_wait(spins); /* the pieces helpers have in hand: a few µs */
    if (open) {
        pthread_mutex_lock(&cp_lock);
        cp_job = NULL; /* no helper joins any more */
        pthread_mutex_unlock(&cp_lock);
        for (unsigned spins = 0; atomic_load(&job.helpers) > 0; spins++) /* leaving */
            cp_wait(spins);
        atomic_fetch_add(&cp_pooled, 1);
    }
    pthread_mutex_unlock(&cp_caller);
}

/* copy_stats() -> (copies through the helpers, pieces the helpers copied): counters
 * since the module loaded (tests and profiles read them). */
PyObject *copy_stats(PyObject *self, PyObject *unused) {
    return Py_BuildValue("(kk)", atomic_load(&cp_pooled), atomic_load(&cp_helped));
}

/* copy_into(dst, src, threads) -> None: copy buffer src into the start of writable
 * buffer dst; the GIL is released from 256 KiB; threads > 1 splits copies of 256 KiB to
 * 16 MiB over the copy helpers (up to threads - 1 of them, 3 at most) and larger ones
 * over threads started for the copy. */
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
    } else if (src.len < (Py_ssize_t)POOL_MIN) {
        memcpy(dst.buf, src.buf, (size_t)src.len);
    } else {
        int t = threads < 1 ? 1 : (threads > MAX_THREADS ? MAX_THREADS : (int)threads);
        Py_BEGIN_ALLOW_THREADS
        if (src.len < (16 << 20))
            pooled_copy(dst.buf, src.buf, (size_t)src.len, t - 1);
        else
            parallel_copy(dst.buf, src.buf, (size_t)src.len, t);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    return out == NULL ? NULL : Py_NewRef(out);
}

/* bytes_at(address, nbytes, threads) -> bytes: a new bytes object holding the nbytes at
 * address (a finished read's page-locked staging, say); from 256 KiB the copy releases
 * the GIL and, with threads > 1, is split over the copy helpers as copy_into's is. */
PyObject *bytes_at(PyObject *self, PyObject *const *a, Py_ssize_t n) {
    unsigned long long addr;
    size_t nbytes;
    unsigned threads;
    if (nargs_ok(n, 3, "bytes_at") < 0 || as_u64(a[0], "address", &addr) < 0 ||
        as_size(a[1], "nbytes", &nbytes) < 0 || as_u32(a[2], "threads", &threads) < 0)
        return NULL;
    if (addr == 0 && nbytes) return bad("address must not be 0");
    if (nbytes > (size_t)PY_SSIZE_T_MAX) return bad("nbytes too large: %zu", nbytes);
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)nbytes);
    if (out == NULL) return NULL;
    char *dst = PyBytes_AS_STRING(out);
    const char *src = (const char *)(uintptr_t)addr;
    if (nbytes < POOL_MIN) {
        memcpy(dst, src, nbytes);
    } else {
        int helpers = threads < 2 ? 0 : (int)(threads > POOL_MAX + 1 ? POOL_MAX : threads - 1);
        Py_BEGIN_ALLOW_THREADS pooled_copy(dst, src, nbytes, helpers);
        Py_END_ALLOW_THREADS
    }
    return out;
}
