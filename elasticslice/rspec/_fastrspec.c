/* The RSpec reader of elasticslice.rspec.parse, in C: the same state machine as its
 * _RSpecTarget, run inside libxml2's SAX2 callbacks, so that no Python runs per element.
 *
 * libxml2 is lxml's own copy (lxml links it in statically and exports its symbols): the
 * functions are looked up in lxml's module at setup, and this file is compiled against the
 * headers lxml ships (lxml/includes), so it reads with the very library and options the
 * Python reader uses. setup() refuses a libxml2 other than the one compiled against.
 *
 * parse(data) returns the RSpec, or None whenever the Python reader should decide: any
 * error or warning from libxml2, a DOCTYPE or entity declaration, an attribute value this
 * reader does not read exactly as the Python one would (non-ASCII where it strips or reads
 * a number), an exception in the root callback. The caller then runs the Python reader,
 * which raises the one-line error or returns the same records. Built by
 * elasticslice/rspec/fastbuild.py; optional (the Python reader alone gives the same records).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
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

static const char NS_V3[] = "http://www.geni.net/resources/rspec/3";
static const char NS_V2[] = "http://www.protogeni.net/resources/rspec/2";
static const char NS_EMULAB[] = "http://www.protogeni.net/resources/rspec/ext/emulab/1";

/* The records' classes, their fields' slot descriptors (in field order) and the others
 * setup() is given. */
enum { N_FIELDS = 19, I_FIELDS = 6, L_FIELDS = 4, K_FIELDS = 8 };
enum { F_CLIENT, F_COMPONENT, F_CM, F_NAME, F_SLIVER, F_EXCLUSIVE, F_HW, F_SLIVER_TYPE,
       F_IMAGE, F_HOSTNAME, F_IPV4, F_LOGINS, F_IFACES, F_AVAILABLE, F_INSTALLS, F_EXECUTES,
       F_ROUTABLE, F_HW_TYPES, F_IMAGES };
enum { IF_CLIENT, IF_IP, IF_NETMASK, IF_MAC, IF_SLIVER, IF_COMPONENT };
enum { K_CLIENT, K_SLIVER, K_IFACES, K_TYPE, K_VLAN_TAGGING, K_MULTIPLEXING, K_BEST_EFFORT,
       K_VLANTAG };
static PyTypeObject *node_cls, *iface_cls, *login_cls, *link_cls;
static PyObject *node_d[N_FIELDS], *iface_d[I_FIELDS], *login_d[L_FIELDS], *link_d[K_FIELDS];
static Py_ssize_t node_o[N_FIELDS], iface_o[I_FIELDS], login_o[L_FIELDS], link_o[K_FIELDS];
static PyObject *root_fn, *aliases, *empty_tuple;

enum { KIND_NONE = -1, KIND_HW, KIND_IFACE, KIND_SLIVER, KIND_AVAILABLE, KIND_SERVICES,
       KIND_HOST, KIND_ROUTABLE, KIND_VNODE };

enum { SHARED = 64 };

typedef struct {
    xmlParserCtxtPtr ctxt;
    int depth;
    int bail;               /* the Python reader decides */
    int errors;             /* libxml2 reported something */
    const char *ns;         /* the RSpec's namespace (NS_V3 or NS_V2) once the root is read */
    PyObject *rspec, *nodes, *links;         /* owned */
    PyObject *total, *free;                  /* an advertisement's nodes by type (owned) */
    int in_node;
    PyObject *nf[N_FIELDS];                  /* the node being read: its fields, owned */
    PyObject *vnode[3];                      /* emulab:vnode's name, hardware_type, image */
    int kind3;
    int vnodes;                              /* emulab:vnode elements read */
    PyObject *iface;                         /* the node's last interface (owned) */
    int default_image;
    PyObject *link;                          /* the link being read (owned) */
    PyObject *shared[SHARED];                /* values met before: see shared() */
} State;

static void bail(State *s) {
    if (!s->bail) {
        s->bail = 1;
        x_StopParser(s->ctxt);
    }
}

/* The value of the attribute `name` without a namespace, as (pointer, length); 0 if absent. */
static int attr(const xmlChar **a, int n, const char *name, const char **v, Py_ssize_t *len) {
    for (int i = 0; i < n; i++, a += 5) {
        if (a[2] == NULL && strcmp((const char *)a[0], name) == 0) {
            *v = (const char *)a[3];
            *len = (Py_ssize_t)(a[4] - a[3]);
            return 1;
        }
    }
    return 0;
}

