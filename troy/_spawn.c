/* A unit's process, run to its end without the GIL: troy.execution's _run_process in C.
 *
 * run() starts the process with vfork and exec (nothing of this process is copied; see
 * spawn()), in a session of its own, in its working directory, with the signals Python
 * ignores (SIGPIPE, SIGXFSZ) back to their defaults and every descriptor above 2 closed,
 * as subprocess.Popen(start_new_session=True) does; tells `started` its pid (with the GIL,
 * so that a cancel can kill it); then, with the GIL released, reads its stdout and stderr
 * pipes keeping their last `tail` bytes, watches its exit through a pidfd (a background
 * process left holding the pipes does not keep the unit from ending: at most 256 more
 * reads per pipe), kills its process group when `timeout` passes, and reaps it. Two units
 * run by two threads of one process then run side by side, as two processes would.
 *
 * run_batch() runs a bundle's members one after another the same way, in one call: no
 * Python runs between two members but the hooks that see each process start and may stop
 * the batch (a cancel), so a bundle of short processes costs what its processes cost.
 *
 * Built by troy/native.py; optional: troy.execution runs units through subprocess where
 * it is not built, with the same results.
 */
/* _GNU_SOURCE (vfork, close_range's number): Python.h defines it */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <pthread.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

enum { CHUNK = 65536, DRAIN_CHUNKS = 256 };

typedef struct {
    int fd;          /* read end, -1 when closed or not a pipe */
    char *buf;       /* a ring of `cap` bytes */
    size_t cap, start, len;
    unsigned long long size;
} Tail;

static void tail_add(Tail *t, const char *data, size_t n) {
    t->size += n;
    if (t->cap == 0)
        return;
    if (n >= t->cap) {   /* only the last cap bytes of it matter */
        memcpy(t->buf, data + n - t->cap, t->cap);
        t->start = 0;
        t->len = t->cap;
        return;
    }
    for (size_t i = 0; i < n;) {
        size_t at = (t->start + t->len) % t->cap, room = t->cap - at, take = n - i;
        if (take > room)
            take = room;
        memcpy(t->buf + at, data + i, take);
        i += take;
        t->len += take;
        if (t->len > t->cap) {
            t->start = (t->start + t->len - t->cap) % t->cap;
            t->len = t->cap;
        }
    }
}

static PyObject *tail_bytes(Tail *t) {
    if (t->fd == -2 || t->size == 0)   /* -2: not a pipe of ours */
        Py_RETURN_NONE;
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)t->len);
    if (out == NULL)
        return NULL;
    char *p = PyBytes_AS_STRING(out);
    size_t first = t->cap - t->start < t->len ? t->cap - t->start : t->len;
    memcpy(p, t->buf + t->start, first);
    memcpy(p + first, t->buf, t->len - first);
    return out;
}

/* One read of a pipe; 0 at its end (closed), 1 if more may come. */
static int read_once(Tail *t, char *chunk) {
    ssize_t n = read(t->fd, chunk, CHUNK);
    if (n > 0) {
        tail_add(t, chunk, (size_t)n);
        return 1;
    }
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
        return 1;
    close(t->fd);
    t->fd = -1;
    return 0;
}

