/* The value of an XML-RPC methodResponse, read in C: what elasticslice.rpc.fastxmlrpc's
 * Python reader (and xmlrpc.client.loads(data, use_builtin_types=True)) gives for the usual
 * shapes, made in one pass inside libxml2's SAX2 callbacks, with no Python run per element.
 *
 * libxml2 is lxml's own copy, as for elasticslice/rspec/_fastrspec.c: its functions are
 * looked up in lxml's module at setup(), this file is compiled against the headers lxml
 * ships (lxml/includes), and setup() refuses a libxml2 other than the one compiled against.
 *
 * loads(data) returns the value, or UNUSUAL whenever the Python reader must decide: any
 * error or warning from libxml2, a DOCTYPE or entity declaration, a processing instruction,
 * an attribute, a namespace, an XML declaration other than version 1.0 in UTF-8, a document
 * that does not start with '<', a tag other than methodResponse/params/param/value/struct/
 * member/name/array/data/string/int/i4/i8/boolean/double/nil, an element where text
 * belongs or one too many, a number Python's int() or float() refuses, a boolean other than
 * 0 or 1. The Python reader then gives the same value or raises the standard library's
 * error (UNUSUAL never means the document is wrong, only that this reader does not say).
 *
 * Before libxml2, loads() tries the plain reader below (plain() alone): the usual answer in
 * its plainest form (whitespace between elements, ASCII text), read with no parser at all,
 * and base64 as base64.decodebytes reads it. It gives up at the least doubt, and libxml2
 * then reads the document as above.
 * Built by elasticslice/rpc/fastxmlbuild.py; optional.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <string.h>
#include <libxml/parser.h>
#include <libxml/xmlerror.h>
#include <libxml/xmlversion.h>

static xmlParserCtxtPtr (*x_NewSAXParserCtxt)(const xmlSAXHandler *, void *);
static xmlDocPtr (*x_CtxtReadMemory)(xmlParserCtxtPtr, const char *, int, const char *,
                                     const char *, int);
static void (*x_FreeParserCtxt)(xmlParserCtxtPtr);
static void (*x_StopParser)(xmlParserCtxtPtr);
static void (*x_FreeDoc)(xmlDocPtr);

static PyObject *unusual;   /* the sentinel: the Python reader decides */

/* What an open element is. */
enum { F_RESPONSE, F_PARAMS, F_PARAM, F_VALUE, F_STRUCT, F_MEMBER, F_NAME, F_ARRAY, F_DATA,
       F_STRING, F_INT, F_BOOLEAN, F_DOUBLE, F_NIL };

enum { MAX_DEPTH = 512, SHARED = 512, SHARED_MAX = 32 };

typedef struct {
    int kind;
    int children;       /* child elements so far */
    PyObject *obj;      /* VALUE: its value; STRUCT: the dict; DATA, ARRAY: the list;
                           MEMBER: the name (all owned) */
    PyObject *member;   /* MEMBER: the value (owned) */
} Frame;

typedef struct {
    xmlParserCtxtPtr ctxt;
    int bail;               /* the Python reader decides */
    int errors;             /* libxml2 reported something */
    int depth;              /* open elements (frames[0..depth-1]) */
    int done;               /* the root was closed */
    PyObject *result;       /* the param's value (owned) */
    char *text;             /* the text of the innermost element since its start */
    size_t len, cap;
    Frame frames[MAX_DEPTH];
    PyObject *shared[SHARED];   /* short strings met before: see str_of() */
} State;

static void bail(State *s) {
    if (!s->bail) {
        s->bail = 1;
        x_StopParser(s->ctxt);
    }
}

/* A str of UTF-8 text (libxml2 hands over UTF-8 it has checked; a decoding error still
 * just means the Python reader decides). Short ones are the same object again when met
 * before (struct members' names, repeated words such as "ready"): fewer objects to make and
 * free, and dict insertions that find the hash already computed. Equal values either way. */