/* a.get(name): a new str, or None (new reference); NULL on error. */
static PyObject *get(const xmlChar **a, int n, const char *name) {
    const char *v;
    Py_ssize_t len;
    if (!attr(a, n, name, &v, &len))
        Py_RETURN_NONE;
    return PyUnicode_DecodeUTF8(v, len, NULL);
}

/* The str of a value that many elements repeat (a CM's URN, hardware types, images,
 * logins' user, commands): the same object again when it was met before, from a small
 * table keyed by length and last bytes. Fewer objects to make, keep and free (the Python
 * reader makes one per attribute: equal values, as records compare them). */
static PyObject *shared(State *s, const char *v, Py_ssize_t len) {
    if (len == 0 || len > 256)
        return PyUnicode_DecodeUTF8(v, len, NULL);
    size_t key = (size_t)len * 31u + (unsigned char)v[len - 1] * 7u +
                 (unsigned char)v[len / 2] * 3u + (unsigned char)v[(len * 3) / 4];
    PyObject **slot = &s->shared[key % SHARED], *hit = *slot;
    if (hit != NULL && PyUnicode_GET_LENGTH(hit) == len &&
        memcmp(PyUnicode_1BYTE_DATA(hit), v, len) == 0)
        return Py_NewRef(hit);
    PyObject *str = PyUnicode_DecodeUTF8(v, len, NULL);
    if (str != NULL && PyUnicode_IS_ASCII(str))   /* (its bytes are then its UTF-8) */
        Py_XSETREF(*slot, Py_NewRef(str));
    return str;
}

static PyObject *get_shared(State *s, const xmlChar **a, int n, const char *name) {
    const char *v;
    Py_ssize_t len;
    if (!attr(a, n, name, &v, &len))
        Py_RETURN_NONE;
    return shared(s, v, len);
}

/* a.get(first) or a.get(second), as Python's `or` reads it (an empty first falls through). */
static PyObject *get_or(State *s, const xmlChar **a, int n, const char *first,
                        const char *second) {
    const char *v;
    Py_ssize_t len;
    if (attr(a, n, first, &v, &len) && len > 0)
        return shared(s, v, len);
    return get_shared(s, a, n, second);
}

/* ASCII-stripped bounds of a value; -1 if it holds a non-ASCII byte (str.strip() strips
 * Unicode spaces too: the Python reader decides those). */
static int strip(const char **v, Py_ssize_t *len) {
    const char *p = *v, *e = *v + *len;
    for (const char *q = p; q < e; q++)
        if ((unsigned char)*q >= 0x80)
            return -1;
    while (p < e && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r' || *p == '\v' ||
                     *p == '\f'))
        p++;
    while (e > p && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\n' || e[-1] == '\r' ||
                     e[-1] == '\v' || e[-1] == '\f'))
        e--;
    *v = p;
    *len = e - p;
    return 0;
}

/* _BOOL.get(value): 1, 0, or -1 (not a boolean word: None). */
static int boolword(const char *v, Py_ssize_t len) {
#define IS(w) (len == (Py_ssize_t)sizeof(w) - 1 && memcmp(v, w, len) == 0)
    if (IS("true") || IS("1") || IS("True") || IS("yes"))
        return 1;
    if (IS("false") || IS("0") || IS("False") || IS("no"))
        return 0;
    return -1;
#undef IS
}

static PyObject *bool_or_none(int b) {
    if (b < 0)
        Py_RETURN_NONE;
    return PyBool_FromLong(b);
}

/* None if the attribute is absent, else _BOOL.get(value.strip()); NULL: bail. */
static PyObject *get_bool(const xmlChar **a, int n, const char *name, int absent_is_true,
                          State *s) {
    const char *v;
    Py_ssize_t len;
    if (!attr(a, n, name, &v, &len)) {
        if (absent_is_true)
            Py_RETURN_TRUE;
        Py_RETURN_NONE;
    }
    if (strip(&v, &len) < 0) {
        bail(s);
        return NULL;
    }
    int b = boolword(v, len);
    if (b < 0 && absent_is_true)
        Py_RETURN_TRUE;   /* _link_child: _bool() None (not a word) counts as enabled */
    return bool_or_none(b);
}

/* A record of `cls` with `values` (references stolen, n of them) in its slots, as its
 * __init__ would leave it (which only assigns them: setup() checks the fields are plain
 * object slots) without running it. */