static void drain(Tail *t, char *chunk) {
    if (t->fd < 0)
        return;
    fcntl(t->fd, F_SETFL, fcntl(t->fd, F_GETFL) | O_NONBLOCK);
    for (int i = 0; i < DRAIN_CHUNKS && t->fd >= 0; i++) {
        ssize_t n = read(t->fd, chunk, CHUNK);
        if (n > 0)
            tail_add(t, chunk, (size_t)n);
        else if (n < 0 && errno == EINTR)
            continue;
        else
            break;   /* end of the pipe, or nothing more now: a background writer */
    }
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Pump the pipes until the process exits (or the deadline, < 0: none, passes); then reap
 * it. Returns 1 if the deadline passed (the process group is killed). GIL released. */
static int pump(pid_t pid, Tail *out, Tail *err, double deadline, int *status) {
    char *chunk = malloc(CHUNK);
    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    int timed_out = 0, exited = 0;
    Tail *tails[2] = {out, err};
    while (!exited) {
        struct pollfd fds[3];
        Tail *which[3];
        int n = 0;
        for (int i = 0; i < 2; i++)
            if (tails[i]->fd >= 0) {
                fds[n] = (struct pollfd){tails[i]->fd, POLLIN, 0};
                which[n++] = tails[i];
            }
        int pidfd_at = -1;
        if (pidfd >= 0) {
            pidfd_at = n;
            fds[n++] = (struct pollfd){pidfd, POLLIN, 0};
        }
        int wait_ms = -1;
        if (deadline >= 0) {
            double left = deadline - now_s();
            if (left <= 0) {
                timed_out = 1;
                break;
            }
            wait_ms = (int)(left * 1000) + 1;
        }
        if (pidfd < 0 && (wait_ms < 0 || wait_ms > 50))
            wait_ms = 50;   /* no pidfd (Linux < 5.3): look every 50 ms */
        if (n == 0) {       /* no pipes and no pidfd: wait for the exit itself */
            if (deadline < 0) {
                while (waitpid(pid, status, 0) < 0 && errno == EINTR)
                    ;
                free(chunk);
                return 0;
            }
        }
        int ready = n ? poll(fds, (nfds_t)n, wait_ms) : (usleep(wait_ms * 1000), 0);
        if (ready < 0 && errno != EINTR)
            break;
        for (int i = 0; i < n && ready > 0; i++) {
            if (!fds[i].revents)
                continue;
            if (i == pidfd_at)
                exited = 1;
            else if (chunk != NULL)
                read_once(which[i], chunk);
        }
        if (pidfd < 0 && waitpid(pid, status, WNOHANG) == pid) {
            if (chunk != NULL) {
                drain(out, chunk);
                drain(err, chunk);
            }
            free(chunk);
            return 0;
        }
    }
    if (exited && chunk != NULL) {
        drain(out, chunk);
        drain(err, chunk);
    }
    if (timed_out)
        killpg(pid, SIGKILL);
    while (waitpid(pid, status, 0) < 0 && errno == EINTR)
        ;
    if (pidfd >= 0)
        close(pidfd);
    free(chunk);
    return timed_out;
}

static int fill_argv(PyObject *seq, char ***out) {
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    char **v = PyMem_Calloc((size_t)n + 1, sizeof(char *));
    if (v == NULL)
        return -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyBytes_Check(item)) {
            PyMem_Free(v);
            PyErr_SetString(PyExc_TypeError, "run: argv and env items are bytes");
            return -1;
        }
        v[i] = PyBytes_AS_STRING(item);
    }
    *out = v;
    return 0;
}

/* One process run to its end: what run() and run_batch() share. */
typedef struct {
    int code, timed_out;
    int spawn_errno;          /* why it could not start (nothing ran), else 0 */
    Tail out, err;
    double start, end;        /* wall clock (time.time()) around it */
} Ran;

static double wall_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void ran_free(Ran *r) {
    for (int i = 0; i < 2; i++) {
        Tail *t = i ? &r->err : &r->out;
        if (t->fd >= 0)
            close(t->fd);
        PyMem_RawFree(t->buf);
        t->buf = NULL;
        t->fd = -2;
    }
}

/* The child of spawn()'s vfork(): it runs in its parent's memory until its exec, so it
 * touches nothing but its own stack and `err`, and calls only what a signal handler may.
 * No handler of the parent's may run here: every signal with one goes back to its
 * default while all are blocked (the exec would reset them too, but only at the exec), and
 * SIGPIPE and SIGXFSZ, which Python ignores, too; then the process leads a session of its
 * own, has `fds` as its stdin, stdout and stderr and no other descriptor, works in `cwd`,
 * and runs `path` with no signal blocked: what subprocess.Popen(start_new_session=True)
 * gives. A failure is its errno in `err`, and exit status 127. */
