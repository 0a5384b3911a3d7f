/* asynccube._core.cuda.native._native: completion pipes closed by a host function or a spinning thread (see _native.h). */
#include "_native.h"

static void close_fd(void *data) { close((int)(intptr_t)data); }

/* notify_close(stream, fd) -> CUresult: the driver's thread closes fd once the stream
 * reaches this point (a plain C host function: no Python, no GIL). */
PyObject *notify_close(PyObject *self, PyObject *const *a, Py_ssize_t n) {
    unsigned long long stream;
    unsigned fd;
    if (nargs_ok(n, 2, "notify_close") < 0 || as_handle(a[0], "stream", &stream) < 0 ||
        as_u32(a[1], "fd", &fd) < 0)
        return NULL;
    if (fd > INT32_MAX) return bad("fd out of range: %u", fd);
    if (need_driver() < 0) return NULL;
    return PyLong_FromLong(cu.host_func((CUh)(uintptr_t)stream, close_fd, (void *)(intptr_t)fd));
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
static int sp_fork_hook;

/* A forked child has no spinning thread (and no usable CUDA context): start afresh. */
static void sp_after_fork_child(void) {
    pthread_mutex_init(&sp_lock, NULL);
    pthread_cond_init(&sp_wake, NULL);
    pthread_cond_init(&sp_idle, NULL);
    sp_incoming = NULL;
    sp_in_flight = 0;
    sp_started = 0;
}

#define CU_EVENT_DISABLE_TIMING 2

/* Finish an item whose event completed (or failed, or timed out into a host function);
 * its context is current on the calling (spinning) thread. */
static void sp_retire(SpinItem *it, int hand_to_driver) {
    if (!hand_to_driver || cu.host_func(it->stream, close_fd, (void *)(intptr_t)it->fd))
        close(it->fd); /* done (or the driver refused: the loop's own poll sees why) */
    cu.event_destroy(it->event);
    free(it);
}

/* A short pause between polling rounds (a few µs at most): the loop thread's own driver
 * calls take the driver's locks that each cuEventQuery takes too. */
static void sp_relax(void) {
    for (int i = 0; i < 32; i++) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#elif defined(__aarch64__)
        __asm__ __volatile__("yield");
#endif
    }
}

static void *sp_main(void *unused) {
    SpinItem *mine = NULL;
    CUh current = NULL; /* the context this thread made current; NULL: none known */
    for (;;) {
        pthread_mutex_lock(&sp_lock);
        if (mine == NULL) current = NULL; /* idle: that context may be destroyed */
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
            finished++;
        }
        if (mine != NULL && !finished) sp_relax();
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
PyObject *notify_spin(PyObject *self, PyObject *const *a, Py_ssize_t n) {
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
    if (!sp_fork_hook) sp_fork_hook = pthread_atfork(NULL, NULL, sp_after_fork_child) == 0;
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
PyObject *notify_drain(PyObject *self, PyObject *timeout) {
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
