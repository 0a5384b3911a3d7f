/* asynccube._core.cuda.native._native: the one header of its parts (_native_module.c: the
 * module and driver loading; _native.c: argument checks; _native_launch.c: argument blocks
 * and launches;
 * _native_copies.c: events, copies, pointers; _native_notify.c: completion pipes;
 * _native_fast.c, _native_plan.c, _native_read.c, _native_alloc.c, _native_write.c:
 * FastLaunch).
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
    CUresult (*stream_ctx)(CUh, CUh *);          /* cuStreamGetCtx */
    CUresult (*stream_capturing)(CUh, int *);    /* cuStreamIsCapturing */
    CUresult (*peer)(CUdeviceptr, CUh, CUdeviceptr, CUh, size_t, CUh); /* may be NULL */
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

/* The module's functions, one part each (see the method table in _native_module.c). */
PyObject *launch(PyObject *self, PyObject *const *a, Py_ssize_t n);          /* _native_launch.c */
PyObject *event_record(PyObject *self, PyObject *const *a, Py_ssize_t n);    /* _native_copies.c */
PyObject *stream_wait_event(PyObject *self, PyObject *const *a, Py_ssize_t n);
PyObject *event_query(PyObject *self, PyObject *event);
PyObject *stream_query(PyObject *self, PyObject *stream);
PyObject *stream_check(PyObject *self, PyObject *stream);
PyObject *ctx_set(PyObject *self, PyObject *context);
PyObject *memcpy_async(PyObject *self, PyObject *const *a, Py_ssize_t n);
PyObject *memcpy_peer(PyObject *self, PyObject *const *a, Py_ssize_t n);
PyObject *param_sizes(PyObject *self, PyObject *function);
PyObject *is_pinned(PyObject *self, PyObject *address);
PyObject *address(PyObject *self, PyObject *data);
PyObject *copy_into(PyObject *self, PyObject *const *a, Py_ssize_t n);
PyObject *copy_stats(PyObject *self, PyObject *unused);
PyObject *bytes_at(PyObject *self, PyObject *const *a, Py_ssize_t n);
PyObject *notify_close(PyObject *self, PyObject *const *a, Py_ssize_t n);    /* _native_notify.c */
PyObject *notify_spin(PyObject *self, PyObject *const *a, Py_ssize_t n);
PyObject *notify_drain(PyObject *self, PyObject *timeout);
extern PyTypeObject FastLaunchType;                                          /* _native_fast.c */
int fast_init_names(void);                                                   /* _native.c */

/* ---------------------------------------------------------------- FastLaunch
 * What FastLaunch's parts share (_native_fast.c: the
 * type, the bookkeeping and the launch; _native_plan.c: finding what a launch needs;
 * _native_read.c: small reads; _native_alloc.c: pool hits). */

#define MAX_BUFFERS 32
#define MAX_SCALAR_GROUPS 4 /* a launch with more scalar dtypes takes the Python route */
#define PK_KEY (3 + 2 * MAX_SCALAR_GROUPS)
#define MAX_REFS (8 * MAX_BUFFERS + 32)

enum {
    N_STATE, N_GUARD, N_WAKEUP, N_QUEUE, N_STOP, N_SCHEDULED, N_ID, N_BINDING,
    N_X, N_Y, N_Z, N_BUFFERS, N_TMAPS, N_SCALARS, N_METADATA, N_DATA, N_SIZE, N_MEMORY,
    N_RQUEUE, N_OSTART, N_OEND, N_BSIZE, N_STREAM, N_VALUE, N_FUNCTION, N_SHAPE, N_CHECKED,
    N_GRID_OK, N_CURSOR, N_ENABLED, N_TY, N_NUM, N_LENGTH, N_CONTEXT, N_HELD, N_PTR, N_USED,
    N_POOL, N_DONE, N_USE_PERSISTENT, N_ALLOC_CALLS, N_NEXT_CHECK, N_LIMITS, N_ROUTES,
    N_POPLEFT, N_REMOVE, N_PERIODIC, N_TAINTED, N_BLOCKED, N_QUEUED, N_PAGE, N_OFFSET, N_SEQ,
    N_ORDERED, N_COUNT
};
extern PyObject *attr_names[N_COUNT]; /* interned attribute names, by N_* */

