/* The WAL replay scan's hot loop in C (optional; afterword/wal/frame.py's read_run is the
 * reference and is used when this module is not built).
 *
 * read_run(data, offset, salt, expect, max_payload, out, frame_type, hash64) walks the
 * frames of one segment image from `offset`, exactly as the Python loop does: the frame
 * header is read in place, the marker, lsn, length and bounds are checked, and each frame's
 * checksum (xxh3-64 of header bytes 0..24 then the payload, seeded with the salt) is
 * computed by calling `hash64(bytes, salt)` (xxhash.xxh3_64_intdigest: the hash itself stays
 * in the xxhash package; this loop only saves the per-frame interpreter work around it).
 * Each good frame is appended to `out` as frame_type(offset, lsn, batch_start, payload,
 * end). Returns (offset where the run stopped, next expected lsn).
 *
 * Layout (little endian): marker u32 | length u32 | lsn u64 | batch_start u64 | check u64.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define FRAME_HEADER_SIZE 32
#define CHECKED_HEADER 24
#define ALIGN 8

static uint32_t le32(const unsigned char *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static uint64_t le64(const unsigned char *p)
{
    return (uint64_t)le32(p) | ((uint64_t)le32(p + 4) << 32);
}

static PyObject *make_frame(PyTypeObject *type, Py_ssize_t offset, uint64_t lsn, uint64_t batch_start,
                            PyObject *payload, Py_ssize_t end)
{
    /* The items first, then the tuple subclass instance (CPython's own tuple.__new__ for a
     * subclass allocates with tp_alloc and fills the slots the same way). */
    PyObject *items[5];
    items[0] = PyLong_FromSsize_t(offset);
    items[1] = PyLong_FromUnsignedLongLong(lsn);
    items[2] = PyLong_FromUnsignedLongLong(batch_start);
    items[3] = payload;
    items[4] = PyLong_FromSsize_t(end);
    if (!items[0] || !items[1] || !items[2] || !items[4]) {
        Py_XDECREF(items[0]);
        Py_XDECREF(items[1]);
        Py_XDECREF(items[2]);
        Py_XDECREF(items[4]);
        return NULL;
    }
    PyObject *frame = type->tp_alloc(type, 5);
    if (frame == NULL) {
        Py_DECREF(items[0]);
        Py_DECREF(items[1]);
        Py_DECREF(items[2]);
        Py_DECREF(items[4]);
        return NULL;
    }
    Py_INCREF(payload);
    for (int i = 0; i < 5; i++) {
        PyTuple_SET_ITEM(frame, i, items[i]);
    }
    /* Ints and bytes only: the frame can never be part of a cycle. Tens of thousands of
     * tracked frames alive at once made the collector walk them again and again during
     * replay (~15% of an open); untracked, they cost it nothing. */
    if (PyObject_IS_GC(frame)) {
        PyObject_GC_UnTrack(frame);
    }
    return frame;
}