static PyObject *share(PyObject **shared, const char *v, size_t len) {
    if (len == 0 || len > SHARED_MAX)
        return PyUnicode_DecodeUTF8(v, (Py_ssize_t)len, NULL);
    size_t h = 2166136261u;
    for (size_t i = 0; i < len; i++)
        h = (h ^ (unsigned char)v[i]) * 16777619u;
    PyObject **slot = &shared[h % SHARED], *hit = *slot;
    if (hit != NULL && (size_t)PyUnicode_GET_LENGTH(hit) == len) {
        const char *h0 = (const char *)PyUnicode_1BYTE_DATA(hit);
        size_t i = 0;
        while (i < len && h0[i] == v[i])   /* (short: no call to memcmp) */
            i++;
        if (i == len)
            return Py_NewRef(hit);
    }
    PyObject *str = PyUnicode_DecodeUTF8(v, (Py_ssize_t)len, NULL);
    if (str != NULL && PyUnicode_IS_ASCII(str))   /* (its bytes are then its UTF-8) */
        Py_XSETREF(*slot, Py_NewRef(str));
    return str;
}

static PyObject *str_of(State *s, const char *v, size_t len) {
    return share(s->shared, v, len);
}

/* int(text) as Python reads it: short plain decimals here, anything else (spaces, a plus
 * sign, underscores, other digits, more than 18 digits) by Python's own int(). */
static PyObject *int_of(State *s, const char *v, size_t len) {
    size_t i = (len > 0 && v[0] == '-') ? 1 : 0;
    if (len > i && len - i <= 18) {
        long long n = 0;
        size_t j = i;
        for (; j < len && v[j] >= '0' && v[j] <= '9'; j++)
            n = n * 10 + (v[j] - '0');
        if (j == len)
            return PyLong_FromLongLong(i ? -n : n);
    }
    PyObject *str = PyUnicode_DecodeUTF8(v, (Py_ssize_t)len, NULL);
    if (str == NULL)
        return NULL;
    PyObject *n = PyLong_FromUnicodeObject(str, 10);
    Py_DECREF(str);
    (void)s;
    return n;
}

static PyObject *float_of(const char *v, size_t len) {
    PyObject *str = PyUnicode_DecodeUTF8(v, (Py_ssize_t)len, NULL);
    if (str == NULL)
        return NULL;
    PyObject *x = PyFloat_FromString(str);
    Py_DECREF(str);
    return x;
}

static void clear_frame(Frame *f) {
    Py_CLEAR(f->obj);
    Py_CLEAR(f->member);
}

/* The kind of a child element `name` of an element of kind `parent` (the one it already
 * has `children` of), or -1: not a shape this reader reads. */
static int child_kind(int parent, int children, const char *name) {
    switch (parent) {
    case -1:
        return strcmp(name, "methodResponse") == 0 ? F_RESPONSE : -1;
    case F_RESPONSE:
        return children == 0 && strcmp(name, "params") == 0 ? F_PARAMS : -1;
    case F_PARAMS:
        return children == 0 && strcmp(name, "param") == 0 ? F_PARAM : -1;
    case F_PARAM:
        return children == 0 && strcmp(name, "value") == 0 ? F_VALUE : -1;
    case F_VALUE:
        if (children != 0)
            return -1;
        switch (name[0]) {
        case 's':
            return strcmp(name, "string") == 0 ? F_STRING :
                   strcmp(name, "struct") == 0 ? F_STRUCT : -1;
        case 'i':
            return strcmp(name, "int") == 0 || strcmp(name, "i4") == 0 ||
                   strcmp(name, "i8") == 0 ? F_INT : -1;
        case 'a':
            return strcmp(name, "array") == 0 ? F_ARRAY : -1;
        case 'b':
            return strcmp(name, "boolean") == 0 ? F_BOOLEAN : -1;
        case 'd':
            return strcmp(name, "double") == 0 ? F_DOUBLE : -1;
        case 'n':
            return strcmp(name, "nil") == 0 ? F_NIL : -1;
        default:
            return -1;
        }
    case F_STRUCT:
        return strcmp(name, "member") == 0 ? F_MEMBER : -1;
    case F_MEMBER:
        if (children == 0)
            return strcmp(name, "name") == 0 ? F_NAME : -1;
        return children == 1 && strcmp(name, "value") == 0 ? F_VALUE : -1;
    case F_ARRAY:
        return children == 0 && strcmp(name, "data") == 0 ? F_DATA : -1;
    case F_DATA:
        return strcmp(name, "value") == 0 ? F_VALUE : -1;
    default:   /* name, string, int, boolean, double, nil: text only */
        return -1;
    }
}