static PyObject *record(PyTypeObject *cls, Py_ssize_t *offsets, PyObject **values, int n) {
    PyObject *obj = NULL;
    int ok = 1;
    for (int i = 0; i < n; i++)
        ok = ok && values[i] != NULL;
    if (ok)
        obj = cls->tp_alloc(cls, 0);
    for (int i = 0; i < n; i++) {
        if (obj != NULL) {
            *(PyObject **)((char *)obj + offsets[i]) = values[i];
            if (PyList_CheckExact(values[i]))
                PyObject_GC_UnTrack(values[i]);
        } else {
            Py_XDECREF(values[i]);
        }
        values[i] = NULL;
    }
    if (obj != NULL)
        PyObject_GC_UnTrack(obj);
    return obj;
}

static int set_slot(PyObject *obj, PyObject *descr, PyObject *value) {
    if (value == NULL)
        return -1;
    int r = Py_TYPE(descr)->tp_descr_set(descr, obj, value);
    Py_DECREF(value);
    return r;
}

static int append(PyObject *list, PyObject *item) {
    if (item == NULL)
        return -1;
    int r = PyList_Append(list, item);
    Py_DECREF(item);
    return r;
}

static void clear_node(State *s) {
    for (int i = 0; i < N_FIELDS; i++)
        Py_CLEAR(s->nf[i]);
    for (int i = 0; i < 3; i++)
        Py_CLEAR(s->vnode[i]);
    Py_CLEAR(s->iface);
    s->in_node = 0;
}

/* `a or b`, both references stolen: a if it is true, else b (the other is released). */
static PyObject *or_(PyObject *a, PyObject *b) {
    if (PyObject_IsTrue(a)) {
        Py_DECREF(b);
        return a;
    }
    Py_DECREF(a);
    return b;
}

/* The value of a slot (new reference). */
static PyObject *slot(PyObject *obj, PyObject *descr) {
    return Py_TYPE(descr)->tp_descr_get(descr, obj, (PyObject *)Py_TYPE(obj));
}

static int add_one(PyObject *counts, PyObject *key) {
    PyObject *now = PyDict_GetItemWithError(counts, key);
    if (now == NULL && PyErr_Occurred())
        return -1;
    PyObject *next = PyLong_FromSsize_t(now == NULL ? 1 : PyLong_AsSsize_t(now) + 1);
    if (next == NULL)
        return -1;
    int r = PyDict_SetItem(counts, key, next);
    Py_DECREF(next);
    return r;
}

/* parse._count's tallies, node by node: each of its types, and the available ones. */
static int count(State *s, PyObject *types, int available) {
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(types); i++) {
        PyObject *name = PyList_GET_ITEM(types, i);
        if (add_one(s->total, name) < 0 || (available && add_one(s->free, name) < 0))
            return -1;
    }
    return 0;
}

/* _RSpecTarget's finish_node, then the record itself. */
static int finish_node(State *s) {
    PyObject **nf = s->nf;
    s->in_node = 0;
    if (PyList_GET_SIZE(nf[F_HW_TYPES]) > 0) {
        PyObject *first = PyList_GET_ITEM(nf[F_HW_TYPES], 0);
        Py_INCREF(first);
        Py_SETREF(nf[F_HW], first);
    }
    if (s->vnode[0] != NULL) {
        nf[F_NAME] = or_(nf[F_NAME], Py_NewRef(s->vnode[0]));
        nf[F_HW] = or_(nf[F_HW], Py_NewRef(s->vnode[1]));
        nf[F_IMAGE] = or_(nf[F_IMAGE], Py_NewRef(s->vnode[2]));
    }
    for (int i = 0; i < 3; i++)
        Py_CLEAR(s->vnode[i]);
    Py_CLEAR(s->iface);
    if (s->total != NULL && count(s, nf[F_HW_TYPES], nf[F_AVAILABLE] == Py_True) < 0)
        return -1;
    return append(s->nodes, record(node_cls, node_o, nf, N_FIELDS));
}