static PyObject *read_run(PyObject *self, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t offset, max_payload;
    unsigned long long salt, expect;
    PyObject *out, *frame_type, *hash64;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*nKKnO!O!O:read_run", &view, &offset, &salt, &expect, &max_payload,
                          &PyList_Type, &out, &PyType_Type, &frame_type, &hash64)) {
        return NULL;
    }
    PyTypeObject *type = (PyTypeObject *)frame_type;
    if (!PyType_IsSubtype(type, &PyTuple_Type)) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_TypeError, "read_run: frame_type must be a tuple subclass");
        return NULL;
    }
    const unsigned char *data = (const unsigned char *)view.buf;
    const Py_ssize_t size = view.len;
    const uint32_t marker = (uint32_t)(salt & 0xFFFFFFFFu) ? (uint32_t)(salt & 0xFFFFFFFFu) : 1u;
    PyObject *seed = PyLong_FromUnsignedLongLong(salt);
    PyObject *scratch = NULL; /* header + payload, hashed as one buffer */
    if (seed == NULL) {
        goto fail;
    }
    if (offset < 0) {
        offset = size; /* nothing to read (the Python loop would read from the end) */
    }
    while (offset <= size - FRAME_HEADER_SIZE) {
        const unsigned char *head = data + offset;
        uint32_t found = le32(head);
        uint64_t length = le32(head + 4);
        uint64_t lsn = le64(head + 8);
        uint64_t batch_start = le64(head + 16);
        uint64_t check = le64(head + 24);
        Py_ssize_t start = offset + FRAME_HEADER_SIZE;
        if (found != marker || lsn != expect || (Py_ssize_t)length > max_payload ||
            (Py_ssize_t)length > size - start) {
            break;
        }
        Py_XDECREF(scratch);
        scratch = PyBytes_FromStringAndSize(NULL, CHECKED_HEADER + (Py_ssize_t)length);
        if (scratch == NULL) {
            goto fail;
        }
        char *buf = PyBytes_AS_STRING(scratch);
        memcpy(buf, head, CHECKED_HEADER);
        memcpy(buf + CHECKED_HEADER, data + start, (size_t)length);
        PyObject *hash_args[2] = {scratch, seed};
        PyObject *digest = PyObject_Vectorcall(hash64, hash_args, 2, NULL);
        if (digest == NULL) {
            goto fail;
        }
        unsigned long long got = PyLong_AsUnsignedLongLong(digest);
        Py_DECREF(digest);
        if (got == (unsigned long long)-1 && PyErr_Occurred()) {
            goto fail;
        }
        if (got != check) {
            break;
        }
        Py_ssize_t next = start + (Py_ssize_t)((length + ALIGN - 1) & ~(uint64_t)(ALIGN - 1));
        PyObject *payload = PyBytes_FromStringAndSize((const char *)data + start, (Py_ssize_t)length);
        if (payload == NULL) {
            goto fail;
        }
        PyObject *frame = make_frame(type, offset, lsn, batch_start, payload, next);
        Py_DECREF(payload);
        if (frame == NULL) {
            goto fail;
        }
        int appended = PyList_Append(out, frame);
        Py_DECREF(frame);
        if (appended < 0) {
            goto fail;
        }
        offset = next;
        expect += 1;
    }
    Py_XDECREF(scratch);
    Py_DECREF(seed);
    PyBuffer_Release(&view);
    return Py_BuildValue("nK", offset, expect);

fail:
    Py_XDECREF(scratch);
    Py_XDECREF(seed);
    PyBuffer_Release(&view);
    return NULL;
}

/* find_aligned(data, pattern, start): the first offset p >= start on the 8-byte grid where
 * data holds pattern, or -1 (afterword.wal.frame.find_aligned_py is the reference). The
 * searches for shadows and leftovers after the end of a log cover the rest of a segment,
 * mostly zeros; only grid positions can hold a frame or a shadow, so only those are tried. */
static PyObject *find_aligned(PyObject *self, PyObject *args)
{
    Py_buffer view, pat;
    Py_ssize_t start;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*y*n:find_aligned", &view, &pat, &start)) {
        return NULL;
    }
    Py_ssize_t found = -1;
    if (start < 0) {
        PyBuffer_Release(&view);
        PyBuffer_Release(&pat);
        PyErr_SetString(PyExc_ValueError, "find_aligned: negative start");
        return NULL;
    }
    const unsigned char *data = (const unsigned char *)view.buf;
    const unsigned char *p = (const unsigned char *)pat.buf;
    const Py_ssize_t n = view.len, m = pat.len;
    Py_ssize_t pos = (start + ALIGN - 1) / ALIGN * ALIGN;
    if (m == 0) {
        found = pos <= n ? pos : -1;
    } else {
        for (; pos <= n - m; pos += ALIGN) {
            if (data[pos] == p[0] && memcmp(data + pos, p, (size_t)m) == 0) {
                found = pos;
                break;
            }
        }
    }
    PyBuffer_Release(&view);
    PyBuffer_Release(&pat);
    return PyLong_FromSsize_t(found);
}

static PyMethodDef methods[] = {
    {"read_run", read_run, METH_VARARGS, "Walk one segment's run of frames (see afterword.wal.frame.read_run)."},
    {"find_aligned", find_aligned, METH_VARARGS, "First grid offset holding a pattern (see frame.find_aligned)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "afterword.wal._fastscan", "The WAL replay scan's hot loop in C.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fastscan(void)
{
    return PyModule_Create(&module);
}
