/* The spread lane's page answer in one call (issue 37): ``api/bot/lane.py``'s ``page_answer``, the
 * Python reference it must equal, done without a Python object per step. From the page log reader's
 * index entry to the answer's head bytes: the look-up, one pread (the GIL released), the checksum
 * (the reader's own hash function, called once), the replication envelope, the page record's fixed
 * head, the stored frame of version 2 and the head joined with the Date, age and the class's tail.
 *
 * answer(reader, key, now, aged, takes, second, date, tail, end) -> (head, body, last_cached) | None | 2
 *   None: not the lane's answer (an unreadable record is counted in ``reader.unreadable`` as
 *   ``PageLogReader.get`` counts it); 2: a frame of version 1, which the Python reference answers.
 * configure(checksum, status_line): the reader's hash (``records.CHECKSUM_HASH``, its low 32 bits
 *   compared) and the 200's status line as the server writes it.
 *
 * Layouts (each module holds its own): the index entry ``records._VALUE`` ("<BBHIIIIqqQ"), the
 * envelope ``replication._HEAD`` (">BBQH" and the writer's name), the record ``pages._HEAD``
 * ("<2sBBHqqIII", then "<I" of the frame in version 2), the frame ``framing._HEAD`` ("<BBHH") and
 * ``framing._WIRE`` ("<qII"). tests/native/test_lane_page.py holds this equal to the reference over
 * records valid and broken.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#define VALUE_SIZE 44
#define ENVELOPE_HEAD 12
#define RECORD_HEAD 34
#define FRAME_HEAD 6
#define WIRE_HEAD 16
#define OTHER_FRAME 2

static PyObject *checksum_fn = NULL;
static PyObject *status_line = NULL;
static PyObject *s_entries, *s_fds, *s_max_record, *s_unreadable;

static uint16_t le16(const unsigned char *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t le32(const unsigned char *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static uint64_t le64(const unsigned char *p) { return (uint64_t)le32(p) | ((uint64_t)le32(p + 4) << 32); }
static uint16_t be16(const unsigned char *p) { return (uint16_t)((p[0] << 8) | p[1]); }

/* Whether ``p[0:n]`` decodes as strict UTF-8, as ``str(view, "utf-8")`` does (ASCII without a call). */
static int utf8_ok(const unsigned char *p, Py_ssize_t n) {
    Py_ssize_t i;
    for (i = 0; i < n; i++)
        if (p[i] & 0x80) break;
    if (i == n) return 1;
    PyObject *s = PyUnicode_DecodeUTF8((const char *)p, n, "strict");
    if (s == NULL) {
        PyErr_Clear();
        return 0;
    }
    Py_DECREF(s);
    return 1;
}

static int count_unreadable(PyObject *reader) {
    PyObject *n = PyObject_GetAttr(reader, s_unreadable);
    if (n == NULL) return -1;
    PyObject *one = PyLong_FromLong(1);
    PyObject *m = one == NULL ? NULL : PyNumber_Add(n, one);
    Py_DECREF(n);
    Py_XDECREF(one);
    if (m == NULL) return -1;
    int r = PyObject_SetAttr(reader, s_unreadable, m);
    Py_DECREF(m);
    return r;
}

