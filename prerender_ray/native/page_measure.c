/* The render guard's counts of a page's visible markup in one pass (issue 37: CPU per result).
 *
 * measure(markup) -> (text, links)
 *
 * Equal to ``prerender_ray.queue.guard.measure``, its reference, which the tests hold it to: ``text``
 * is ``len(_TAG.sub(b" ", markup).translate(None, _NOT_COUNTED))`` and ``links`` is
 * ``_LINK.subn(b"", markup)[1]``, where
 *
 *   _TAG  = <[!/?a-zA-Z][^<>]*>?                (a tag stops at the next < or >)
 *   _LINK = <a\s[^<>]*?\bhref\s*=               (ASCII case ignored; \s is [ \t\n\r\f\v])
 *   _NOT_COUNTED = ASCII whitespace and UTF-8 continuation bytes (0x80-0xBF)
 *
 * Those regex passes built a copy of the page per tag and cost 160-410 us on a 33-36 KB page (a
 * fifth of the keeper's CPU a result); this reads each byte a bounded number of times: a tag's
 * bytes once, a link candidate's up to its next < or >.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

static int is_space(unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

static int is_alpha(unsigned char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

static int is_word(unsigned char c) { return is_alpha(c) || (c >= '0' && c <= '9') || c == '_'; }

static int counted(unsigned char c) { return !is_space(c) && !(c >= 0x80 && c <= 0xBF); }

static unsigned char lower(unsigned char c) { return (c >= 'A' && c <= 'Z') ? (unsigned char)(c + 32) : c; }

/* Visible characters outside _TAG's matches, as ``re.sub`` finds them left to right. */
static Py_ssize_t text_chars(const unsigned char *s, Py_ssize_t n) {
    Py_ssize_t count = 0, i = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c == '<' && i + 1 < n && (s[i + 1] == '!' || s[i + 1] == '/' || s[i + 1] == '?' || is_alpha(s[i + 1]))) {
            Py_ssize_t j = i + 2;
            while (j < n && s[j] != '<' && s[j] != '>') j++;
            i = (j < n && s[j] == '>') ? j + 1 : j;
            continue;
        }
        count += counted(c);
        i++;
    }
    return count;
}

/* The end of a _LINK match starting at ``i`` (just past its ``=``), or -1. The lazy ``[^<>]*?`` tries
 * ``\bhref\s*=`` at each position before it takes that byte, and never takes a < or >. */
static Py_ssize_t link_at(const unsigned char *s, Py_ssize_t n, Py_ssize_t i) {
    if (i + 2 >= n || s[i] != '<' || lower(s[i + 1]) != 'a' || !is_space(s[i + 2]))
        return -1;
    for (Py_ssize_t k = i + 3;; k++) {
        if (k + 4 <= n && !is_word(s[k - 1]) && lower(s[k]) == 'h' && lower(s[k + 1]) == 'r'
                && lower(s[k + 2]) == 'e' && lower(s[k + 3]) == 'f') {
            Py_ssize_t m = k + 4;
            while (m < n && is_space(s[m])) m++;
            if (m < n && s[m] == '=')
                return m + 1;
        }
        if (k >= n || s[k] == '<' || s[k] == '>')
            return -1;
    }
}

/* Non-overlapping _LINK matches, as ``re.subn`` counts them. */
static Py_ssize_t link_count(const unsigned char *s, Py_ssize_t n) {
    Py_ssize_t count = 0, i = 0;
    while (i < n) {
        const unsigned char *lt = memchr(s + i, '<', (size_t)(n - i));
        if (lt == NULL)
            break;
        i = lt - s;
        Py_ssize_t end = link_at(s, n, i);
        i = end >= 0 ? end : i + 1;
        count += end >= 0;
    }
    return count;
}

static PyObject *measure(PyObject *self, PyObject *arg) {
    Py_buffer buf;
    if (PyObject_GetBuffer(arg, &buf, PyBUF_SIMPLE) < 0)
        return NULL;
    const unsigned char *s = (const unsigned char *)buf.buf;
    Py_ssize_t n = buf.len, text, links;
    Py_BEGIN_ALLOW_THREADS
    text = text_chars(s, n);
    links = link_count(s, n);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buf);
    return Py_BuildValue("(nn)", text, links);
}

static PyMethodDef methods[] = {
    {"measure", measure, METH_O, "measure(markup) -> (text, links)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "page_measure", NULL, -1, methods};

PyMODINIT_FUNC PyInit_page_measure(void) { return PyModule_Create(&module); }
