/* asynccube._core.values._native_slices: the slice token (slices.SliceHandle) written in C.
 *
 * It behaves as the Python class in slices.py, its twin: SliceHandle(slice_id, queue)
 * keeps `id` and `queue` (read-only), takes weak references, and when its last
 * reference is gone appends `id` to `queue._queue` (a deque: atomic under the GIL, on
 * whatever thread dropped it). The Python class does that in `__del__`, a Python call on
 * every drop of every handle; here it is part of the deallocation. An error there (a
 * queue without `_queue`, say) is reported as the Python finalizer's would be
 * (sys.unraisablehook) and the exception in flight, if any, is kept.
 *
 * The token holds no reference that can lead back to it (an int and the owner's release
 * queue, which holds ints), so it is not tracked by the cyclic garbage collector. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

typedef struct {
    PyObject_HEAD
    PyObject *id;
    PyObject *queue;
    PyObject *weakrefs;
} Token;

static PyObject *s_queue; /* "_queue" */
static PyObject *s_append;

static PyObject *made(PyTypeObject *type, PyObject *id, PyObject *queue) {
    Token *t = (Token *)type->tp_alloc(type, 0);
    if (t == NULL) return NULL;
    t->id = Py_NewRef(id);
    t->queue = Py_NewRef(queue);
    return (PyObject *)t;
}

static PyObject *token_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    static char *names[] = {"slice_id", "queue", NULL};
    PyObject *id, *queue;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO:SliceHandle", names, &id, &queue))
        return NULL;
    return made(type, id, queue);
}

/* SliceHandle(id, queue) without a tuple: the Python route mints one per buffer. Any
 * other call (keywords, a wrong count) goes the general way, for its error messages. */
static PyObject *token_vectorcall(PyObject *type, PyObject *const *args, size_t nargsf,
                                  PyObject *kwnames) {
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    if (kwnames == NULL && n == 2) return made((PyTypeObject *)type, args[0], args[1]);
    PyObject *tuple = PyTuple_New(n), *kw = NULL, *result = NULL;
    if (tuple == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) PyTuple_SET_ITEM(tuple, i, Py_NewRef(args[i]));
    if (kwnames != NULL && (kw = PyDict_New()) != NULL) {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(kwnames); i++)
            if (PyDict_SetItem(kw, PyTuple_GET_ITEM(kwnames, i), args[n + i]) < 0) {
                Py_CLEAR(kw);
                break;
            }
    }
    if (kwnames == NULL || kw != NULL) result = token_new((PyTypeObject *)type, tuple, kw);
    Py_DECREF(tuple);
    Py_XDECREF(kw);
    return result;
}

/* queue._queue.append(id), the exception in flight kept, an error of its own reported. */
static void release(Token *t) {
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *saved = PyErr_GetRaisedException();
#else
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
#endif
    PyObject *q = PyObject_GetAttr(t->queue, s_queue);
    PyObject *done = q == NULL ? NULL : PyObject_CallMethodOneArg(q, s_append, t->id);
    if (done == NULL) PyErr_WriteUnraisable((PyObject *)Py_TYPE(t));
    Py_XDECREF(done);
    Py_XDECREF(q);
#if PY_VERSION_HEX >= 0x030C0000
    PyErr_SetRaisedException(saved);
#else
    PyErr_Restore(type, value, tb);
#endif
}

static void token_dealloc(Token *t) {
    if (t->weakrefs != NULL) PyObject_ClearWeakRefs((PyObject *)t);
    if (t->id != NULL && t->queue != NULL) release(t);
    Py_CLEAR(t->id);
    Py_CLEAR(t->queue);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

static PyObject *token_repr(Token *t) {
    PyObject *owner = PyObject_GetAttrString(t->queue, "owner_id"), *r;
    if (owner == NULL) return NULL;
    r = PyUnicode_FromFormat("SliceHandle(id=%R, owner=%R)", t->id, owner);
    Py_DECREF(owner);
    return r;
}

static PyObject *token_refcount(PyObject *self, PyObject *unused) {
    return PyLong_FromSsize_t(Py_REFCNT(self));
}

static PyMemberDef token_members[] = {
    {"id", T_OBJECT_EX, offsetof(Token, id), READONLY, "The slice's id."},
    {"queue", T_OBJECT_EX, offsetof(Token, queue), READONLY,
     "The owner's release queue (slices.ReleaseQueue)."},
    {NULL, 0, 0, 0, NULL},
};

static PyMethodDef token_methods[] = {
    {"refcount", token_refcount, METH_NOARGS,
     "The references to this token (see Handle.can_mut for its use)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject TokenType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "asynccube._core.values._native_slices.SliceHandle",
    .tp_basicsize = sizeof(Token),
    .tp_dealloc = (destructor)token_dealloc,
    .tp_repr = (reprfunc)token_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "SliceHandle(slice_id, queue): shared token for one slice; its last "
              "reference gone, the slice id goes to queue._queue.",
    .tp_weaklistoffset = offsetof(Token, weakrefs),
    .tp_methods = token_methods,
    .tp_members = token_members,
    .tp_new = token_new,
    .tp_vectorcall = token_vectorcall,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_native_slices", "asynccube's slice token, compiled.", -1, NULL,
};

PyMODINIT_FUNC PyInit__native_slices(void) {
    s_queue = PyUnicode_InternFromString("_queue");
    s_append = PyUnicode_InternFromString("append");
    if (s_queue == NULL || s_append == NULL || PyType_Ready(&TokenType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&TokenType);
    if (PyModule_AddObject(m, "SliceHandle", (PyObject *)&TokenType) < 0) {
        Py_DECREF(&TokenType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