static void on_start(void *ctx, const xmlChar *localname, const xmlChar *prefix,
                     const xmlChar *uri, int nb_namespaces, const xmlChar **namespaces,
                     int nb_attributes, int nb_defaulted, const xmlChar **attributes) {
    State *s = ((xmlParserCtxtPtr)ctx)->_private;
    (void)namespaces, (void)attributes;
    if (s->bail)
        return;
    if (prefix != NULL || uri != NULL || nb_namespaces != 0 || nb_attributes != 0 ||
        nb_defaulted != 0 || s->done || s->depth >= MAX_DEPTH) {
        bail(s);
        return;
    }
    Frame *parent = s->depth ? &s->frames[s->depth - 1] : NULL;
    int kind = child_kind(parent ? parent->kind : -1, parent ? parent->children : 0,
                          (const char *)localname);
    if (kind < 0) {
        bail(s);
        return;
    }
    if (parent)
        parent->children++;
    Frame *f = &s->frames[s->depth++];
    f->kind = kind;
    f->children = 0;
    f->obj = f->member = NULL;
    if (kind == F_STRUCT)
        f->obj = PyDict_New();
    else if (kind == F_DATA)
        f->obj = PyList_New(0);
    if ((kind == F_STRUCT || kind == F_DATA) && f->obj == NULL) {
        PyErr_Clear();
        bail(s);
        return;
    }
    s->len = 0;
}

static void on_text(void *ctx, const xmlChar *ch, int len) {
    State *s = ((xmlParserCtxtPtr)ctx)->_private;
    if (s->bail || s->depth == 0 || len <= 0)
        return;
    Frame *f = &s->frames[s->depth - 1];
    if (!(f->kind == F_NAME || f->kind >= F_STRING || (f->kind == F_VALUE && f->children == 0)))
        return;   /* between elements: nobody reads it */
    if (s->len + (size_t)len > s->cap) {
        size_t cap = s->cap ? s->cap : 256;
        while (cap < s->len + (size_t)len)
            cap *= 2;
        char *text = PyMem_Realloc(s->text, cap);
        if (text == NULL) {
            bail(s);
            return;
        }
        s->text = text;
        s->cap = cap;
    }
    memcpy(s->text + s->len, ch, (size_t)len);
    s->len += (size_t)len;
}

/* Hand `value` (a new reference; NULL: bail) to the element that holds it. */
static void deliver(State *s, PyObject *value) {
    if (value == NULL) {
        PyErr_Clear();
        bail(s);
        return;
    }
    Frame *parent = &s->frames[s->depth - 1];   /* (a value always has a parent) */
    switch (parent->kind) {
    case F_VALUE:
    case F_ARRAY:
        Py_XSETREF(parent->obj, value);
        return;
    case F_MEMBER:
        if (parent->children == 1)
            Py_XSETREF(parent->obj, value);      /* the name */
        else
            Py_XSETREF(parent->member, value);   /* the value */
        return;
    case F_DATA:
        if (PyList_Append(parent->obj, value) < 0) {
            PyErr_Clear();
            bail(s);
        }
        Py_DECREF(value);
        return;
    case F_PARAM:
        Py_XSETREF(s->result, value);
        return;
    default:
        Py_DECREF(value);
        bail(s);
    }
}

static void on_end(void *ctx, const xmlChar *localname, const xmlChar *prefix,
                   const xmlChar *uri) {
    State *s = ((xmlParserCtxtPtr)ctx)->_private;
    (void)localname, (void)prefix, (void)uri;
    if (s->bail || s->depth == 0)
        return;
    Frame *f = &s->frames[--s->depth];
    PyObject *value = NULL;
    int deliver_it = 1;
    switch (f->kind) {
    case F_STRING:
    case F_NAME:
        value = str_of(s, s->text, s->len);
        break;
    case F_VALUE:
        if (f->children == 0) {
            value = str_of(s, s->text, s->len);   /* no type: a string */
        } else {
            value = f->obj;
            f->obj = NULL;
            if (value == NULL) {
                bail(s);
                deliver_it = 0;
            }
        }
        break;
    case F_INT:
        value = int_of(s, s->text, s->len);
        break;
    case F_DOUBLE:
        value = float_of(s->text, s->len);
        break;
    case F_BOOLEAN:
        if (s->len == 1 && (s->text[0] == '0' || s->text[0] == '1')) {
            value = PyBool_FromLong(s->text[0] == '1');
        } else {
            bail(s);
            deliver_it = 0;
        }
        break;
    case F_NIL:
        value = Py_NewRef(Py_None);
        break;
    case F_STRUCT:
    case F_DATA:
        value = f->obj;
        f->obj = NULL;
        break;
    case F_ARRAY:
        value = f->obj;
        f->obj = NULL;
        if (f->children != 1 || value == NULL) {
            Py_XDECREF(value);
            bail(s);
            deliver_it = 0;
        }
        break;
    case F_MEMBER:
        deliver_it = 0;
        if (f->children != 2 || f->obj == NULL || f->member == NULL ||
            PyDict_SetItem(s->frames[s->depth - 1].obj, f->obj, f->member) < 0) {
            PyErr_Clear();
            bail(s);
        }
        break;
    default:   /* methodResponse, params, param: exactly one child each */
        deliver_it = 0;
        if (f->children != 1)
            bail(s);
        if (f->kind == F_RESPONSE)
            s->done = 1;
        break;
    }
    clear_frame(f);
    if (deliver_it && !s->bail)
        deliver(s, value);
    else
        Py_XDECREF(value);
    s->len = 0;
}