/* The stored bytes of ``value`` (an index entry), checked whole; NULL with no error: unreadable. */
static PyObject *read_record(PyObject *reader, const unsigned char *v) {
    uint32_t seg = le32(v + 4), offset = le32(v + 8), length = le32(v + 12), checksum = le32(v + 16);
    PyObject *fds = PyObject_GetAttr(reader, s_fds);
    if (fds == NULL) return NULL;
    PyObject *max_obj = PyObject_GetAttr(reader, s_max_record);
    if (max_obj == NULL) {
        Py_DECREF(fds);
        return NULL;
    }
    long long max_record = PyLong_AsLongLong(max_obj);
    Py_DECREF(max_obj);
    if (max_record == -1 && PyErr_Occurred()) {
        Py_DECREF(fds);
        return NULL;
    }
    PyObject *seg_obj = PyLong_FromUnsignedLong(seg);
    if (seg_obj == NULL) {
        Py_DECREF(fds);
        return NULL;
    }
    PyObject *fd_obj = PyDict_Check(fds) ? PyDict_GetItemWithError(fds, seg_obj) : NULL;
    Py_DECREF(seg_obj);
    if (fd_obj == NULL && PyErr_Occurred()) {
        Py_DECREF(fds);
        return NULL;
    }
    long fd = -1;
    if (fd_obj != NULL) {
        fd = PyLong_AsLong(fd_obj);
        if (fd == -1 && PyErr_Occurred()) {
            Py_DECREF(fds);
            return NULL;
        }
    }
    Py_DECREF(fds);
    if (fd_obj == NULL || (long long)length > max_record) return NULL;
    PyObject *data = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)length);
    if (data == NULL) return NULL;
    ssize_t n;
    for (;;) {  /* as os.pread: the GIL released, EINTR retried after the signal handlers */
        Py_BEGIN_ALLOW_THREADS
        n = pread((int)fd, PyBytes_AS_STRING(data), (size_t)length, (off_t)offset);
        Py_END_ALLOW_THREADS
        if (n >= 0 || errno != EINTR) break;
        if (PyErr_CheckSignals() < 0) {
            Py_DECREF(data);
            return NULL;
        }
    }
    if (n < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        Py_DECREF(data);
        return NULL;
    }
    if ((uint32_t)n != length) {
        Py_DECREF(data);
        return NULL;
    }
    PyObject *sum = PyObject_CallOneArg(checksum_fn, data);
    if (sum == NULL) {
        Py_DECREF(data);
        return NULL;
    }
    unsigned long long got = PyLong_AsUnsignedLongLongMask(sum);
    Py_DECREF(sum);
    if (got == (unsigned long long)-1 && PyErr_Occurred()) {
        Py_DECREF(data);
        return NULL;
    }
    if ((uint32_t)(got & 0xFFFFFFFFu) != checksum) {
        Py_DECREF(data);
        return NULL;
    }
    return data;
}