static __attribute__((noreturn)) void child_exec(const char *path, char **argv, char **envp,
                                                 const char *cwd, const int fds[3],
                                                 long max_fd, volatile int *err) {
    int f[3] = {fds[0], fds[1], fds[2]};
    struct sigaction dfl;
    memset(&dfl, 0, sizeof(dfl));
    dfl.sa_handler = SIG_DFL;
    for (int sig = 1; sig < NSIG; sig++) {
        struct sigaction now;
        if (sig == SIGKILL || sig == SIGSTOP || sigaction(sig, NULL, &now) < 0)
            continue;   /* (the C library's own signals answer EINVAL) */
        void *h = (now.sa_flags & SA_SIGINFO) ? (void *)now.sa_sigaction
                                                : (void *)now.sa_handler;
        if (h == (void *)SIG_DFL || (h == (void *)SIG_IGN && sig != SIGPIPE && sig != SIGXFSZ))
            continue;
        sigaction(sig, &dfl, NULL);
    }
    if (setsid() < 0)
        goto fail;
    for (int i = 0; i < 3; i++)   /* one of them on 0-2 would be overwritten before its turn */
        if (f[i] < 3 && f[i] != i && (f[i] = fcntl(f[i], F_DUPFD, 3)) < 0)
            goto fail;
    for (int i = 0; i < 3; i++)
        if (f[i] == i ? fcntl(i, F_SETFD, 0) < 0 : dup2(f[i], i) < 0)
            goto fail;
#ifdef SYS_close_range
    if (syscall(SYS_close_range, 3U, ~0U, 0U) < 0)   /* Linux < 5.9: one by one */
#endif
        for (long fd = 3; fd < max_fd; fd++)
            close((int)fd);
    if (chdir(cwd) < 0)
        goto fail;
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    execve(path, argv, envp);
fail:
    *err = errno;
    _exit(127);
}

/* Start `path` as child_exec() says, with vfork() (the parent's thread waits until the
 * child has exec'd: nothing of this process is copied, and no stack is mapped and unmapped
 * for it, as posix_spawn does at every call, at a cost that grows when the process's other
 * threads run on other cores). As CPython's _posixsubprocess does.
 * 0 and *pid; or the errno of what failed (nothing runs: the child is reaped). */
static int spawn(pid_t *pid, const char *path, char **argv, char **envp, const char *cwd,
                 int in_fd, int out_fd, int err_fd) {
    static long max_fd = 0;
    if (max_fd == 0) {
        max_fd = sysconf(_SC_OPEN_MAX);
        if (max_fd < 3)
            max_fd = 1024;
    }
    const int fds[3] = {in_fd, out_fd, err_fd};
    volatile int err = 0;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pid_t child = vfork();
    if (child == 0)
        child_exec(path, argv, envp, cwd, fds, max_fd, &err);
    int failed = child < 0 ? errno : err;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (child > 0 && failed != 0)
        while (waitpid(child, NULL, 0) < 0 && errno == EINTR)
            ;
    if (failed == 0)
        *pid = child;
    return failed;
}

/* Start `path` (argv, envp: NULL this process's) in `cwd` with stdin `in_fd` and stdout/
 * stderr `out_fd`/`err_fd` (-1: a pipe read here, its last `tail` bytes kept), tell
 * `started(*started_args, pid)` (None: nobody) with the GIL, and wait for it without the
 * GIL, killing its group after `timeout` s (< 0: none). GIL held on entry and exit.
 * 0: it ran (or could not start: r->spawn_errno); -1: a Python exception (a pipe or
 * memory failed, or the `started` hook raised: the process is killed and reaped). */
