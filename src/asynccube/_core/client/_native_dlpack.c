/* asynccube._core.client._native_dlpack: making the DLPack capsules asynccube exports,
 * reading the one a producer hands over and calling its deleter, written in C (dlpack.py's
 * make_capsule and Imported, their twins, do the same through ctypes: a ctypes buffer, a
 * registry entry and a foreign call per export; five or six foreign calls and two
 * struct reads per import).
 *
 * consume(capsule) -> None where capsule is no unconsumed "dltensor_versioned" or
 * "dltensor" capsule; else the tuple (managed, deleter, flags, address, device_type,
 * device_id, code, bits, lanes, shape, strides, versioned): the managed struct's and
 * its deleter's addresses (ints), the flags (0 for a legacy capsule), the first
 * element's address (data + byte_offset), the dtype's fields, the shape (a tuple of
 * ints), the strides in elements (a tuple, or None where the producer gave NULL: the
 * C-contiguous ones), and whether the capsule was versioned. Once everything is read
 * the capsule is renamed "used_dltensor[_versioned]" (consumed: its destructor no
 * longer calls the deleter); the caller owns the managed struct from then on. A
 * negative ndim leaves the capsule unconsumed and raises ValueError.
 *
 * call_deleter(deleter, managed) calls the producer's deleter on its struct, with the
 * GIL released (as ctypes does: a deleter may take locks of its own, and a producer's
 * deleter takes the GIL itself where it needs it). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

typedef struct {
    int32_t device_type;
    int32_t device_id;
} DLDevice;

typedef struct {
    uint8_t code;
    uint8_t bits;
    uint16_t lanes;
} DLDataType;

typedef struct {
    void *data;
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t *shape;
    int64_t *strides;
    uint64_t byte_offset;
} DLTensor;

typedef void (*Deleter)(void *);

typedef struct {
    DLTensor dl_tensor;
    void *manager_ctx;
    Deleter deleter;
} DLManagedTensor;

typedef struct {
    uint32_t major;
    uint32_t minor;
} DLPackVersion;

typedef struct {
    DLPackVersion version;
    void *manager_ctx;
    Deleter deleter;
    uint64_t flags;
    DLTensor dl_tensor;
} DLManagedTensorVersioned;

static const char NAME[] = "dltensor";
static const char NAME_VERSIONED[] = "dltensor_versioned";
static const char USED[] = "used_dltensor";
static const char USED_VERSIONED[] = "used_dltensor_versioned";

static PyObject *ints(const int64_t *values, int32_t count) {
    PyObject *out = PyTuple_New(count);
    if (out == NULL) return NULL;
    for (int32_t i = 0; i < count; i++) {
        PyObject *v = PyLong_FromLongLong(values[i]);
        if (v == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyTuple_SET_ITEM(out, i, v);
    }
    return out;
}

static PyObject *consume(PyObject *self, PyObject *capsule) {
    int versioned;
    if (PyCapsule_IsValid(capsule, NAME_VERSIONED)) {
        versioned = 1;
    } else if (PyCapsule_IsValid(capsule, NAME)) {
        versioned = 0;
    } else {
        Py_RETURN_NONE;
    }
    void *managed = PyCapsule_GetPointer(capsule, versioned ? NAME_VERSIONED : NAME);
    if (managed == NULL) return NULL;
    const DLTensor *t;
    Deleter deleter;
    uint64_t flags = 0;
    if (versioned) {
        const DLManagedTensorVersioned *m = managed;
        if (m->version.major != 1) { /* the spec: refuse a major version not known */
            PyErr_Format(PyExc_ValueError, "DLPack version %u.%u is not supported (1.x is)",
                         (unsigned)m->version.major, (unsigned)m->version.minor);
            return NULL;
        }
        t = &m->dl_tensor;
        deleter = m->deleter;
        flags = m->flags;
    } else {
        const DLManagedTensor *m = managed;
        t = &m->dl_tensor;
        deleter = m->deleter;
    }
    if (t->ndim < 0) {
        PyErr_Format(PyExc_ValueError, "the DLTensor has ndim %d", (int)t->ndim);
        return NULL;
    }
    if (t->ndim > 0 && t->shape == NULL) {
        PyErr_Format(PyExc_ValueError, "the DLTensor has ndim %d and no shape", (int)t->ndim);
        return NULL;
    }
    PyObject *shape = ints(t->ndim ? t->shape : NULL, t->ndim);
    if (shape == NULL) return NULL;
    PyObject *strides;
    if (t->strides != NULL) {
        strides = ints(t->strides, t->ndim);
        if (strides == NULL) {
            Py_DECREF(shape);
            return NULL;
        }
    } else {
        strides = Py_NewRef(Py_None);
    }
    uintptr_t address = (uintptr_t)t->data + (uintptr_t)t->byte_offset;
    PyObject *out = Py_BuildValue(
        "(KKKKiiiiiNNO)", (unsigned long long)(uintptr_t)managed,
        (unsigned long long)(uintptr_t)deleter, (unsigned long long)flags,
        (unsigned long long)address, (int)t->device.device_type, (int)t->device.device_id,
        (int)t->dtype.code, (int)t->dtype.bits, (int)t->dtype.lanes, shape, strides,
        versioned ? Py_True : Py_False);
    if (out == NULL) return NULL; /* shape and strides are released by Py_BuildValue */
    if (PyCapsule_SetName(capsule, versioned ? USED_VERSIONED : USED) < 0) {
        Py_DECREF(out);
        return NULL;
    }
    return out;
}

