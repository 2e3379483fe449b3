#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* The value the patch set changes: upstream answers 41. */
#define ANSWER 41

static PyObject *answer(PyObject *self, PyObject *args) {
    return PyLong_FromLong(ANSWER);
}

static PyMethodDef methods[] = {
    {"answer", answer, METH_NOARGS, "The answer, as patched."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", NULL, -1, methods};

PyMODINIT_FUNC PyInit__native(void) {
    return PyModule_Create(&module);
}