static int start_node(State *s, const xmlChar **a, int n) {
    PyObject **nf = s->nf;
    nf[F_CLIENT] = get(a, n, "client_id");
    nf[F_COMPONENT] = get(a, n, "component_id");
    nf[F_CM] = get_shared(s, a, n, "component_manager_id");
    nf[F_NAME] = get(a, n, "component_name");
    nf[F_SLIVER] = get(a, n, "sliver_id");
    nf[F_EXCLUSIVE] = get_bool(a, n, "exclusive", 0, s);
    for (int i = F_HW; i <= F_IPV4; i++)
        nf[i] = Py_NewRef(Py_None);
    nf[F_AVAILABLE] = Py_NewRef(Py_None);
    nf[F_ROUTABLE] = Py_NewRef(Py_False);
    nf[F_LOGINS] = PyList_New(0);
    nf[F_IFACES] = PyList_New(0);
    nf[F_INSTALLS] = PyList_New(0);
    nf[F_EXECUTES] = PyList_New(0);
    nf[F_HW_TYPES] = PyList_New(0);
    nf[F_IMAGES] = PyList_New(0);
    s->in_node = 1;
    for (int i = 0; i < N_FIELDS; i++)
        if (nf[i] == NULL)
            return -1;
    return 0;
}

static int start_link(State *s, const xmlChar **a, int n) {
    PyObject *v[K_FIELDS] = {get(a, n, "client_id"), get(a, n, "sliver_id"), PyList_New(0),
                             Py_NewRef(Py_None), Py_NewRef(Py_None), Py_NewRef(Py_None),
                             Py_NewRef(Py_None), get(a, n, "vlantag")};
    s->link = record(link_cls, link_o, v, K_FIELDS);
    if (s->link == NULL)
        return -1;
    return PyList_Append(s->links, s->link);
}

static int kind_of(State *s, const xmlChar *uri, const char *local) {
    if (uri == NULL)
        return KIND_NONE;
    if (strcmp((const char *)uri, s->ns) == 0) {
        switch (local[0]) {
        case 'h':
            return strcmp(local, "hardware_type") == 0 ? KIND_HW :
                   strcmp(local, "host") == 0 ? KIND_HOST : KIND_NONE;
        case 'i':
            return strcmp(local, "interface") == 0 ? KIND_IFACE : KIND_NONE;
        case 's':
            return strcmp(local, "sliver_type") == 0 ? KIND_SLIVER :
                   strcmp(local, "services") == 0 ? KIND_SERVICES : KIND_NONE;
        case 'a':
            return strcmp(local, "available") == 0 ? KIND_AVAILABLE : KIND_NONE;
        }
        return KIND_NONE;
    }
    if (strcmp((const char *)uri, NS_EMULAB) == 0) {
        if (strcmp(local, "routable_control_ip") == 0)
            return KIND_ROUTABLE;
        if (strcmp(local, "vnode") == 0)
            return KIND_VNODE;
    }
    return KIND_NONE;
}

static int in_ns(const xmlChar *uri, const char *ns) {
    return uri != NULL && strcmp((const char *)uri, ns) == 0;
}

/* A node's child (depth 3). */
static int node_child(State *s, const xmlChar *uri, const char *local, const xmlChar **a,
                      int n) {
    PyObject **nf = s->nf;
    int kind = s->kind3 = kind_of(s, uri, local);
    switch (kind) {
    case KIND_HW: {
        const char *v;
        Py_ssize_t len;
        if (attr(a, n, "name", &v, &len) && len > 0)
            return append(nf[F_HW_TYPES], shared(s, v, len));
        return 0;
    }
    case KIND_IFACE: {
        PyObject *v[I_FIELDS] = {get(a, n, "client_id"), Py_NewRef(Py_None),
                                 Py_NewRef(Py_None), get(a, n, "mac_address"),
                                 get(a, n, "sliver_id"), get(a, n, "component_id")};
        Py_XSETREF(s->iface, record(iface_cls, iface_o, v, I_FIELDS));
        if (s->iface == NULL)
            return -1;
        return PyList_Append(nf[F_IFACES], s->iface);
    }
    case KIND_SLIVER: {
        PyObject *name = get_shared(s, a, n, "name");
        if (name == NULL)
            return -1;
        if (name != Py_None) {
            PyObject *alias = PyDict_GetItemWithError(aliases, name);
            if (alias == NULL && PyErr_Occurred())
                return -1;
            if (alias != NULL) {
                Py_INCREF(alias);
                Py_SETREF(name, alias);
            }
        }
        Py_SETREF(nf[F_SLIVER_TYPE], name);
        s->default_image = 0;
        return 0;
    }
    case KIND_AVAILABLE: {
        PyObject *b = get_bool(a, n, "now", 0, s);
        if (b == NULL)
            return -1;
        Py_SETREF(nf[F_AVAILABLE], b);
        return 0;
    }
    case KIND_HOST: {
        PyObject *name = get(a, n, "name"), *ipv4 = get(a, n, "ipv4");
        if (name == NULL || ipv4 == NULL) {
            Py_XDECREF(name);
            Py_XDECREF(ipv4);
            return -1;
        }
        Py_SETREF(nf[F_HOSTNAME], name);
        Py_SETREF(nf[F_IPV4], ipv4);
        return 0;
    }
    case KIND_ROUTABLE:
        Py_SETREF(nf[F_ROUTABLE], Py_NewRef(Py_True));
        return 0;
    case KIND_VNODE:
        s->vnodes++;
        for (int i = 0; i < 3; i++)
            Py_CLEAR(s->vnode[i]);
        s->vnode[0] = get(a, n, "name");
        s->vnode[1] = get_shared(s, a, n, "hardware_type");
        s->vnode[2] = get_shared(s, a, n, "disk_image");
        return s->vnode[0] && s->vnode[1] && s->vnode[2] ? 0 : -1;
    }
    return 0;   /* services: read at depth 4; others: not read */
}