static void on_error(void *ctx, const xmlError *error) {
    State *s = ((xmlParserCtxtPtr)ctx)->_private;
    (void)error;
    s->errors++;
    bail(s);
}

/* A DOCTYPE, an entity declaration, a processing instruction: the Python reader decides. */
static void on_subset(void *ctx, const xmlChar *name, const xmlChar *eid, const xmlChar *sid) {
    (void)name, (void)eid, (void)sid;
    bail(((xmlParserCtxtPtr)ctx)->_private);
}

static void on_entity(void *ctx, const xmlChar *name, int type, const xmlChar *pid,
                      const xmlChar *sid, xmlChar *content) {
    (void)name, (void)type, (void)pid, (void)sid, (void)content;
    bail(((xmlParserCtxtPtr)ctx)->_private);
}

static void on_pi(void *ctx, const xmlChar *target, const xmlChar *data) {
    (void)target, (void)data;
    bail(((xmlParserCtxtPtr)ctx)->_private);
}

static void on_reference(void *ctx, const xmlChar *name) {
    (void)name;
    bail(((xmlParserCtxtPtr)ctx)->_private);
}

static xmlSAXHandler handler;

static int ascii_ieq(const xmlChar *a, const char *b) {
    for (; *a && *b; a++, b++) {
        int c = *a >= 'A' && *a <= 'Z' ? *a + 32 : *a;
        if (c != *b)
            return 0;
    }
    return *a == 0 && *b == 0;
}

/* ---- The plain reader: the usual answer, read without libxml2 ---------------------------
 *
 * Most answers are the plainest XML there is: an optional XML declaration (version 1.0,
 * UTF-8), then the methodResponse's elements with nothing but whitespace between them, no
 * attributes, no comments, and ASCII text with the five predefined entities at most. Those
 * this reader reads by itself, byte by byte with memchr, about three times faster than
 * libxml2's SAX2 and the callbacks above. At the least doubt (a byte outside ASCII, a
 * control character, a CR, any other entity or markup, "]]>", an unexpected tag, text where
 * an element belongs, a number as int() would not read it, a nesting deeper than
 * SCAN_DEPTH) it gives up and the libxml2 reader above reads the document from its start,
 * so what it accepts is a strict subset of what that reader accepts, with the same values
 * (tests/elasticslice/rpc/test_fast_xmlrpc_c.py compares the three readers). */

enum { SCAN_DEPTH = 100 };

typedef struct {
    const char *p, *end;
    int depth;
    PyObject **shared;
    char *buf;          /* entity-decoded text */
    size_t cap;
    PyObject *a2b;      /* binascii.a2b_base64, once base64 is met */
} Scan;

