/* The store replay's first pass in C (optional; afterword/store/replay.py's msgspec loop is
 * the reference and is used when this module is absent or declines a log).
 *
 * first_pass(runs, first_lsn, last) reads every transaction of the log in order: `runs` is
 * a list of (buffer, spans) pairs (LogFrames.by_run: a segment image and the int64 payload
 * spans start, end, ... in it). It understands exactly one encoding, the one afterword
 * writes: a msgpack TxBody [[op, ...]] whose every op is [key str, value bin|nil, blobs
 * [str, ...], prior uint]. For each op it does what the Python loop does: it records in the
 * dict `last` the key's lsn (negative for a delete) and, when the op's prior is not the put
 * just before it on the key (a key's first op, a mismatch, a key named twice in one
 * transaction), it appends key, owed lsn or 0, prior or 0 (flat) to the list it returns,
 * for the caller to hash. Anything else (another shape, a bad length, invalid UTF-8, trailing bytes,
 * a prior >= 2**63) returns None before any judgement: the caller then runs the msgspec loop
 * over the whole log, which accepts or refuses it exactly as before.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

typedef struct {
    const unsigned char *p, *end;
} Reader;

static int need(Reader *r, Py_ssize_t n) { return r->end - r->p >= n; }

static uint64_t be(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++) {
        v = (v << 8) | p[i];
    }
    return v;
}

/* Each reader returns 0 when the bytes are not of the expected kind (decline). */
static int read_array(Reader *r, Py_ssize_t *n)
{
    if (!need(r, 1)) return 0;
    unsigned char b = *r->p;
    int w = b == 0xdc ? 2 : b == 0xdd ? 4 : 0;
    if (b >= 0x90 && b <= 0x9f) {
        *n = b & 0x0f;
        r->p += 1;
        return 1;
    }
    if (!w || !need(r, 1 + w)) return 0;
    *n = (Py_ssize_t)be(r->p + 1, w);
    r->p += 1 + w;
    return 1;
}

static int read_raw(Reader *r, int str, const unsigned char **s, Py_ssize_t *n)
{
    if (!need(r, 1)) return 0;
    unsigned char b = *r->p;
    int w;
    if (str && b >= 0xa0 && b <= 0xbf) {
        *n = b & 0x1f;
        w = 0;
    } else if (b == (str ? 0xd9 : 0xc4)) {
        w = 1;
    } else if (b == (str ? 0xda : 0xc5)) {
        w = 2;
    } else if (b == (str ? 0xdb : 0xc6)) {
        w = 4;
    } else {
        return 0;
    }
    if (!need(r, 1 + w)) return 0;
    if (w) *n = (Py_ssize_t)be(r->p + 1, w);
    r->p += 1 + w;
    if (!need(r, *n)) return 0;
    *s = r->p;
    r->p += *n;
    return 1;
}

static int read_uint(Reader *r, uint64_t *v)
{
    if (!need(r, 1)) return 0;
    unsigned char b = *r->p;
    int w = b == 0xcc ? 1 : b == 0xcd ? 2 : b == 0xce ? 4 : b == 0xcf ? 8 : 0;
    if (b <= 0x7f) {
        *v = b;
        r->p += 1;
        return 1;
    }
    if (!w || !need(r, 1 + w)) return 0;
    *v = be(r->p + 1, w);
    r->p += 1 + w;
    return *v < ((uint64_t)1 << 63);
}

/* Valid UTF-8 as Python (and msgspec) sees it: decoding it must succeed. */
static int valid_str(const unsigned char *s, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    while (i < n && s[i] < 0x80) i++;
    if (i == n) return 1;
    PyObject *u = PyUnicode_DecodeUTF8((const char *)s, n, NULL);
    if (u == NULL) {
        PyErr_Clear();
        return 0;
    }
    Py_DECREF(u);
    return 1;
}

