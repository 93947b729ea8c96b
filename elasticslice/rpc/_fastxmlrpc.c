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
static PyObject *str_of(State *s, const char *v, size_t len) {
    if (len == 0 || len > SHARED_MAX)
        return PyUnicode_DecodeUTF8(v, (Py_ssize_t)len, NULL);
    size_t h = 2166136261u;
    for (size_t i = 0; i < len; i++)
        h = (h ^ (unsigned char)v[i]) * 16777619u;
    PyObject **slot = &s->shared[h % SHARED], *hit = *slot;
    if (hit != NULL && (size_t)PyUnicode_GET_LENGTH(hit) == len &&
        memcmp(PyUnicode_1BYTE_DATA(hit), v, len) == 0)
        return Py_NewRef(hit);
    PyObject *str = PyUnicode_DecodeUTF8(v, (Py_ssize_t)len, NULL);
    if (str != NULL && PyUnicode_IS_ASCII(str))   /* (its bytes are then its UTF-8) */
        Py_XSETREF(*slot, Py_NewRef(str));
    return str;
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