/* A pair of attributes, each `or ""`. */
static PyObject *pair(State *s, const xmlChar **a, int n, const char *first,
                      const char *second) {
    PyObject *x = get_shared(s, a, n, first), *y = get_shared(s, a, n, second);
    if (x == NULL || y == NULL) {
        Py_XDECREF(x);
        Py_XDECREF(y);
        return NULL;
    }
    PyObject *empty = PyUnicode_FromStringAndSize("", 0);
    if (empty == NULL) {
        Py_DECREF(x);
        Py_DECREF(y);
        return NULL;
    }
    x = or_(x, Py_NewRef(empty));
    y = or_(y, Py_NewRef(empty));
    Py_DECREF(empty);
    PyObject *t = PyTuple_Pack(2, x, y);
    Py_DECREF(x);
    Py_DECREF(y);
    return t;
}

/* A node's grandchild (depth 4). */
static int node_grandchild(State *s, const xmlChar *uri, const char *local, const xmlChar **a,
                           int n) {
    PyObject **nf = s->nf;
    if (!in_ns(uri, s->ns))
        return 0;
    if (s->kind3 == KIND_SLIVER) {
        if (strcmp(local, "disk_image") != 0)
            return 0;
        const char *v;
        Py_ssize_t len;
        /* _BOOL.get(a.get("default", "")) is True: no strip here */
        int is_default = attr(a, n, "default", &v, &len) && boolword(v, len) == 1;
        if (nf[F_IMAGE] == Py_None || (is_default && !s->default_image)) {
            PyObject *image = get_or(s, a, n, "name", "url");
            if (image == NULL)
                return -1;
            Py_SETREF(nf[F_IMAGE], image);
            s->default_image = is_default;
        }
    } else if (s->kind3 == KIND_IFACE) {
        if (strcmp(local, "ip") != 0 || s->iface == NULL)
            return 0;
        PyObject *ip = slot(s->iface, iface_d[IF_IP]);
        if (ip == NULL)
            return -1;
        int unset = ip == Py_None;
        Py_DECREF(ip);
        if (unset && (set_slot(s->iface, iface_d[IF_IP], get(a, n, "address")) < 0 ||
                      set_slot(s->iface, iface_d[IF_NETMASK], get_shared(s, a, n, "netmask")) < 0))
            return -1;
    } else if (s->kind3 == KIND_SERVICES) {
        if (strcmp(local, "login") == 0) {
            const char *v;
            Py_ssize_t len;
            PyObject *port;
            if (attr(a, n, "port", &v, &len)) {
                if (strip(&v, &len) < 0) {
                    bail(s);
                    return -1;
                }
                int digits = len > 0;
                for (Py_ssize_t i = 0; i < len; i++)
                    digits = digits && v[i] >= '0' && v[i] <= '9';
                if (digits) {
                    char buf[64];
                    if (len >= (Py_ssize_t)sizeof(buf)) {
                        bail(s);
                        return -1;
                    }
                    memcpy(buf, v, len);
                    buf[len] = 0;
                    port = PyLong_FromString(buf, NULL, 10);
                } else {
                    port = Py_NewRef(Py_None);
                }
            } else {
                port = Py_NewRef(Py_None);
            }
            PyObject *vals[L_FIELDS] = {get_shared(s, a, n, "username"),
                                        get(a, n, "hostname"), port,
                                        get_shared(s, a, n, "authentication")};
            return append(nf[F_LOGINS], record(login_cls, login_o, vals, L_FIELDS));
        }
        if (strcmp(local, "execute") == 0)
            return append(nf[F_EXECUTES], pair(s, a, n, "shell", "command"));
        if (strcmp(local, "install") == 0)
            return append(nf[F_INSTALLS], pair(s, a, n, "url", "install_path"));
    }
    return 0;
}