static PyObject *answer(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "answer() takes 9 arguments");
        return NULL;
    }
    if (checksum_fn == NULL || status_line == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "lane_page.configure() was not called");
        return NULL;
    }
    PyObject *reader = args[0], *key = args[1], *date = args[6], *tail = args[7], *end = args[8];
    long long now = PyLong_AsLongLong(args[2]);
    if (now == -1 && PyErr_Occurred()) return NULL;
    int aged = PyObject_IsTrue(args[3]);
    if (aged < 0) return NULL;
    long takes = PyLong_AsLong(args[4]);
    if (takes == -1 && PyErr_Occurred()) return NULL;
    long long second = PyLong_AsLongLong(args[5]);
    if (second == -1 && PyErr_Occurred()) return NULL;
    if (!PyBytes_Check(date) || !PyBytes_Check(tail) || !PyBytes_Check(end)) {
        PyErr_SetString(PyExc_TypeError, "date, tail and end are bytes");
        return NULL;
    }

    /* PageLogReader.get: the index entry, the record read whole */
    PyObject *entries = PyObject_GetAttr(reader, s_entries);
    if (entries == NULL) return NULL;
    PyObject *value = PyDict_Check(entries) ? PyDict_GetItemWithError(entries, key) : NULL;
    if (value == NULL) {
        Py_DECREF(entries);
        if (PyErr_Occurred()) return NULL;
        Py_RETURN_NONE;
    }
    if (!PyBytes_Check(value) || PyBytes_GET_SIZE(value) != VALUE_SIZE) {
        Py_DECREF(entries);
        PyErr_SetString(PyExc_ValueError, "a page log index entry is not 44 bytes");
        return NULL;
    }
    unsigned char v[VALUE_SIZE];
    memcpy(v, PyBytes_AS_STRING(value), VALUE_SIZE);  /* the dict may change while the GIL is out */
    Py_DECREF(entries);
    PyObject *data = read_record(reader, v);
    if (data == NULL) {
        if (PyErr_Occurred() || count_unreadable(reader) < 0) return NULL;
        Py_RETURN_NONE;
    }
    uint8_t flags = v[1];
    int64_t last = (int64_t)le64(v + 20), expires = (int64_t)le64(v + 28);
    PyObject *result = NULL;
    const unsigned char *d = (const unsigned char *)PyBytes_AS_STRING(data);
    Py_ssize_t size = PyBytes_GET_SIZE(data);

    /* the lane's checks of the index entry's times */
    if (!(flags & 0x02) || expires <= now || ((flags & 0x01) != 0) != (aged != 0)) goto none;

    /* replication.payload_view */
    if (size < ENVELOPE_HEAD || d[0] != 0xA7 || d[1] > 0x02) goto none;
    Py_ssize_t start = ENVELOPE_HEAD + be16(d + 10);
    if (size < start || (d[1] & 0x01)) goto none;
    const unsigned char *p = d + start;
    uint64_t n = (uint64_t)(size - start);

    /* pages.decode_head */
    if (n < RECORD_HEAD || p[0] != 'P' || p[1] != 'G') goto none;
    uint8_t version = p[2], rflags = p[3];
    uint16_t status = le16(p + 4);
    if ((version != 1 && version != 2) || (rflags & ~0x0F)) goto none;
    uint64_t key_start = RECORD_HEAD, frame_len = 0;
    if (version >= 2) {
        if (n < RECORD_HEAD + 4) goto none;
        frame_len = le32(p + RECORD_HEAD);
        key_start += 4;
    }
    uint64_t frame_start = key_start + le32(p + 22) + le32(p + 26);
    uint64_t body_start = frame_start + frame_len;
    if (body_start + le32(p + 30) != n) goto none;
    if (status != 200 || frame_len == 0) goto none;

    /* framing._read, then wire_frame (version 2); version 1 goes to the reference */
    const unsigned char *f = p + frame_start;
    if (frame_len < FRAME_HEAD) goto none;
    uint8_t fversion = f[0], coding = f[1];
    uint64_t lm_start = FRAME_HEAD + (uint64_t)le16(f + 2);
    uint64_t block_start = lm_start + le16(f + 4);
    if ((fversion != 1 && fversion != 2) || coding >= 3 || block_start > frame_len) goto none;
    if (!utf8_ok(f + FRAME_HEAD, (Py_ssize_t)(lm_start - FRAME_HEAD))) goto none;
    uint64_t lm_len = block_start - lm_start;
    if (!(lm_len == 1 && f[lm_start] == 0xFF) && !utf8_ok(f + lm_start, (Py_ssize_t)lm_len)) goto none;
    if (fversion == 1) {
        Py_DECREF(data);
        return PyLong_FromLong(OTHER_FRAME);
    }
    const unsigned char *block = f + block_start;
    uint64_t block_len = frame_len - block_start;
    if (block_len < WIRE_HEAD + 2) goto none;
    int64_t modified = (int64_t)le64(block);
    uint64_t at = le32(block + 8), at_end = le32(block + 12);
    const unsigned char *lines = block + WIRE_HEAD;
    uint64_t lines_len = block_len - WIRE_HEAD;
    if (!(at <= at_end && at_end <= lines_len) || lines[lines_len - 2] != '\r' || lines[lines_len - 1] != '\n')
        goto none;
    if (!((takes >> coding) & 1)) goto none;

    /* the head: status line, Date, the frame's lines (a later Last-Modified held to the Date), age,
     * the class's tail, the end */
    const char *dp = PyBytes_AS_STRING(date);
    Py_ssize_t date_len = PyBytes_GET_SIZE(date);
    int held = modified > second;
    static const char LM[] = "last-modified: ";
    char age[40];
    int age_len = 0;
    if (flags & 0x01) {
        unsigned long long secs = last > now ? 0 : ((uint64_t)now - (uint64_t)last) / 1000u;
        age_len = snprintf(age, sizeof age, "age: %llu\r\n", secs);
    }
    Py_ssize_t total = PyBytes_GET_SIZE(status_line) + 6 + date_len + 2 +
                       (held ? (Py_ssize_t)(lines_len - (at_end - at)) + (Py_ssize_t)(sizeof LM - 1) + date_len + 2
                             : (Py_ssize_t)lines_len) +
                       age_len + PyBytes_GET_SIZE(tail) + PyBytes_GET_SIZE(end);
    PyObject *head = PyBytes_FromStringAndSize(NULL, total);
    if (head == NULL) goto fail;
    char *o = PyBytes_AS_STRING(head);