#define N_OBJ 30
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    union {
        PyObject *obj[N_OBJ];
        struct {
            PyObject *channel, *loop, *open_state, *get_loop, *on_loop, *task_fn, *task_arg;
            PyObject *pinned, *owned, *kernel_t, *count_t, *bindings_t, *mode_t, *checked;
            PyObject *kernels, *addresses, *table, *packs, *last_use, *slots, *recorder;
            PyObject *hold, *error_from, *end_batch, *call_soon, *wake, *tls, *context;
            PyObject *current_sid, *get_index;
        };
    };
    long max_streams;
    PyObject *fn_obj, *st_obj; /* handle caches: the last object and its value */
    PyObject *pk_pack;         /* the pack of the last signature (n, metadata size, scalar
                                * groups, then each group's dtype num and length in ABI
                                * order): ArgPacker's packs are never replaced */
    long pk_key[PK_KEY];
    PyObject *sh_obj, *go_obj; /* the last kernel shape and grid_ok tuples, parsed */
    PyObject *ms_obj;          /* the last metadata array and its size (an array held
                                * here cannot be resized in place) */
    Py_ssize_t ms_val;
    PyObject *ty_obj, *ty_num; /* the last scalar dtype and its num */
    long ty_val;
    /* read(): set by set_read() (NULL until then) */
    PyObject *handle_t, *binding_t, *small_reads, *later, *fail, *create_future;
    long small_max;
    /* read()'s deferral: set by set_defer() (mode 0 until then: every read spins). A read
     * issued while other tasks are ready is not spun on: its entry waits in `deferred`
     * (a list) for sweep(), one loop callback an iteration (`sweep_cb`, the bound method)
     * while entries wait. mode 1: `ready` is asyncio's ready deque; mode 2 (another
     * loop): defer while reads wait or the last sweep settled several (`crowd`), and
     * one read in PROBE_EVERY anyway. `pending_set`: the channel's pending futures;
     * `read_miss`: the server's read_spare, asked when every spare of a size is out. */
    PyObject *deferred, *ready, *pending_set, *sweep_cb, *read_miss;
    int defer_mode, sweep_scheduled;
    long crowd, since_defer;
    long since_spin;
    double spin_avg, defer_above; /* the recent spins' average; defer from this */
    unsigned long long d_hits, d_later;
    /* set_pointers(): the server's _ptr, asked for an address not cached yet (NULL until
     * then: such a buffer is left to the route) */
    PyObject *ptr_miss;
    /* empty(): set by set_alloc() (NULL until then); the slot offsets of Handle's
     * (memory, offset_start, offset_end, stream, cursor, buffer_size) and of the slice
     * token's (id, queue): fixed for a type's lifetime */
    PyObject *token_t, *ids, *slices, *failed, *released, *created_at, *manager, *mslices;
    PyObject *pending;
    long max_alloc;
    /* set_footprint(): the channel's Footprint and its two dicts (stream id -> count,
     * memory id -> count of the tracked commands queued), NULL until then
     * (channel/footprint.py) */
    PyObject *fp, *fp_streams, *fp_buffers;
    /* empty(): the address entries of dropped slices sent back to the manager (slice id
     * -> (entry, slice, page, offset)), carried to a new handle that takes one of them
     * from the manager's pending ones while it is still that range (NULL until then) */
    PyObject *carried;
    /* write(): set by set_write() (NULL until then): the server's spare staging buffers
     * (size -> [(buffer, stamp of its last copy)]), the largest size taken, and the
     * server's callable that gives a new spare of a size (or None: the route stages) */
    PyObject *small_writes, *write_miss;
    long write_max;
    unsigned long long w_hits, w_declined;
    unsigned long long x_hits, x_declined; /* export() */
    Py_ssize_t h_off[6], t_off[2];
    unsigned sh_val[4], go_val[3];
    unsigned long long fn_val, st_val;
    unsigned long long hits, declined, q_hits, q_declined;
} FastLaunch;
/* Owned references taken during one call, released together. */
typedef struct {
    PyObject *ref[MAX_REFS];
    int n;
} Refs;
/* Everything one launch needs, found before any state changes. */
typedef struct {
    PyObject *sid, *kernel_id, *wrapper, *meta, *function, *stream;
    PyObject *scalar_data[MAX_SCALAR_GROUPS]; /* each group's bytes, in ABI order */
    int n_groups;
    PackState *pack;
    Py_ssize_t n, meta_size;
    unsigned grid[3], shape[4];
    int scheduled;
    int ahead; /* channel_ready: commands are queued, all tracked (clear_of checks them) */
    PyObject *stamp; /* commit(): (sid, the new cursor), owned by the call's Refs */
    long nbytes; /* plan_read: the bytes the binding covers */
    PyObject *mids[MAX_BUFFERS]; /* the arrays last: filled up to n, not cleared */
    unsigned long long ptrs[MAX_BUFFERS];
} Plan;
PyObject *keep(Refs *r, PyObject *o);