/* One op; -1 on a Python error, 0 to decline, 1 done. */
static int one_op(Reader *r, long long lsn, PyObject *last, PyObject *out)
{
    Py_ssize_t fields, nblobs, klen, vlen, blen;
    const unsigned char *k, *v, *bs;
    uint64_t prior;
    if (!read_array(r, &fields) || fields != 4 || !read_raw(r, 1, &k, &klen)) return 0;
    int put = 1;
    if (need(r, 1) && *r->p == 0xc0) {
        put = 0;
        r->p += 1;
    } else if (!read_raw(r, 0, &v, &vlen)) {
        return 0;
    }
    if (!read_array(r, &nblobs)) return 0;
    for (Py_ssize_t i = 0; i < nblobs; i++) {
        if (!read_raw(r, 1, &bs, &blen) || !valid_str(bs, blen)) return 0;
    }
    if (!read_uint(r, &prior)) return 0;
    PyObject *key = PyUnicode_DecodeUTF8((const char *)k, klen, NULL);
    if (key == NULL) {
        PyErr_Clear();
        return 0;
    }
    PyObject *prev_obj = PyDict_GetItemWithError(last, key); /* borrowed */
    long long prev = 0;
    int has_prev = prev_obj != NULL;
    if (has_prev) {
        prev = PyLong_AsLongLong(prev_obj);
        if (prev == -1 && PyErr_Occurred()) goto error;
    } else if (PyErr_Occurred()) {
        goto error;
    }
    PyObject *signed_lsn = PyLong_FromLongLong(put ? lsn : -lsn);
    if (signed_lsn == NULL || PyDict_SetItem(last, key, signed_lsn) < 0) {
        Py_XDECREF(signed_lsn);
        goto error;
    }
    Py_DECREF(signed_lsn);
    long long p = (long long)prior;
    if (!(has_prev && prev > 0 && p == prev && prev != lsn)) {
        /* Not the sound case: owed hash of the previous put unless the prior cancels it,
         * and the prior's hash to subtract. */
        long long add = 0;
        if (has_prev && prev > 0) {
            if (p == prev) p = 0;
            else add = prev;
        }
        if (add || p) {
            /* Flat (key, add, prior, key, ...): no tuple for the collector to track. */
            PyObject *a = PyLong_FromLongLong(add), *b = PyLong_FromLongLong(p);
            int failed = a == NULL || b == NULL || PyList_Append(out, key) < 0 || PyList_Append(out, a) < 0 ||
                         PyList_Append(out, b) < 0;
            Py_XDECREF(a);
            Py_XDECREF(b);
            if (failed) goto error;
        }
    }
    Py_DECREF(key);
    return 1;
error:
    Py_DECREF(key);
    return -1;
}

static PyObject *first_pass(PyObject *self, PyObject *args)
{
    PyObject *runs, *last;
    long long lsn;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!LO!:first_pass", &PyList_Type, &runs, &lsn, &PyDict_Type, &last)) {
        return NULL;
    }
    PyObject *out = PyList_New(0);
    if (out == NULL) return NULL;
    lsn -= 1;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(runs); i++) {
        PyObject *pair = PyList_GET_ITEM(runs, i);
        Py_buffer data, spans;
        if (!PyArg_ParseTuple(pair, "y*y*:first_pass run", &data, &spans)) {
            Py_DECREF(out);
            return NULL;
        }
        const int64_t *sp = (const int64_t *)spans.buf;
        Py_ssize_t n = spans.len / (Py_ssize_t)(2 * sizeof(int64_t));
        int verdict = 1;
        for (Py_ssize_t j = 0; j < n && verdict == 1; j++) {
            lsn += 1;
            int64_t start = sp[2 * j], stop = sp[2 * j + 1];
            if (start < 0 || stop < start || stop > data.len) {
                verdict = 0;
                break;
            }
            Reader r = {(const unsigned char *)data.buf + start, (const unsigned char *)data.buf + stop};
            Py_ssize_t one, nops;
            if (!read_array(&r, &one) || one != 1 || !read_array(&r, &nops)) {
                verdict = 0;
                break;
            }
            for (Py_ssize_t k = 0; k < nops && verdict == 1; k++) {
                verdict = one_op(&r, lsn, last, out);
            }
            if (verdict == 1 && r.p != r.end) verdict = 0; /* trailing bytes */
        }
        PyBuffer_Release(&data);
        PyBuffer_Release(&spans);
        if (verdict != 1) {
            Py_DECREF(out);
            if (verdict < 0) return NULL;
            Py_RETURN_NONE;
        }
    }
    return out;
}

static PyMethodDef methods[] = {
    {"first_pass", first_pass, METH_VARARGS, "The replay's pass over every transaction (see afterword.store.replay)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "afterword.store._fastreplay", "The store replay's first pass in C.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fastreplay(void)
{
    return PyModule_Create(&module);
}
