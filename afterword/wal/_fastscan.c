/* The WAL replay scan's hot loop in C (optional; afterword/wal/frame.py's read_spans_py is
 * the reference and is used when this module is not built).
 *
 * read_spans(data, offset, salt, expect, max_payload, hash64) walks the frames of one
 * segment image from `offset`, exactly as the Python loop does: the frame header is read in
 * place, the marker, lsn, length and bounds are checked, and each frame's checksum (xxh3-64
 * of header bytes 0..24 then the payload, seeded with the salt) is computed by calling
 * `hash64(bytes, salt)` (xxhash.xxh3_64_intdigest: the hash itself stays in the xxhash
 * package; this loop only saves the per-frame interpreter work around it). No payload is
 * copied out and no object is made per frame: each good frame's payload span in `data`
 * (start, end) goes into one array of native int64 pairs, returned as bytes. Returns
 * (offset where the run stopped, next expected lsn, spans).
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

static PyObject *read_spans(PyObject *self, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t offset, max_payload;
    unsigned long long salt, expect;
    PyObject *hash64;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*nKKnO:read_spans", &view, &offset, &salt, &expect, &max_payload, &hash64)) {
        return NULL;
    }
    const unsigned char *data = (const unsigned char *)view.buf;
    const Py_ssize_t size = view.len;
    const uint32_t marker = (uint32_t)(salt & 0xFFFFFFFFu) ? (uint32_t)(salt & 0xFFFFFFFFu) : 1u;
    PyObject *seed = PyLong_FromUnsignedLongLong(salt);
    PyObject *scratch = NULL; /* header + payload, hashed as one buffer */
    int64_t *spans = NULL;     /* payload start, end of each good frame */
    Py_ssize_t count = 0, room = 0;
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
        if (count == room) {
            Py_ssize_t grown = room ? room * 2 : 1024;
            int64_t *more = PyMem_Realloc(spans, (size_t)grown * 2 * sizeof(int64_t));
            if (more == NULL) {
                PyErr_NoMemory();
                goto fail;
            }
            spans = more;
            room = grown;
        }
        spans[2 * count] = (int64_t)start;
        spans[2 * count + 1] = (int64_t)(start + (Py_ssize_t)length);
        count += 1;
        offset = start + (Py_ssize_t)((length + ALIGN - 1) & ~(uint64_t)(ALIGN - 1));
        expect += 1;
    }
    Py_XDECREF(scratch);
    Py_DECREF(seed);
    PyBuffer_Release(&view);
    PyObject *packed = PyBytes_FromStringAndSize(spans ? (const char *)spans : "",
                                                 count * 2 * (Py_ssize_t)sizeof(int64_t));
    PyMem_Free(spans);
    if (packed == NULL) {
        return NULL;
    }
    return Py_BuildValue("nKN", offset, expect, packed);

fail:
    Py_XDECREF(scratch);
    Py_XDECREF(seed);
    PyMem_Free(spans);
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
    {"read_spans", read_spans, METH_VARARGS, "Walk one segment's run of frames (see afterword.wal.frame.read_spans)."},
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
