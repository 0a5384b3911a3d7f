/* asynccube._core.channel._native_future: awaitable.new_future written in C.
 *
 * Every awaitable a client returns (a read, a sync, ...) is made by new_future(cls,
 * loop, held): a future of class `cls` on `loop`, which remembers the call that made it
 * (the first frame outside asynccube, and the last frame inside) so that a future
 * dropped without being awaited names the user's line. The Python twin (awaitable.py)
 * walks the frames with sys._getframe and a dict: with the Python call itself, about
 * 0.5 us of the ~0.8 us a future costs, on every read and sync, which the tight loop's
 * `await read` pays beside a raw copy of a few us. This walks the same frames through
 * the C API (about 0.3 us, creating the future included, less); the same
 * result, the same cache semantics (a source file is asynccube's when the module
 * running it is named "asynccube.<something>").
 *
 * The future is made by calling `cls(loop=loop)`, so a subclass behaves as it does from
 * Python; `_ac_from` is set as an attribute (a slot of the concrete classes). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>

static PyObject *ours;     /* source file (str) -> True/False: asynccube's or not */
static PyObject *kw_loop;  /* ("loop",) */
static PyObject *s_ac_from, *s_name, *s_a_call, *s_unknown, *s_prefix, *zero;

/* Whether the frame's source file is asynccube's (cached by file name): 1, 0, -1. */
static int is_ours(PyFrameObject *frame, PyObject *filename) {
    PyObject *known = PyDict_GetItemWithError(ours, filename);
    if (known != NULL) return known == Py_True;
    if (PyErr_Occurred()) return -1;
    PyObject *globals = PyFrame_GetGlobals(frame);
    if (globals == NULL) return -1;
    int mine = 0;
    PyObject *name = PyDict_Check(globals) ? PyDict_GetItemWithError(globals, s_name) : NULL;
    if (name != NULL && PyUnicode_Check(name)) {
        Py_ssize_t at = PyUnicode_Tailmatch(name, s_prefix, 0, PY_SSIZE_T_MAX, -1);
        mine = at < 0 ? -1 : (int)at;
    }
    Py_DECREF(globals);
    if (mine < 0 || PyErr_Occurred()) return -1;
    if (PyDict_SetItem(ours, filename, mine ? Py_True : Py_False) < 0) return -1;
    return mine;
}

/* (held, call, file, line) of the call that made the future (see the header). */
static PyObject *origin(PyObject *held) {
    PyFrameObject *frame = PyEval_GetFrame(); /* borrowed: the innermost Python frame */
    Py_XINCREF(frame);
    PyObject *call = Py_NewRef(s_a_call);
    PyObject *result = NULL;
    while (frame != NULL) {
        PyCodeObject *code = PyFrame_GetCode(frame);
        int mine = is_ours(frame, code->co_filename);
        if (mine < 0) {
            Py_DECREF(code);
            goto done;
        }
        if (!mine) { /* no line number (-1): None, as the twin's f_lineno */
            int number = PyFrame_GetLineNumber(frame);
            PyObject *line = number < 0 ? Py_NewRef(Py_None) : PyLong_FromLong(number);
            if (line != NULL) result = PyTuple_Pack(4, held, call, code->co_filename, line);
            Py_XDECREF(line);
            Py_DECREF(code);
            goto done;
        }
        Py_SETREF(call, Py_NewRef(code->co_name));
        Py_DECREF(code);
        Py_SETREF(frame, PyFrame_GetBack(frame));
    }
    result = PyTuple_Pack(4, held, call, s_unknown, zero);
done:
    Py_XDECREF(frame);
    Py_DECREF(call);
    return result;
}

static PyObject *new_future(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "new_future(cls, loop, held) takes 3 arguments, got %zd",
                     nargs);
        return NULL;
    }
    PyObject *fut = PyObject_Vectorcall(args[0], &args[1], 0, kw_loop); /* cls(loop=loop) */
    if (fut == NULL) return NULL;
    PyObject *from = origin(args[2]);
    if (from == NULL || PyObject_SetAttr(fut, s_ac_from, from) < 0) {
        Py_XDECREF(from);
        Py_DECREF(fut);
        return NULL;
    }
    Py_DECREF(from);
    return fut;
}

static PyMethodDef methods[] = {
    {"new_future", (PyCFunction)(void (*)(void))new_future, METH_FASTCALL,
     "new_future(cls, loop, held) -> a client future remembering the call that made it "
     "(awaitable.new_future)"},
    {NULL, NULL, 0, NULL},
};

static int exec_module(PyObject *module) {
    if (ours != NULL) /* imported again (after leaving sys.modules): the same state */
        return PyModule_AddObjectRef(module, "ours", ours);
    ours = PyDict_New();
    kw_loop = Py_BuildValue("(s)", "loop");
    s_ac_from = PyUnicode_InternFromString("_ac_from");
    s_name = PyUnicode_InternFromString("__name__");
    s_a_call = PyUnicode_InternFromString("a call");
    s_unknown = PyUnicode_InternFromString("?");
    s_prefix = PyUnicode_InternFromString("asynccube.");
    zero = PyLong_FromLong(0);
    if (!ours || !kw_loop || !s_ac_from || !s_name || !s_a_call || !s_unknown || !s_prefix ||
        !zero)
        return -1;
    return PyModule_AddObjectRef(module, "ours", ours);
}

static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, exec_module},
#if PY_VERSION_HEX >= 0x030C0000 /* its state is C globals: one interpreter only */
    {Py_mod_multiple_interpreters, Py_MOD_MULTIPLE_INTERPRETERS_NOT_SUPPORTED},
#endif
    {0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "asynccube._core.channel._native_future",
    .m_doc = "awaitable.new_future in C (see _native_future.c)",
    .m_size = 0,
    .m_methods = methods,
    .m_slots = slots,
};

PyMODINIT_FUNC PyInit__native_future(void) { return PyModuleDef_Init(&module_def); }