static PyObject *call_deleter(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "call_deleter(deleter, managed)");
        return NULL;
    }
    void *deleter = PyLong_AsVoidPtr(args[0]);
    if (deleter == NULL && PyErr_Occurred()) return NULL;
    void *managed = PyLong_AsVoidPtr(args[1]);
    if (managed == NULL && PyErr_Occurred()) return NULL;
    if (deleter != NULL && managed != NULL) {
        Py_BEGIN_ALLOW_THREADS
        ((Deleter)deleter)(managed);
        Py_END_ALLOW_THREADS
    }
    Py_RETURN_NONE;
}

/* make(address, device_type, device_id, shape, strides, code, bits, owner, versioned):
 * a "dltensor[_versioned]" capsule over address (shape and strides: sequences of ints,
 * strides in elements), its managed struct, shape and strides in one malloc'd block,
 * holding a reference to owner until the consumer calls the deleter, or until the
 * capsule is destroyed unconsumed (its destructor calls the deleter then). The deleter
 * may run on any thread: it takes the GIL to drop the reference (at interpreter
 * shutdown it leaks the block instead: nothing may run Python then). live() says how
 * many such exports are still held. */
static Py_ssize_t live_exports;

typedef struct {
    DLManagedTensor managed;
    int64_t dims[];
} Plain;

typedef struct {
    DLManagedTensorVersioned managed;
    int64_t dims[];
} Versioned;

static int finalizing(void) {
#if PY_VERSION_HEX >= 0x030D0000
    return Py_IsFinalizing();
#else
    return _Py_IsFinalizing();
#endif
}

static void release(void *owner, void *block) {
    if (finalizing()) return;
    PyGILState_STATE gil = PyGILState_Ensure();
    Py_XDECREF((PyObject *)owner);
    live_exports--;
    PyMem_RawFree(block);
    PyGILState_Release(gil);
}

static void plain_deleter(void *self) { release(((Plain *)self)->managed.manager_ctx, self); }

static void versioned_deleter(void *self) {
    release(((Versioned *)self)->managed.manager_ctx, self);
}

static void plain_destructor(PyObject *capsule) {
    if (PyCapsule_IsValid(capsule, NAME)) plain_deleter(PyCapsule_GetPointer(capsule, NAME));
}

static void versioned_destructor(PyObject *capsule) {
    if (PyCapsule_IsValid(capsule, NAME_VERSIONED))
        versioned_deleter(PyCapsule_GetPointer(capsule, NAME_VERSIONED));
}