static int run_member(const char *path, char **argv, char **envp, const char *cwd,
                      int in_fd, int out_fd, int err_fd, double timeout, Py_ssize_t tail,
                      PyObject *started, PyObject *started_args, Ran *r) {
    memset(r, 0, sizeof(*r));
    r->out.fd = r->err.fd = -2;
    Tail *tails[2] = {&r->out, &r->err};
    int pipes[2][2] = {{-1, -1}, {-1, -1}};
    int *fds[2] = {&out_fd, &err_fd};
    int ret = -1;
    for (int i = 0; i < 2; i++) {
        if (*fds[i] != -1)
            continue;
        if (pipe2(pipes[i], O_CLOEXEC) < 0) {
            PyErr_SetFromErrno(PyExc_OSError);
            goto done;
        }
        *fds[i] = pipes[i][1];
        tails[i]->fd = pipes[i][0];
        tails[i]->cap = (size_t)(tail > 0 ? tail : 0);
        tails[i]->buf = tails[i]->cap ? PyMem_RawMalloc(tails[i]->cap) : NULL;
        if (tails[i]->cap && tails[i]->buf == NULL) {
            PyErr_NoMemory();
            goto done;
        }
    }
    pid_t pid;
    int rc;
    r->start = wall_s();
    Py_BEGIN_ALLOW_THREADS
    rc = spawn(&pid, path, argv, envp != NULL ? envp : environ, cwd, in_fd, out_fd, err_fd);
    Py_END_ALLOW_THREADS
    for (int i = 0; i < 2; i++)   /* the child has its write ends (or never started) */
        if (pipes[i][1] >= 0) {
            close(pipes[i][1]);
            pipes[i][1] = -1;
        }
    if (rc != 0) {
        r->spawn_errno = rc;
        r->end = wall_s();
        ret = 0;
        goto done;
    }
    if (started != Py_None) {
        /* (*started_args, pid) */
        Py_ssize_t before = started_args == NULL ? 0 : PyTuple_GET_SIZE(started_args);
        PyObject *call_args = PyTuple_New(before + 1), *res = NULL;
        PyObject *pid_o = call_args == NULL ? NULL : PyLong_FromLong((long)pid);
        if (pid_o != NULL) {
            for (Py_ssize_t k = 0; k < before; k++)
                PyTuple_SET_ITEM(call_args, k, Py_NewRef(PyTuple_GET_ITEM(started_args, k)));
            PyTuple_SET_ITEM(call_args, before, pid_o);
            res = PyObject_Call(started, call_args, NULL);
        }
        Py_XDECREF(call_args);
        if (res == NULL) {   /* the hook failed: the unit must not run on unseen */
            killpg(pid, SIGKILL);
            int ignored;
            Py_BEGIN_ALLOW_THREADS
            while (waitpid(pid, &ignored, 0) < 0 && errno == EINTR)
                ;
            Py_END_ALLOW_THREADS
            goto done;
        }
        Py_DECREF(res);
    }
    int status = 0, timed_out;
    Py_BEGIN_ALLOW_THREADS
    timed_out = pump(pid, &r->out, &r->err, timeout < 0 ? -1.0 : now_s() + timeout, &status);
    Py_END_ALLOW_THREADS
    r->end = wall_s();
    r->code = WIFSIGNALED(status) ? -WTERMSIG(status) : WEXITSTATUS(status);
    r->timed_out = timed_out;
    ret = 0;
done:
    for (int i = 0; i < 2; i++)
        if (pipes[i][1] >= 0)
            close(pipes[i][1]);
    return ret;
}

/* run(path, argv, env, cwd, stdin_fd, stdout_fd, stderr_fd, timeout, tail, started)
 * path: bytes (the executable, already found); argv: bytes items; env: bytes items
 * (b"K=V") or None (this process's); stdout_fd/stderr_fd: -1 for a pipe read here;
 * timeout: seconds, < 0 none; started(pid) or None.
 * -> (returncode, timed_out, out, out_size, err, err_size); OSError if it cannot start. */
static PyObject *spawn_run(PyObject *self, PyObject *args) {
    PyObject *path, *argv_o, *env_o, *cwd, *started;
    int in_fd, out_fd, err_fd;
    double timeout;
    Py_ssize_t tail;
    (void)self;
    if (!PyArg_ParseTuple(args, "O!OOO!iiidnO", &PyBytes_Type, &path, &argv_o, &env_o,
                          &PyBytes_Type, &cwd, &in_fd, &out_fd, &err_fd, &timeout, &tail,
                          &started))
        return NULL;
    PyObject *argv_seq = PySequence_Fast(argv_o, "run: argv is a sequence");
    if (argv_seq == NULL)
        return NULL;
    PyObject *env_seq = env_o == Py_None ? NULL : PySequence_Fast(env_o, "run: env");
    char **argv = NULL, **envp = NULL;
    PyObject *result = NULL;
    Ran r = {.out = {.fd = -2}, .err = {.fd = -2}};
    if ((env_o != Py_None && env_seq == NULL) || fill_argv(argv_seq, &argv) < 0 ||
        (env_seq != NULL && fill_argv(env_seq, &envp) < 0))
        goto done;
    if (run_member(PyBytes_AS_STRING(path), argv, envp, PyBytes_AS_STRING(cwd), in_fd, out_fd,
                   err_fd, timeout, tail, started, NULL, &r) < 0)
        goto done;
    if (r.spawn_errno) {
        errno = r.spawn_errno;
        PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, path);
        goto done;
    }
    PyObject *o = tail_bytes(&r.out), *e = o ? tail_bytes(&r.err) : NULL;
    if (o != NULL && e != NULL)
        result = Py_BuildValue("(iONKNK)", r.code, r.timed_out ? Py_True : Py_False, o,
                               r.out.size, e, r.err.size);
    else {
        Py_XDECREF(o);
        Py_XDECREF(e);
    }