/* Where an attribute lives, per type: the offset of a __slots__ member (read directly,
 * as getattr would find it: a member descriptor is a data descriptor, found before any
 * instance dict), or -1 (plain getattr). Two types per name; an entry holds while the
 * type's version tag does (any change to the type or its bases resets the tag). */
typedef struct {
    PyTypeObject *type;
    unsigned int tag;
    Py_ssize_t offset;
} SlotCache;
extern SlotCache slot_cache[N_COUNT][2];
PyObject *get_slow(Refs *r, PyObject *o, int name);
/* o.<name> = v: straight into a class's __slots__ member (found as get() finds it), else
 * setattr. */
int set_attr(PyObject *o, int name, PyObject *v);

/* o.<name>, or NULL (an error set). The reference is borrowed from `o` (a slot), or
 * owned by `r` (a getattr): valid for the call, while no Python code changes `o`. */
static inline PyObject *get(Refs *r, PyObject *o, int name) {
    SlotCache *c = &slot_cache[name][0];
    PyTypeObject *t = Py_TYPE(o);
    if (c->type == t && c->tag == t->tp_version_tag && c->offset > 0) {
        PyObject *v = *(PyObject **)((char *)o + c->offset);
        if (v != NULL) return v;
    }
    return get_slow(r, o, name);
}
int as_long(PyObject *o, long *out);

/* Everything the launch of a[0..3] (kernel, count, bindings, mode) needs, or 0 (an
 * error may be set) when the Python route must take it; nothing is changed. */
int plan(FastLaunch *f, Refs *r, Plan *p, PyObject *const *a);
int plan_queued(FastLaunch *f, Refs *r, Plan *p, PyObject *const *a);

/* The same for a read of `item` (a Handle or Binding): channel, no held error, stream,
 * address, size (p->nbytes), stream slot; 0 when the Python route must take it. */
int plan_read(FastLaunch *f, Refs *r, Plan *p, PyObject *item);
/* The same for an export of `item` (DLPack), of any size. */
int plan_export(FastLaunch *f, Refs *r, Plan *p, PyObject *item);

/* The same for a write of `data` (bytes of exactly the binding's length, at most
 * f->write_max) into `item`: channel, no tainted buffer, stream, address, stream slot;
 * 0 when the Python route must take it. */
int plan_write(FastLaunch *f, Refs *r, Plan *p, PyObject *item, PyObject *data);

/* Parts of plan() that empty() shares: the channel ready, the caller's stream, and the
 * wrapper of stream slot `own` (created on first use); each 0 when the route must act. */
int channel_ready(FastLaunch *f, Refs *r, Plan *p);
/* When commands are queued (p->ahead): none is on the stream p->sid nor binds one of
 * the n memory ids; 1 when clear, 0 when the route must act. */
int clear_of(FastLaunch *f, Refs *r, Plan *p, PyObject *const *mids, Py_ssize_t n);
int stream_of(FastLaunch *f, Refs *r, Plan *p);
int wrapper_of(FastLaunch *f, Refs *r, Plan *p, long own);
Py_ssize_t member_offset(PyTypeObject *t, PyObject *name);

/* _native_fast.c: the bookkeeping of a planned command and the end of an inline run. */
int commit(FastLaunch *f, Refs *r, Plan *p);
int after(FastLaunch *f, Refs *r, Plan *p);
int declined_quietly(void);
int hold_raised(FastLaunch *f, Plan *p);
int cached_handle(PyObject **obj, unsigned long long *val, PyObject *o);

/* _native_read.c */
PyObject *fast_read(PyObject *self, PyObject *item);
PyObject *fast_set_read(PyObject *self, PyObject *args);
PyObject *fast_set_defer(PyObject *self, PyObject *args);
PyObject *fast_sweep(PyObject *self, PyObject *unused);
PyObject *fast_flush_reads(PyObject *self, PyObject *unused);
PyObject *fast_defer_stats(PyObject *self, void *unused);

/* _native_alloc.c */
PyObject *fast_empty(PyObject *self, PyObject *size);
PyObject *fast_set_alloc(PyObject *self, PyObject *args);

/* _native_write.c */
PyObject *fast_write(PyObject *self, PyObject *const *a, Py_ssize_t n);
PyObject *fast_set_write(PyObject *self, PyObject *args);
PyObject *fast_write_stats(PyObject *self, void *unused);
PyObject *fast_export(PyObject *self, PyObject *const *a, Py_ssize_t n);
PyObject *fast_export_stats(PyObject *self, void *unused);

#endif