/* A link's child (depth 3): _RSpecTarget's interface_ref and _link_child. */
static int link_child(State *s, const xmlChar *uri, const char *local, const xmlChar **a,
                      int n) {
    if (in_ns(uri, s->ns)) {
        if (strcmp(local, "interface_ref") == 0) {
            const char *v;
            Py_ssize_t len;
            PyObject *ref = attr(a, n, "client_id", &v, &len) && len > 0 ?
                PyUnicode_DecodeUTF8(v, len, NULL) : get(a, n, "component_id");
            if (ref == NULL)
                return -1;
            int t = PyObject_IsTrue(ref);
            if (t) {
                PyObject *ifaces = slot(s->link, link_d[K_IFACES]);
                if (ifaces == NULL) {
                    Py_DECREF(ref);
                    return -1;
                }
                int r = PyList_Append(ifaces, ref);
                Py_DECREF(ifaces);
                Py_DECREF(ref);
                return r;
            }
            Py_DECREF(ref);
            return 0;
        }
        if (strcmp(local, "link_type") == 0)
            return set_slot(s->link, link_d[K_TYPE], get_shared(s, a, n, "name"));
        return 0;
    }
    if (in_ns(uri, NS_EMULAB)) {
        int slot = strcmp(local, "vlan_tagging") == 0 ? K_VLAN_TAGGING :
                   strcmp(local, "link_multiplexing") == 0 ? K_MULTIPLEXING :
                   strcmp(local, "best_effort") == 0 ? K_BEST_EFFORT : -1;
        if (slot < 0)
            return 0;
        PyObject *b = get_bool(a, n, "enabled", 1, s);
        return b == NULL ? -1 : set_slot(s->link, link_d[slot], b);
    }
    return 0;
}

/* The root: _root() in Python (the RSpec record, or the exception that says what is wrong). */
static int root(State *s, const xmlChar *local, const xmlChar *uri, const xmlChar **a,
                int n) {
    PyObject *tag = uri ? PyUnicode_FromFormat("{%s}%s", uri, local) :
                          PyUnicode_FromString((const char *)local);
    PyObject *attrib = PyDict_New();
    if (tag == NULL || attrib == NULL)
        goto fail;
    for (int i = 0; i < n; i++, a += 5) {
        PyObject *k = a[2] ? PyUnicode_FromFormat("{%s}%s", a[2], a[0]) :
                             PyUnicode_FromString((const char *)a[0]);
        PyObject *v = PyUnicode_DecodeUTF8((const char *)a[3], a[4] - a[3], NULL);
        int r = k && v ? PyDict_SetItem(attrib, k, v) : -1;
        Py_XDECREF(k);
        Py_XDECREF(v);
        if (r < 0)
            goto fail;
    }
    PyObject *rspec = PyObject_CallFunctionObjArgs(root_fn, tag, attrib, NULL);
    Py_CLEAR(tag);
    Py_CLEAR(attrib);
    if (rspec == NULL)
        return -1;
    s->rspec = rspec;
    s->ns = in_ns(uri, NS_V3) ? NS_V3 : NS_V2;   /* _root accepted one of the two */
    s->nodes = PyObject_GetAttrString(rspec, "nodes");
    s->links = PyObject_GetAttrString(rspec, "links");
    PyObject *type = PyObject_GetAttrString(rspec, "type");
    if (s->nodes == NULL || s->links == NULL || type == NULL) {
        Py_XDECREF(type);
        return -1;
    }
    int ad = PyUnicode_Check(type) && PyUnicode_CompareWithASCIIString(type, "advertisement") == 0;
    Py_DECREF(type);
    if (ad) {   /* counted as they are read, handed over as parse._count's inputs */
        s->total = PyDict_New();
        s->free = PyDict_New();
        if (s->total == NULL || s->free == NULL ||
            PyObject_SetAttrString(rspec, "total_by_type", s->total) < 0 ||
            PyObject_SetAttrString(rspec, "available_by_type", s->free) < 0)
            return -1;
    }
    return 0;
fail:
    Py_XDECREF(tag);
    Py_XDECREF(attrib);
    return -1;
}