#define PUT(src, len) do { memcpy(o, (src), (size_t)(len)); o += (len); } while (0)
    PUT(PyBytes_AS_STRING(status_line), PyBytes_GET_SIZE(status_line));
    PUT("date: ", 6);
    PUT(dp, date_len);
    PUT("\r\n", 2);
    if (held) {
        PUT(lines, at);
        PUT(LM, sizeof LM - 1);
        PUT(dp, date_len);
        PUT("\r\n", 2);
        PUT(lines + at_end, lines_len - at_end);
    } else {
        PUT(lines, lines_len);
    }
    PUT(age, age_len);
    PUT(PyBytes_AS_STRING(tail), PyBytes_GET_SIZE(tail));
    PUT(PyBytes_AS_STRING(end), PyBytes_GET_SIZE(end));
#undef PUT

    PyObject *view = PyMemoryView_FromObject(data);
    if (view == NULL) {
        Py_DECREF(head);
        goto fail;
    }
    PyObject *body = PySequence_GetSlice(view, (Py_ssize_t)(start + body_start), size);
    Py_DECREF(view);
    if (body == NULL) {
        Py_DECREF(head);
        goto fail;
    }
    PyObject *cached;
    if (flags & 0x01) {
        cached = PyLong_FromLongLong(last);
        if (cached == NULL) {
            Py_DECREF(head);
            Py_DECREF(body);
            goto fail;
        }
    } else {
        cached = Py_NewRef(Py_None);
    }
    result = PyTuple_New(3);
    if (result == NULL) {
        Py_DECREF(head);
        Py_DECREF(body);
        Py_DECREF(cached);
        goto fail;
    }
    PyTuple_SET_ITEM(result, 0, head);
    PyTuple_SET_ITEM(result, 1, body);
    PyTuple_SET_ITEM(result, 2, cached);
    Py_DECREF(data);
    return result;
none:
    Py_DECREF(data);
    Py_RETURN_NONE;
fail:
    Py_DECREF(data);
    return NULL;
}

static PyObject *configure(PyObject *self, PyObject *args) {
    PyObject *fn, *line;
    if (!PyArg_ParseTuple(args, "OS", &fn, &line)) return NULL;
    if (!PyCallable_Check(fn)) {
        PyErr_SetString(PyExc_TypeError, "checksum must be callable");
        return NULL;
    }
    Py_XSETREF(checksum_fn, Py_NewRef(fn));
    Py_XSETREF(status_line, Py_NewRef(line));
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"answer", (PyCFunction)(void (*)(void))answer, METH_FASTCALL,
     "answer(reader, key, now, aged, takes, second, date, tail, end): the spread lane's page answer"},
    {"configure", configure, METH_VARARGS, "configure(checksum, status_line)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "lane_page", NULL, -1, methods};

PyMODINIT_FUNC PyInit_lane_page(void) {
    s_entries = PyUnicode_InternFromString("entries");
    s_fds = PyUnicode_InternFromString("_fds");
    s_max_record = PyUnicode_InternFromString("_max_record");
    s_unreadable = PyUnicode_InternFromString("unreadable");
    if (!s_entries || !s_fds || !s_max_record || !s_unreadable) return NULL;
    return PyModule_Create(&module);
}
