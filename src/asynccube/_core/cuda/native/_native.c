/* asynccube._core.cuda.native._native: the CUDA hot path in C (see hotpath.py for the interface,
 * and _twin.py for the pure-Python twin with the same behaviour).
 *
 * Built without any CUDA header or toolkit: the few driver types are declared here and
 * the entry points are resolved from libcuda.so.1 by open_driver() (_native_module.c:
 * dlopen + dlsym), when
 * a GPU client opens. Mechanism only: every function takes plain integers (handles,
 * addresses) or buffers, returns the driver's CUresult as an int, and never decides
 * order, lifetime or errors. Bad arguments raise InvalidArgument (asynccube's, a
 * ValueError): wrong types, out-of-range integers, argument blocks and values of the
 * wrong size. What cannot be checked without the driver's own bookkeeping is trusted,
 * as in cuda.bindings: driver handles and raw host/device addresses must come from the
 * driver (the server passes only its own).
 */
#include "_native.h"

#include <structmember.h>

CuDriver cu;

PyObject *InvalidArgument; /* asynccube._core.errors.InvalidArgument */

PyObject *bad(const char *fmt, ...) {
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
int as_u64(PyObject *o, const char *what, unsigned long long *out) {
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
int as_handle(PyObject *o, const char *what, unsigned long long *out) {
    if (o == Py_None) {
        *out = 0;
        return 0;
    }
    return as_u64(o, what, out);
}

int as_u32(PyObject *o, const char *what, unsigned *out) {
    unsigned long long v;
    if (as_u64(o, what, &v) < 0) return -1;
    if (v > 0xFFFFFFFFull) {
        bad("%s must fit in 32 bits, got %R", what, o);
        return -1;
    }
    *out = (unsigned)v;
    return 0;
}

int as_size(PyObject *o, const char *what, size_t *out) {
    unsigned long long v;
    if (as_u64(o, what, &v) < 0) return -1;
    if (v > (unsigned long long)PY_SSIZE_T_MAX) {
        bad("%s is too large: %R", what, o);
        return -1;
    }
    *out = (size_t)v;
    return 0;
}

int need_driver(void) {
    if (cu.lib == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the CUDA driver is not open (call open_driver())");
        return -1;
    }
    return 0;
}

int nargs_ok(Py_ssize_t n, Py_ssize_t want, const char *name) {
    if (n == want) return 0;
    PyErr_Format(PyExc_TypeError, "%s() takes %zd arguments (%zd given)", name, want, n);
    return -1;
}

/* ---------------------------------------------------------------- attributes by name
 * What FastLaunch's parts share to read and write Python attributes by interned name
 * (get() in _native.h is the inline fast path over slot_cache). */

PyObject *keep(Refs *r, PyObject *o) {
    if (o != NULL) {
        if (r->n == MAX_REFS) {
            Py_DECREF(o);
            PyErr_SetString(PyExc_OverflowError, "too many references");
            return NULL;
        }
        r->ref[r->n++] = o;
    }
    return o;
}

static const char *name_text[N_COUNT] = {
    "state", "guard", "_wakeup", "_queue", "_stop", "_batch_end_scheduled", "id", "binding", "x", "y", "z", "buffers", "tensor_maps", "scalars",
    "metadata", "data", "size", "memory", "queue", "offset_start", "offset_end",
    "buffer_size", "stream", "value", "function", "shape", "checked", "grid_ok", "cursor",
    "enabled", "ty", "num", "length", "context", "_held", "ptr", "used", "pool", "done",
    "_use_persistent", "_alloc_calls", "_next_check", "_limits", "_routes", "popleft", "remove",
    "_periodic_cleanup", "_tainted", "_blocked", "queued", "page", "offset", "_seq",
    "ordered_scalars"};
PyObject *attr_names[N_COUNT];

int fast_init_names(void) {
    for (int i = 0; i < N_COUNT; i++)
        if ((attr_names[i] = PyUnicode_InternFromString(name_text[i])) == NULL) return -1;
    return 0;
}

SlotCache slot_cache[N_COUNT][2];

Py_ssize_t member_offset(PyTypeObject *t, PyObject *name) {
    if (t->tp_getattro != PyObject_GenericGetAttr || t->tp_mro == NULL) return -1;
    PyObject *mro = t->tp_mro;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(mro); i++) {
        PyObject *dict = ((PyTypeObject *)PyTuple_GET_ITEM(mro, i))->tp_dict;
        PyObject *d = dict == NULL ? NULL : PyDict_GetItemWithError(dict, name);
        if (d == NULL) {
            if (PyErr_Occurred()) PyErr_Clear();
            continue;
        }
        if (Py_TYPE(d) != &PyMemberDescr_Type) return -1;
        PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
        return m->type == T_OBJECT_EX && m->offset > 0 ? m->offset : -1;
    }
    return -1;
}

/* The cache entry of `name` for o's type, filled on a miss; NULL for a type without a
 * valid version tag (then plain getattr / setattr). */
static SlotCache *slot_entry(PyObject *o, int name) {
    PyTypeObject *t = Py_TYPE(o);
    SlotCache *c = slot_cache[name], *e;
    if (c[0].type == t && c[0].tag == t->tp_version_tag) return &c[0];
    if (c[1].type == t && c[1].tag == t->tp_version_tag) return &c[1];
    if (!PyType_HasFeature(t, Py_TPFLAGS_VALID_VERSION_TAG) || t->tp_version_tag == 0)
        return NULL;
    e = c[0].type == NULL || c[0].type == t ? &c[0] : &c[1];
    e->type = t; /* borrowed: a type made later at the same address has a new tag */
    e->tag = t->tp_version_tag;
    e->offset = member_offset(t, attr_names[name]);
    return e;
}

PyObject *get_slow(Refs *r, PyObject *o, int name) {
    SlotCache *e = slot_entry(o, name); /* c[0] may hold a type without the slot */
    if (e != NULL && e->offset > 0) {
        PyObject *v = *(PyObject **)((char *)o + e->offset);
        if (v != NULL) return v; /* unset: getattr raises */
    }
    return keep(r, PyObject_GetAttr(o, attr_names[name]));
}

int set_attr(PyObject *o, int name, PyObject *v) {
    PyTypeObject *t = Py_TYPE(o);
    /* a class's own __slots__ member (never read-only), set as its descriptor would */
    if (PyType_HasFeature(t, Py_TPFLAGS_HEAPTYPE) && t->tp_setattro == PyObject_GenericSetAttr) {
        SlotCache *e = slot_entry(o, name);
        if (e != NULL && e->offset > 0) {
            PyObject **slot = (PyObject **)((char *)o + e->offset);
            Py_XSETREF(*slot, Py_NewRef(v));
            return 0;
        }
    }
    return PyObject_SetAttr(o, attr_names[name], v);
}

int as_long(PyObject *o, long *out) {
    if (!PyLong_Check(o)) return -1;
    *out = PyLong_AsLong(o);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}