static inline int is_ws(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static inline void skip_ws(Scan *s) {
    while (s->p < s->end && is_ws(*s->p))
        s->p++;
}

/* "<name>" (1), "<name/>" (2), whitespace allowed before the ">"; else 0, nothing read.
 * (Inlined: the names are constants, and their compares then a few instructions.) */
static inline __attribute__((always_inline)) int open_tag(Scan *s, const char *name, size_t n) {
    const char *p = s->p;
    if ((size_t)(s->end - p) < n + 2 || p[0] != '<' || memcmp(p + 1, name, n) != 0)
        return 0;
    p += 1 + n;
    while (p < s->end && is_ws(*p))
        p++;
    if (p < s->end && *p == '>') {
        s->p = p + 1;
        return 1;
    }
    if (s->end - p >= 2 && p[0] == '/' && p[1] == '>') {
        s->p = p + 2;
        return 2;
    }
    return 0;
}

/* "</name>", whitespace allowed before the ">"; 1, or 0 with nothing read. */
static inline __attribute__((always_inline)) int close_tag(Scan *s, const char *name, size_t n) {
    const char *p = s->p;
    if ((size_t)(s->end - p) < n + 3 || p[0] != '<' || p[1] != '/' ||
        memcmp(p + 2, name, n) != 0)
        return 0;
    p += 2 + n;
    while (p < s->end && is_ws(*p))
        p++;
    if (p < s->end && *p == '>') {
        s->p = p + 1;
        return 1;
    }
    return 0;
}

/* The text up to the next '<' as (*out, *len), entities decoded (into s->buf when it has
 * any): 1, or 0 when it is not plain (then the document is not read here). */
static int scan_text(Scan *s, const char **out, size_t *len) {
    const char *start = s->p, *end = s->end, *lt = start;
    int amp = 0;
    for (; lt < end; lt++) {   /* one pass: to the '<', checking each byte on the way */
        unsigned char c = (unsigned char)*lt;
        if (c > '>' && c < 0x80)
            continue;
        if (c == '<')
            break;
        if (c >= 0x80 || (c < 0x20 && c != '\t' && c != '\n'))
            return 0;                    /* not ASCII; CR (XML turns it into LF); controls */
        if (c == '&')
            amp = 1;
        else if (c == '>' && lt - start >= 2 && lt[-1] == ']' && lt[-2] == ']')
            return 0;                    /* "]]>" is not allowed in text */
    }
    if (lt == end)
        return 0;
    s->p = lt;
    if (!amp) {
        *out = start;
        *len = (size_t)(lt - start);
        return 1;
    }
    size_t need = (size_t)(lt - start);
    if (need > s->cap) {
        char *buf = PyMem_Realloc(s->buf, need);
        if (buf == NULL)
            return 0;
        s->buf = buf;
        s->cap = need;
    }
    char *w = s->buf;
    for (const char *q = start; q < lt;) {
        if (*q != '&') {
            *w++ = *q++;
            continue;
        }
        size_t left = (size_t)(lt - q);
        if (left >= 4 && memcmp(q, "&lt;", 4) == 0) {
            *w++ = '<';
            q += 4;
        } else if (left >= 4 && memcmp(q, "&gt;", 4) == 0) {
            *w++ = '>';
            q += 4;
        } else if (left >= 5 && memcmp(q, "&amp;", 5) == 0) {
            *w++ = '&';
            q += 5;
        } else if (left >= 6 && memcmp(q, "&quot;", 6) == 0) {
            *w++ = '"';
            q += 6;
        } else if (left >= 6 && memcmp(q, "&apos;", 6) == 0) {
            *w++ = '\'';
            q += 6;
        } else {
            return 0;                    /* a character reference, another entity, a bare & */
        }
    }
    *out = s->buf;
    *len = (size_t)(w - s->buf);
    return 1;
}

static int all_ws(const char *v, size_t len) {
    for (size_t i = 0; i < len; i++)
        if (!is_ws(v[i]))
            return 0;
    return 1;
}

/* The text of an element opened with open_tag() (`how`: 1, or 2 for "<x/>": ""), and its
 * end tag: 1, or 0. */
static int element_text(Scan *s, int how, const char *name, size_t n, const char **out,
                        size_t *len) {
    if (how == 2) {
        *out = "";
        *len = 0;
        return 1;
    }
    return scan_text(s, out, len) && close_tag(s, name, n);
}

static PyObject *scan_value(Scan *s);

static PyObject *scan_struct(Scan *s) {
    PyObject *dict = PyDict_New();
    if (dict == NULL)
        return NULL;
    for (;;) {
        skip_ws(s);
        if (close_tag(s, "struct", 6))
            return dict;
        const char *v;
        size_t len;
        if (open_tag(s, "member", 6) != 1)
            break;
        skip_ws(s);
        int how = open_tag(s, "name", 4);
        if (!how || !element_text(s, how, "name", 4, &v, &len))
            break;
        PyObject *key = share(s->shared, v, len);
        if (key == NULL)
            break;
        skip_ws(s);
        PyObject *value = scan_value(s);
        if (value == NULL) {
            Py_DECREF(key);
            break;
        }
        int bad = PyDict_SetItem(dict, key, value) < 0;
        Py_DECREF(key);
        Py_DECREF(value);
        skip_ws(s);
        if (bad || !close_tag(s, "member", 6))
            break;
    }
    Py_DECREF(dict);
    return NULL;
}

static PyObject *scan_array(Scan *s) {
    skip_ws(s);
    int how = open_tag(s, "data", 4);
    if (!how)
        return NULL;
    PyObject *list = PyList_New(0);
    if (list == NULL)
        return NULL;
    if (how == 1) {
        for (;;) {
            skip_ws(s);
            if (close_tag(s, "data", 4))
                break;
            PyObject *value = scan_value(s);
            if (value == NULL || PyList_Append(list, value) < 0) {
                Py_XDECREF(value);
                Py_DECREF(list);
                return NULL;
            }
            Py_DECREF(value);
        }
    }
    skip_ws(s);
    if (!close_tag(s, "array", 5)) {
        Py_DECREF(list);
        return NULL;
    }
    return list;
}

/* The value of the element opened with open_tag() as <`name`> (`how`), up to its end tag. */
static PyObject *scan_typed(Scan *s, const char *name, size_t n, int how) {
    const char *v;
    size_t len;
    if (n == 6 && memcmp(name, "string", 6) == 0) {
        return element_text(s, how, "string", 6, &v, &len) ? share(s->shared, v, len) : NULL;
    }
    if (n == 6 && memcmp(name, "struct", 6) == 0)
        return how == 2 ? PyDict_New() : scan_struct(s);
    if (n == 5 && memcmp(name, "array", 5) == 0)
        return how == 1 ? scan_array(s) : NULL;
    if ((n == 3 && memcmp(name, "int", 3) == 0) || (n == 2 && memcmp(name, "i4", 2) == 0) ||
        (n == 2 && memcmp(name, "i8", 2) == 0)) {
        if (how != 1 || !element_text(s, how, name, n, &v, &len) || len == 0)
            return NULL;
        return int_of(NULL, v, len);
    }
    if (n == 7 && memcmp(name, "boolean", 7) == 0) {
        if (how != 1 || !element_text(s, how, name, n, &v, &len) || len != 1 ||
            (v[0] != '0' && v[0] != '1'))
            return NULL;
        return PyBool_FromLong(v[0] == '1');
    }
    if (n == 6 && memcmp(name, "double", 6) == 0) {
        if (how != 1 || !element_text(s, how, name, n, &v, &len) || len == 0)
            return NULL;
        return float_of(v, len);
    }
    if (n == 3 && memcmp(name, "nil", 3) == 0) {
        if (how == 1 && !close_tag(s, "nil", 3))
            return NULL;
        return Py_NewRef(Py_None);
    }
    if (n == 6 && memcmp(name, "base64", 6) == 0) {
        if (!element_text(s, how, name, n, &v, &len))
            return NULL;
        if (s->a2b == NULL) {
            PyObject *mod = PyImport_ImportModule("binascii");
            if (mod == NULL)
                return NULL;
            s->a2b = PyObject_GetAttrString(mod, "a2b_base64");
            Py_DECREF(mod);
            if (s->a2b == NULL)
                return NULL;
        }
        PyObject *raw = PyBytes_FromStringAndSize(v, (Py_ssize_t)len);
        if (raw == NULL)
            return NULL;
        PyObject *out = PyObject_CallOneArg(s->a2b, raw);   /* base64.decodebytes's */
        Py_DECREF(raw);
        return out;
    }
    return NULL;   /* dateTime.iso8601, anything else */
}

/* "<value>...</value>" at s->p. */
static PyObject *scan_value(Scan *s) {
    int how = open_tag(s, "value", 5);
    if (!how)
        return NULL;
    if (how == 2)
        return share(s->shared, "", 0);
    if (++s->depth > SCAN_DEPTH)
        return NULL;
    const char *v;
    size_t len;
    if (!scan_text(s, &v, &len))
        return NULL;
    PyObject *value = NULL;
    if (close_tag(s, "value", 5)) {
        value = share(s->shared, v, len);       /* no type: a string */
    } else {
        if (!all_ws(v, len) || s->end - s->p < 2 || s->p[1] == '/')
            return NULL;
        const char *name = s->p + 1, *q = name;
        while (q < s->end && *q != '>' && *q != '/' && !is_ws(*q))
            q++;
        size_t n = (size_t)(q - name);
        if (n == 0 || n > 16)
            return NULL;
        char tag[17];
        memcpy(tag, name, n);
        how = open_tag(s, tag, n);
        if (!how)
            return NULL;
        value = scan_typed(s, tag, n, how);
        if (value == NULL)
            return NULL;
        skip_ws(s);
        if (!close_tag(s, "value", 5)) {
            Py_DECREF(value);
            return NULL;
        }
    }
    s->depth--;
    return value;
}

/* An XML declaration at the start: version 1.0, and UTF-8 if it names an encoding. */
static int scan_declaration(Scan *s) {
    if (s->end - s->p < 6 || memcmp(s->p, "<?xml", 5) != 0 || !is_ws(s->p[5]))
        return 1;   /* none (any other "<?" is no tag of ours: the caller gives up) */
    const char *p = s->p + 5, *end = s->end;
    int version = 0;
    for (;;) {
        while (p < end && is_ws(*p))
            p++;
        if (end - p >= 2 && p[0] == '?' && p[1] == '>') {
            s->p = p + 2;
            return version;
        }
        const char *key = p;
        while (p < end && *p >= 'a' && *p <= 'z')
            p++;
        size_t klen = (size_t)(p - key);
        while (p < end && is_ws(*p))
            p++;
        if (p >= end || *p != '=')
            return 0;
        p++;
        while (p < end && is_ws(*p))
            p++;
        if (p >= end || (*p != '"' && *p != '\''))
            return 0;
        char quote = *p++;
        const char *val = p;
        while (p < end && *p != quote && *p != '<' && *p != '>')
            p++;
        if (p >= end || *p != quote)
            return 0;
        size_t vlen = (size_t)(p - val);
        p++;
        if (klen == 7 && memcmp(key, "version", 7) == 0 && !version) {
            if (vlen != 3 || memcmp(val, "1.0", 3) != 0)
                return 0;
            version = 1;
        } else if (klen == 8 && memcmp(key, "encoding", 8) == 0 && version) {
            if (vlen != 5 || (val[0] | 32) != 'u' || (val[1] | 32) != 't' ||
                (val[2] | 32) != 'f' || val[3] != '-' || val[4] != '8')
                return 0;
        } else {
            return 0;   /* standalone, or anything else: libxml2 decides */
        }
    }
}

/* The document's value, or NULL (no exception set) when the plain reader gives up. */
static PyObject *scan_document(const char *data, Py_ssize_t size) {
    Scan s = {data, data + size, 0, NULL, NULL, 0, NULL};
    PyObject *shared[SHARED] = {NULL};
    s.shared = shared;
    PyObject *result = NULL;
    if (size > 0 && data[0] == '<' && scan_declaration(&s)) {   /* (as loads(): no BOM...) */
        skip_ws(&s);
        if (open_tag(&s, "methodResponse", 14) == 1 && (skip_ws(&s), 1) &&
            open_tag(&s, "params", 6) == 1 && (skip_ws(&s), 1) &&
            open_tag(&s, "param", 5) == 1 && (skip_ws(&s), 1)) {
            result = scan_value(&s);
            if (result != NULL) {
                skip_ws(&s);
                int ok = close_tag(&s, "param", 5) && (skip_ws(&s), 1) &&
                         close_tag(&s, "params", 6) && (skip_ws(&s), 1) &&
                         close_tag(&s, "methodResponse", 14);
                skip_ws(&s);
                if (!ok || s.p != s.end)
                    Py_CLEAR(result);
            }
        }
    }
    if (result == NULL)
        PyErr_Clear();
    for (int i = 0; i < SHARED; i++)
        Py_XDECREF(shared[i]);
    PyMem_Free(s.buf);
    Py_XDECREF(s.a2b);
    return result;
}

static PyObject *fast_loads(PyObject *self, PyObject *arg) {
    (void)self;
    if (x_CtxtReadMemory == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "setup() first");
        return NULL;
    }
    if (!PyBytes_Check(arg))
        return Py_NewRef(unusual);
    const char *data = PyBytes_AS_STRING(arg);
    Py_ssize_t size = PyBytes_GET_SIZE(arg);
    if (size == 0 || size > INT_MAX || data[0] != '<')   /* (a BOM, other encodings...) */
        return Py_NewRef(unusual);
    PyObject *plain = scan_document(data, size);
    if (plain != NULL)
        return plain;
    State *s = PyMem_Calloc(1, sizeof(State));
    if (s == NULL)
        return PyErr_NoMemory();
    s->ctxt = x_NewSAXParserCtxt(&handler, NULL);
    if (s->ctxt == NULL) {
        PyMem_Free(s);
        return PyErr_NoMemory();
    }
    s->ctxt->_private = s;
    int options = XML_PARSE_NONET;
#ifdef XML_PARSE_NO_XXE
    options |= XML_PARSE_NO_XXE;
#endif
    /* (libxml2 keeps the bytes object's buffer only during the call: no Python runs that
       could change it, and bytes do not change) */
    xmlDocPtr doc = x_CtxtReadMemory(s->ctxt, data, (int)size, NULL, NULL, options);
    if (doc != NULL)
        x_FreeDoc(doc);
    xmlParserCtxtPtr c = s->ctxt;
    int clean = !s->bail && !s->errors && c->wellFormed && c->nsWellFormed && c->errNo == 0 &&
                s->done && s->depth == 0 && s->result != NULL &&
                (c->version == NULL || strcmp((const char *)c->version, "1.0") == 0) &&
                (c->encoding == NULL || ascii_ieq(c->encoding, "utf-8"));
    x_FreeParserCtxt(c);
    for (int i = 0; i < s->depth; i++)
        clear_frame(&s->frames[i]);
    for (int i = 0; i < SHARED; i++)
        Py_CLEAR(s->shared[i]);
    PyMem_Free(s->text);
    PyObject *result = s->result;
    PyMem_Free(s);
    if (!clean) {
        Py_XDECREF(result);
        return Py_NewRef(unusual);
    }
    return result;
}

