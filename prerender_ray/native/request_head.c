/* A simple request's head in one call (issue 37): what the ingress protocol (``api/connections.py``)
 * would gather from llhttp's callbacks (``on_url``, ``on_header`` each, uvicorn's lower-casing and
 * trailing-whitespace strip, ``should_keep_alive``), for a read that holds exactly one complete
 * request of the plainest form, and nothing else. Anything else answers None and llhttp parses the
 * read as before: this recognizes a strict subset of what llhttp accepts, never more.
 *
 * simple_head(data, max_headers, max_bytes) -> (method, target, headers, keep_alive) | None
 *
 * The form: ``GET`` or ``HEAD``, one space, an origin-form target of RFC 3986's path and query
 * characters (no fragment, no byte outside them), one space, ``HTTP/1.1``, CRLF; header lines
 * ``name: value`` CRLF with a token name (RFC 9110 5.6.2) and a value of visible ASCII, spaces and
 * tabs that is not empty once stripped; a final CRLF that is the read's last byte. No line folding,
 * no bare CR or LF, no obs-text. Refused (None) as well: a ``content-length``, ``transfer-encoding``,
 * ``upgrade`` or ``expect`` header (a body, a protocol switch or an interim answer are llhttp's and
 * uvicorn's), a ``connection`` header other than one ``keep-alive`` or ``close``, more than
 * ``max_headers`` headers or more than ``max_bytes`` of target and header names and values (the
 * protocol's 431 is given on llhttp's path).
 *
 * tests/native/test_request_head.py holds every head this accepts equal to what httptools reports
 * for it, over generated heads and mutations of each byte.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

static PyObject *s_get, *s_head;

/* RFC 9110 tchar */
static int is_tchar(unsigned char c) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return 1;
    return c != 0 && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

/* RFC 3986 pchar, '/' and '?' (a query's characters): unreserved, pct-encoded's '%', sub-delims, ':', '@' */
static int is_target(unsigned char c) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return 1;
    return c != 0 && strchr("-._~%!$&'()*+,;=:@/?", c) != NULL;
}

static int is_value(unsigned char c) { return (c >= 0x20 && c <= 0x7e) || c == '\t'; }

/* ``name`` (``n`` bytes, lower-cased already) equals the lower-case literal ``lit``. */
static int named(const char *name, Py_ssize_t n, const char *lit) {
    return (size_t)n == strlen(lit) && memcmp(name, lit, (size_t)n) == 0;
}

/* ``v`` (``n`` bytes) equals the lower-case literal ``lit``, ASCII case ignored. */
static int value_is(const unsigned char *v, Py_ssize_t n, const char *lit) {
    if ((size_t)n != strlen(lit)) return 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = v[i];
        if (c >= 'A' && c <= 'Z') c = (unsigned char)(c + 32);
        if (c != (unsigned char)lit[i]) return 0;
    }
    return 1;
}

static PyObject *simple_head(PyObject *self, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t max_headers, max_bytes;
    if (!PyArg_ParseTuple(args, "y*nn", &buf, &max_headers, &max_bytes)) return NULL;
    const unsigned char *p = (const unsigned char *)buf.buf;
    const Py_ssize_t n = buf.len;
    PyObject *headers = NULL, *method, *target = NULL, *result = NULL;
    Py_ssize_t i, counted;
    int keep_alive = 1, connection = 0;
    char lowered[256];

    /* the request line */
    if (n >= 4 && memcmp(p, "GET ", 4) == 0) {
        method = s_get;
        i = 4;
    } else if (n >= 5 && memcmp(p, "HEAD ", 5) == 0) {
        method = s_head;
        i = 5;
    } else {
        goto refuse;
    }
    Py_ssize_t start = i;
    if (i >= n || p[i] != '/') goto refuse;
    while (i < n && is_target(p[i])) i++;
    Py_ssize_t tlen = i - start;
    if (n - i < 11 || memcmp(p + i, " HTTP/1.1\r\n", 11) != 0) goto refuse;
    i += 11;
    counted = tlen;
    if (counted > max_bytes) goto refuse;

    headers = PyList_New(0);
    if (headers == NULL) goto fail;
    /* header lines, then the empty line that must end the read */
    for (;;) {
        if (n - i < 2) goto refuse;
        if (p[i] == '\r') {
            if (p[i + 1] != '\n' || i + 2 != n) goto refuse;
            break;
        }
        Py_ssize_t ns = i;
        while (i < n && is_tchar(p[i])) i++;
        Py_ssize_t nlen = i - ns;
        if (nlen == 0 || nlen >= (Py_ssize_t)sizeof(lowered) || i >= n || p[i] != ':') goto refuse;
        i++;
        while (i < n && (p[i] == ' ' || p[i] == '\t')) i++;
        Py_ssize_t vs = i;
        while (i < n && is_value(p[i])) i++;
        if (n - i < 2 || p[i] != '\r' || p[i + 1] != '\n') goto refuse;
        Py_ssize_t ve = i;
        i += 2;
        counted += nlen + (ve - vs);  /* as the protocol counts it: the value as llhttp gives it */
        while (ve > vs && (p[ve - 1] == ' ' || p[ve - 1] == '\t')) ve--;
        if (ve == vs) goto refuse;
        if (PyList_GET_SIZE(headers) >= max_headers) goto refuse;
        if (counted > max_bytes) goto refuse;
        for (Py_ssize_t k = 0; k < nlen; k++) {
            char c = (char)p[ns + k];
            lowered[k] = (c >= 'A' && c <= 'Z') ? (char)(c + 32) : c;
        }
        if (named(lowered, nlen, "content-length") || named(lowered, nlen, "transfer-encoding") ||
            named(lowered, nlen, "upgrade") || named(lowered, nlen, "expect"))
            goto refuse;
        if (named(lowered, nlen, "connection")) {
            if (connection++) goto refuse;
            if (value_is(p + vs, ve - vs, "close"))
                keep_alive = 0;
            else if (!value_is(p + vs, ve - vs, "keep-alive"))
                goto refuse;
        }
        PyObject *pair = Py_BuildValue("(y#y#)", lowered, nlen, (const char *)p + vs, ve - vs);
        if (pair == NULL) goto fail;
        int failed = PyList_Append(headers, pair);
        Py_DECREF(pair);
        if (failed) goto fail;
    }
    target = PyBytes_FromStringAndSize((const char *)p + start, tlen);
    if (target == NULL) goto fail;
    result = PyTuple_Pack(4, method, target, headers, keep_alive ? Py_True : Py_False);
    goto done;
refuse:
    result = Py_NewRef(Py_None);
    goto done;
fail:
    result = NULL;
done:
    Py_XDECREF(target);
    Py_XDECREF(headers);
    PyBuffer_Release(&buf);
    return result;
}

static PyMethodDef methods[] = {
    {"simple_head", simple_head, METH_VARARGS, "simple_head(data, max_headers, max_bytes)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "request_head", NULL, -1, methods};

PyMODINIT_FUNC PyInit_request_head(void) {
    s_get = PyUnicode_InternFromString("GET");
    s_head = PyUnicode_InternFromString("HEAD");
    if (s_get == NULL || s_head == NULL) return NULL;
    return PyModule_Create(&module);
}