static void on_start(void *ctx, const xmlChar *localname, const xmlChar *prefix,
                     const xmlChar *uri, int nb_namespaces, const xmlChar **namespaces,
                     int nb_attributes, int nb_defaulted, const xmlChar **a) {
    State *s = ((xmlParserCtxtPtr)ctx)->_private;
    const char *local = (const char *)localname;
    int depth = ++s->depth, r = 0;
    (void)prefix, (void)nb_namespaces, (void)namespaces;
    if (s->bail)
        return;
    if (nb_defaulted != 0) {   /* attributes from a DTD: there is none in an RSpec */
        bail(s);
        return;
    }
    if (depth == 3) {
        if (s->in_node)
            r = node_child(s, uri, local, a, nb_attributes);
        else if (s->link != NULL)
            r = link_child(s, uri, local, a, nb_attributes);
    } else if (depth == 4) {
        if (s->in_node)
            r = node_grandchild(s, uri, local, a, nb_attributes);
    } else if (depth == 2) {
        if (s->in_node)
            r = finish_node(s);
        Py_CLEAR(s->link);
        if (r == 0 && in_ns(uri, s->ns)) {
            if (strcmp(local, "node") == 0) {
                s->default_image = 0;   /* (the Python reader carries it over; a node's
                                           sliver_type resets it before it is read) */
                r = start_node(s, a, nb_attributes);
            } else if (strcmp(local, "link") == 0) {
                r = start_link(s, a, nb_attributes);
            }
        }
    } else if (depth == 1) {
        r = root(s, localname, uri, a, nb_attributes);
    }
    if (r < 0) {
        PyErr_Clear();
        bail(s);
    }
}

static void on_end(void *ctx, const xmlChar *localname, const xmlChar *prefix,
                   const xmlChar *uri) {
    State *s = ((xmlParserCtxtPtr)ctx)->_private;
    (void)localname, (void)prefix, (void)uri;
    s->depth--;
}

static void on_error(void *ctx, const xmlError *error) {
    xmlParserCtxtPtr ctxt = ctx;
    State *s = ctxt->_private;
    (void)error;
    s->errors++;
    bail(s);
}

/* DOCTYPE, entity declarations: refused by the Python reader, with its line. */
static void on_subset(void *ctx, const xmlChar *name, const xmlChar *eid, const xmlChar *sid) {
    State *s = ((xmlParserCtxtPtr)ctx)->_private;
    (void)name, (void)eid, (void)sid;
    bail(s);
}

static void on_entity(void *ctx, const xmlChar *name, int type, const xmlChar *pid,
                      const xmlChar *sid, xmlChar *content) {
    State *s = ((xmlParserCtxtPtr)ctx)->_private;
    (void)name, (void)type, (void)pid, (void)sid, (void)content;
    bail(s);
}

static xmlSAXHandler handler;

static PyObject *fast_parse(PyObject *self, PyObject *args) {
    PyObject *arg;
    int with_vnodes = 0;
    (void)self;
    if (!PyArg_ParseTuple(args, "O|p", &arg, &with_vnodes))
        return NULL;
    if (root_fn == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "setup() first");
        return NULL;
    }
    Py_buffer buf;
    if (PyObject_GetBuffer(arg, &buf, PyBUF_SIMPLE) < 0)
        return NULL;
    if (buf.len > INT_MAX) {
        PyBuffer_Release(&buf);
        Py_RETURN_NONE;
    }
    State s;
    memset(&s, 0, sizeof(s));
    s.ctxt = x_NewSAXParserCtxt(&handler, NULL);
    if (s.ctxt == NULL) {
        PyBuffer_Release(&buf);
        return PyErr_NoMemory();
    }
    s.ctxt->_private = &s;
    int options = XML_PARSE_NONET | XML_PARSE_NOENT;
#ifdef XML_PARSE_NO_XXE
    options |= XML_PARSE_NO_XXE;
#endif
    xmlDocPtr doc = x_CtxtReadMemory(s.ctxt, buf.buf, (int)buf.len, NULL, NULL, options);
    if (doc != NULL)
        x_FreeDoc(doc);
    if (!s.bail && s.in_node && finish_node(&s) < 0) {
        PyErr_Clear();
        s.bail = 1;
    }
    int clean = !s.bail && !s.errors && s.ctxt->wellFormed && s.ctxt->nsWellFormed &&
                s.ctxt->errNo == 0 && s.rspec != NULL && s.depth == 0;
    x_FreeParserCtxt(s.ctxt);
    PyBuffer_Release(&buf);
    clear_node(&s);
    Py_CLEAR(s.link);
    Py_CLEAR(s.nodes);
    Py_CLEAR(s.links);
    Py_CLEAR(s.total);
    Py_CLEAR(s.free);
    for (int i = 0; i < SHARED; i++)
        Py_CLEAR(s.shared[i]);
    if (!clean) {
        Py_CLEAR(s.rspec);
        Py_RETURN_NONE;
    }
    if (with_vnodes) {
        PyObject *pair = Py_BuildValue("(Ni)", s.rspec, s.vnodes);
        return pair;
    }
    return s.rspec;
}