static int fill(int64_t *out, PyObject *values, Py_ssize_t ndim, const char *what) {
    PyObject *fast = PySequence_Fast(values, what);
    if (fast == NULL) return -1;
    if (PySequence_Fast_GET_SIZE(fast) != ndim) {
        Py_DECREF(fast);
        PyErr_Format(PyExc_ValueError, "%s: %zd values for %zd dimensions", what,
                     PySequence_Fast_GET_SIZE(fast), ndim);
        return -1;
    }
    PyObject **items = PySequence_Fast_ITEMS(fast);
    for (Py_ssize_t i = 0; i < ndim; i++) {
        long long v = PyLong_AsLongLong(items[i]);
        if (v == -1 && PyErr_Occurred()) {
            Py_DECREF(fast);
            return -1;
        }
        out[i] = v;
    }
    Py_DECREF(fast);
    return 0;
}

static PyObject *make(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError,
                        "make(address, device_type, device_id, shape, strides, code, bits, "
                        "owner, versioned)");
        return NULL;
    }
    void *address = PyLong_AsVoidPtr(args[0]);
    if (address == NULL && PyErr_Occurred()) return NULL;
    long kind = PyLong_AsLong(args[1]), index = PyLong_AsLong(args[2]);
    long code = PyLong_AsLong(args[5]), bits = PyLong_AsLong(args[6]);
    if (PyErr_Occurred()) return NULL;
    int versioned = PyObject_IsTrue(args[8]);
    if (versioned < 0) return NULL;
    Py_ssize_t ndim = PyObject_Length(args[3]);
    if (ndim < 0) return NULL;
    size_t head = versioned ? sizeof(Versioned) : sizeof(Plain);
    char *block = PyMem_RawMalloc(head + 16 * (size_t)ndim + 1);
    if (block == NULL) return PyErr_NoMemory();
    int64_t *dims = (int64_t *)(block + head), *steps = dims + ndim;
    if (fill(dims, args[3], ndim, "shape") < 0 || fill(steps, args[4], ndim, "strides") < 0) {
        PyMem_RawFree(block);
        return NULL;
    }
    DLTensor *t;
    if (versioned) {
        Versioned *v = (Versioned *)block;
        v->managed.version.major = 1;
        v->managed.version.minor = 1;
        v->managed.manager_ctx = Py_NewRef(args[7]);
        v->managed.deleter = versioned_deleter;
        v->managed.flags = 0;
        t = &v->managed.dl_tensor;
    } else {
        Plain *p = (Plain *)block;
        p->managed.manager_ctx = Py_NewRef(args[7]);
        p->managed.deleter = plain_deleter;
        t = &p->managed.dl_tensor;
    }
    t->data = address;
    t->device.device_type = (int32_t)kind;
    t->device.device_id = (int32_t)index;
    t->ndim = (int32_t)ndim;
    t->dtype.code = (uint8_t)code;
    t->dtype.bits = (uint8_t)bits;
    t->dtype.lanes = 1;
    t->shape = dims;
    t->strides = steps;
    t->byte_offset = 0;
    live_exports++;
    PyObject *capsule = PyCapsule_New(block, versioned ? NAME_VERSIONED : NAME,
                                      versioned ? versioned_destructor : plain_destructor);
    if (capsule == NULL) {
        live_exports--;
        Py_DECREF(args[7]);
        PyMem_RawFree(block);
    }
    return capsule;
}

static PyObject *live(PyObject *self, PyObject *unused) { return PyLong_FromSsize_t(live_exports); }

static PyMethodDef methods[] = {
    {"make", (PyCFunction)(void (*)(void))make, METH_FASTCALL,
     "A DLPack capsule over an address, keeping owner alive (see the module)."},
    {"live", live, METH_NOARGS, "How many exports made by make() are still held."},
    {"consume", consume, METH_O, "Read and consume a DLPack capsule (see the module)."},
    {"call_deleter", (PyCFunction)(void (*)(void))call_deleter, METH_FASTCALL,
     "Call a producer's deleter on its managed struct, the GIL released."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_native_dlpack", "asynccube's DLPack capsule reader, compiled.",
    -1, methods,
};

PyMODINIT_FUNC PyInit__native_dlpack(void) { return PyModule_Create(&module); }