done:
    ran_free(&r);
    PyMem_Free(argv);
    PyMem_Free(envp);
    Py_DECREF(argv_seq);
    Py_XDECREF(env_seq);
    return result;
}

/* run_batch(members, cwd, stdin_fd, tail, started, canceled): the members of a bundle one
 * after another, as run() runs one, with no Python between them but the two hooks.
 * members: a sequence of (path, argv, env, timeout) as run() takes them, each with its
 * stdout and stderr read here; started(index, pid) or None; canceled() or None, asked
 * before each member: a true answer stops the batch there.
 * -> a list, one item per member that was started or tried (not those after a cancel):
 * (returncode, timed_out, out, out_size, err, err_size, start, end, spawn_errno), where a
 * spawn_errno other than 0 means it could not start (nothing else in the item counts). */
static PyObject *spawn_batch(PyObject *self, PyObject *args) {
    PyObject *members, *cwd, *started, *canceled;
    int in_fd;
    Py_ssize_t tail;
    (void)self;
    if (!PyArg_ParseTuple(args, "OO!inOO", &members, &PyBytes_Type, &cwd, &in_fd, &tail,
                          &started, &canceled))
        return NULL;
    PyObject *seq = PySequence_Fast(members, "run_batch: members is a sequence");
    if (seq == NULL)
        return NULL;
    PyObject *out = PyList_New(0);
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
        if (canceled != Py_None) {
            PyObject *stop = PyObject_CallNoArgs(canceled);
            int yes = stop == NULL ? -1 : PyObject_IsTrue(stop);
            Py_XDECREF(stop);
            if (yes < 0) {
                Py_CLEAR(out);
                break;
            }
            if (yes)
                break;
        }
        PyObject *m = PySequence_Fast_GET_ITEM(seq, i), *path, *argv_o, *env_o;
        double timeout;
        if (!PyArg_ParseTuple(m, "O!OOd", &PyBytes_Type, &path, &argv_o, &env_o, &timeout)) {
            Py_CLEAR(out);
            break;
        }
        PyObject *argv_seq = PySequence_Fast(argv_o, "run_batch: argv is a sequence");
        PyObject *env_seq = env_o == Py_None || argv_seq == NULL ? NULL :
            PySequence_Fast(env_o, "run_batch: env");
        char **argv = NULL, **envp = NULL;
        Ran r = {.out = {.fd = -2}, .err = {.fd = -2}};
        PyObject *index = PyLong_FromSsize_t(i), *hook_args = NULL, *item = NULL;
        if (index != NULL)
            hook_args = PyTuple_Pack(1, index);
        int ok = argv_seq != NULL && (env_o == Py_None || env_seq != NULL) &&
                 hook_args != NULL && fill_argv(argv_seq, &argv) == 0 &&
                 (env_seq == NULL || fill_argv(env_seq, &envp) == 0) &&
                 run_member(PyBytes_AS_STRING(path), argv, envp, PyBytes_AS_STRING(cwd),
                            in_fd, -1, -1, timeout, tail, started, hook_args, &r) == 0;
        if (ok) {
            PyObject *o = tail_bytes(&r.out), *e = o ? tail_bytes(&r.err) : NULL;
            if (o != NULL && e != NULL)
                item = Py_BuildValue("(iONKNKddi)", r.code, r.timed_out ? Py_True : Py_False,
                                     o, r.out.size, e, r.err.size, r.start, r.end,
                                     r.spawn_errno);
            else {
                Py_XDECREF(o);
                Py_XDECREF(e);
            }
        }
        ran_free(&r);
        PyMem_Free(argv);
        PyMem_Free(envp);
        Py_XDECREF(argv_seq);
        Py_XDECREF(env_seq);
        Py_XDECREF(index);
        Py_XDECREF(hook_args);
        if (item == NULL || PyList_Append(out, item) < 0) {
            Py_XDECREF(item);
            Py_CLEAR(out);
            break;
        }
        Py_DECREF(item);
    }
    Py_DECREF(seq);
    return out;
}

static PyMethodDef methods[] = {
    {"run", spawn_run, METH_VARARGS, "Run a unit's process to its end (see the module)."},
    {"run_batch", spawn_batch, METH_VARARGS,
     "Run a bundle's members one after another, as run() does one (see run_batch's doc)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_spawn", NULL, -1, methods};

PyMODINIT_FUNC PyInit__spawn(void) {
    return PyModule_Create(&module);
}