/* The slot descriptors of `cls`'s fields `names` (n of them), and their offsets. */
static int descriptors(PyObject *cls, PyObject *names, PyObject **out, Py_ssize_t *offsets,
                       Py_ssize_t n) {
    if (!PyType_Check(cls) || !PyTuple_Check(names) || PyTuple_GET_SIZE(names) != n) {
        PyErr_SetString(PyExc_TypeError, "setup: a class and a tuple of its field names");
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *d = PyObject_GetAttr(cls, PyTuple_GET_ITEM(names, i));
        if (d == NULL)
            return -1;
        PyMemberDef *m = Py_IS_TYPE(d, &PyMemberDescr_Type) ?
            ((PyMemberDescrObject *)d)->d_member : NULL;
        if (m == NULL || m->type != T_OBJECT_EX || (m->flags & READONLY) ||
            ((PyTypeObject *)cls)->tp_init == PyBaseObject_Type.tp_init) {
            Py_DECREF(d);
            PyErr_SetString(PyExc_ImportError, "setup: a field is not a plain slot");
            return -1;
        }
        offsets[i] = m->offset;
        Py_XSETREF(out[i], d);
    }
    return 0;
}

static void *lookup(void *lib, const char *name) {
    void *f = dlsym(lib, name);
    if (f == NULL)
        PyErr_Format(PyExc_ImportError, "lxml's module has no %s", name);
    return f;
}

/* setup(lxml_path, libxml_version, root, aliases, (Node, fields), (Interface, fields),
 *       (Login, fields), (Link, fields)) */
static PyObject *fast_setup(PyObject *self, PyObject *args) {
    const char *path;
    int version;
    PyObject *rootf, *al, *c[4], *f[4];
    (void)self;
    if (!PyArg_ParseTuple(args, "siOO!(OO)(OO)(OO)(OO)", &path, &version, &rootf, &PyDict_Type,
                          &al, &c[0], &f[0], &c[1], &f[1], &c[2], &f[2], &c[3], &f[3]))
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
        !(x_CtxtReadMemory = lookup(lib, "xmlCtxtReadMemory")) ||
        !(x_FreeParserCtxt = lookup(lib, "xmlFreeParserCtxt")) ||
        !(x_StopParser = lookup(lib, "xmlStopParser")) ||
        !(x_FreeDoc = lookup(lib, "xmlFreeDoc")))
        return NULL;
    if (descriptors(c[0], f[0], node_d, node_o, N_FIELDS) < 0 ||
        descriptors(c[1], f[1], iface_d, iface_o, I_FIELDS) < 0 ||
        descriptors(c[2], f[2], login_d, login_o, L_FIELDS) < 0 ||
        descriptors(c[3], f[3], link_d, link_o, K_FIELDS) < 0)
        return NULL;
    PyTypeObject **classes[4] = {&node_cls, &iface_cls, &login_cls, &link_cls};
    for (int i = 0; i < 4; i++) {
        Py_INCREF(c[i]);
        Py_XSETREF(*classes[i], (PyTypeObject *)c[i]);
    }
    Py_INCREF(al);
    Py_XSETREF(aliases, al);
    Py_INCREF(rootf);
    Py_XSETREF(root_fn, rootf);
    memset(&handler, 0, sizeof(handler));
    handler.initialized = XML_SAX2_MAGIC;
    handler.startElementNs = on_start;
    handler.endElementNs = on_end;
    handler.serror = on_error;
    handler.internalSubset = on_subset;
    handler.externalSubset = on_subset;
    handler.entityDecl = on_entity;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"setup", fast_setup, METH_VARARGS, "Give the reader lxml's libxml2 and the records."},
    {"parse", fast_parse, METH_VARARGS,
     "parse(data, with_vnodes=False): an RSpec from bytes (with_vnodes: and how many\n"
     "emulab:vnode elements it has), or None: the Python reader decides."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastrspec", NULL, -1, methods};

PyMODINIT_FUNC PyInit__fastrspec(void) {
    empty_tuple = PyTuple_New(0);
    if (empty_tuple == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "LIBXML_VERSION", LIBXML_VERSION) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