static PyObject *fast_plain(PyObject *self, PyObject *arg) {
    (void)self;
    if (!PyBytes_Check(arg))
        return Py_NewRef(unusual);
    PyObject *plain = scan_document(PyBytes_AS_STRING(arg), PyBytes_GET_SIZE(arg));
    return plain != NULL ? plain : Py_NewRef(unusual);
}

static void *lookup(void *lib, const char *name) {
    void *f = dlsym(lib, name);
    if (f == NULL)
        PyErr_Format(PyExc_ImportError, "lxml's module has no %s", name);
    return f;
}

/* setup(lxml_path, libxml_version) */
static PyObject *fast_setup(PyObject *self, PyObject *args) {
    const char *path;
    int version;
    (void)self;
    if (!PyArg_ParseTuple(args, "si", &path, &version))
        return NULL;
    if (version != LIBXML_VERSION) {
        PyErr_Format(PyExc_ImportError, "built for libxml2 %d, lxml has %d", LIBXML_VERSION,
                     version);
        return NULL;
    }
    void *lib = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (lib == NULL) {
        PyErr_Format(PyExc_ImportError, "lxml's module is not loaded: %s", dlerror());
        return NULL;
    }
    if (!(x_NewSAXParserCtxt = lookup(lib, "xmlNewSAXParserCtxt")) ||
        !(x_FreeParserCtxt = lookup(lib, "xmlFreeParserCtxt")) ||
        !(x_StopParser = lookup(lib, "xmlStopParser")) ||
        !(x_FreeDoc = lookup(lib, "xmlFreeDoc")) ||
        !(x_CtxtReadMemory = lookup(lib, "xmlCtxtReadMemory"))) {
        x_CtxtReadMemory = NULL;
        return NULL;
    }
    memset(&handler, 0, sizeof(handler));
    handler.initialized = XML_SAX2_MAGIC;
    handler.startElementNs = on_start;
    handler.endElementNs = on_end;
    handler.characters = on_text;
    handler.ignorableWhitespace = on_text;
    handler.cdataBlock = on_text;
    handler.serror = on_error;
    handler.internalSubset = on_subset;
    handler.externalSubset = on_subset;
    handler.entityDecl = on_entity;
    handler.processingInstruction = on_pi;
    handler.reference = on_reference;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"setup", fast_setup, METH_VARARGS, "setup(lxml_path, libxml_version): lxml's libxml2."},
    {"loads", fast_loads, METH_O,
     "loads(data): the value of an XML-RPC methodResponse in bytes, or UNUSUAL: the\n"
     "Python reader decides."},
    {"plain", fast_plain, METH_O,
     "plain(data): the plain reader alone (no libxml2; loads() tries it first): the value,\n"
     "or UNUSUAL."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastxmlrpc", NULL, -1, methods};

PyMODINIT_FUNC PyInit__fastxmlrpc(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (unusual == NULL)
        unusual = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type);
    if (unusual == NULL || PyModule_AddObjectRef(m, "UNUSUAL", unusual) < 0 ||
        PyModule_AddIntConstant(m, "LIBXML_VERSION", LIBXML_VERSION) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
