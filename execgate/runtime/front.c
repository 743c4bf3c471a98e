/*
 * execgate's compiled front: the installed `execgate`, the OCI runtime engines call.
 *
 * Like NVIDIA's container runtime it does only what it must: a call with nothing for execgate to
 * do is execve()d to the real runtime (runc, crun) at once, the way the Python runtime
 * (runtime/main.py) would, and only a call with work to do starts Python: it execve()s the
 * Python entry point (EXECGATE_PYTHON, runtime/launcher.py's script) with the same argv and
 * environment. When in doubt it never guesses: any flag it does not know, a config it has no
 * current copy of, a record it cannot read, a runtime it cannot find -> Python, which decides.
 *
 * What it passes through, decided as runtime/main.py and its handlers decide:
 *   - every subcommand but create, start, exec, kill, delete (and all of them when
 *     per_exec_cgroups is false), and no subcommand at all (`--version` prints execgate's two
 *     lines first, as main.print_version does);
 *   - start, exec, kill of a container without a record, or whose record (written by
 *     runtime/create.py: <state_dir>/containers/<id>.json) says "managed": false; start also of
 *     one already "prepared"; delete of a container without a record; an exec that names its
 *     own --cgroup.
 * A managed exec that is not a TTY call is a tool call: the front hands it to the daemon (the
 * `exec` op, daemon/exec_op.py), which admits and places it, answers the argv to run runc with,
 * and follows the call to its end. A create (sandbox admission, the record) and a managed
 * container's start (to prepare), kill (to thaw) and delete (to clean up) go to the daemon too
 * (the `lifecycle` op, daemon/lifecycle_op.py). Python starts only when the daemon does not
 * answer so, or no daemon socket is configured.
 *
 * The config: this program never reads config.toml. The Python runtime writes what the front
 * needs, resolved (common/frontconf.py: FRONT_CONF, beside its config cache, in tmpfs), with the
 * stat of the config file and of the modules that resolved it; the daemon writes it too when it
 * starts and reloads. The front uses it only while those still match and the file is ours
 * (owner, mode); else Python runs, and writes it again.
 * The config file's path is found as config.py finds it: $EXECGATE_CONFIG, else DEFAULT_CONFIG.
 * The real runtime is found as oci/runc.py's find() does: each candidate, a path as is or a name
 * looked up in $PATH then SEARCH_PATH, the first executable that is not execgate itself (its
 * own file, `execgate` on $PATH, or a script naming execgate.runtime in its first 512 bytes);
 * its environment gets LOOP_MARKER=1, and a call that already has it goes to Python (a loop).
 *
 * Build: `python -m execgate.runtime.front build OUT PYTHON_ENTRY` (install.sh), which passes the
 * constants above from the Python side as -D definitions.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#if !defined(EXECGATE_PYTHON) || !defined(FRONT_CONF) || !defined(FRONT_FORMAT) || \
	!defined(DEFAULT_CONFIG) || !defined(SEARCH_PATH) || !defined(LOOP_MARKER) || \
	!defined(DAEMON_LOST) || !defined(MISSED_FRAMES)
#error "built by execgate/runtime/front.py, which defines the paths"
#endif

#define MAX_RUNTIMES 16
#define MAX_RECORD (1 << 20)
#define MAX_DEPTH 64

extern char **environ;

static char **args; /* our argv */

/* ---- the two ways out ---------------------------------------------------------------------- */

/* Start Python with our argv and environment: it decides everything we did not. */
static void __attribute__((noreturn)) python(void)
{
	struct stat self, entry;

	/* A front installed as its own fallback would exec itself for ever. */
	if (stat("/proc/self/exe", &self) == 0 && stat(EXECGATE_PYTHON, &entry) == 0 &&
	    self.st_dev == entry.st_dev && self.st_ino == entry.st_ino) {
		dprintf(2, "execgate: %s is this front, not the Python runtime (reinstall)\n",
			EXECGATE_PYTHON);
		_exit(1);
	}
	args[0] = EXECGATE_PYTHON;
	execve(EXECGATE_PYTHON, args, environ);
	dprintf(2, "execgate: cannot start %s: %s\n", EXECGATE_PYTHON, strerror(errno));
	_exit(127);
}

/* The daemon was sent the call or create and closed the socket (it died), or it took it
 * (`queued`) and then died or fell silent: Python runs it unmanaged at once, told so by
 * DAEMON_LOST. Asking again, it found a restarted daemon that
 * queued the call a second time (frontconf.py). */
static void __attribute__((noreturn)) python_daemon_lost(void)
{
	setenv(DAEMON_LOST, "1", 1);
	python();
}

/* execve the real runtime as runc.execve() does: argv[0] its path, our environment +
 * LOOP_MARKER=1; returns only if it fails. */
static void runtime_env(const char *real)
{
	static const char marker[] = LOOP_MARKER "=1";
	size_t n = 0, out = 0, klen = strlen(LOOP_MARKER);
	int placed = 0;

	while (environ[n])
		n++;
	char **env = calloc(n + 2, sizeof(*env));
	if (!env)
		return;
	for (size_t i = 0; i < n; i++) {
		if (!strncmp(environ[i], LOOP_MARKER, klen) && environ[i][klen] == '=') {
			if (!placed)
				env[out++] = (char *)marker; /* replaced where it was, as a dict does */
			placed = 1;
			continue;
		}
		env[out++] = environ[i];
	}
	if (!placed)
		env[out++] = (char *)marker;
	env[out] = NULL;
	args[0] = (char *)real;
	execve(real, args, env);
	free(env);
}

/* Become the real runtime. */
static void __attribute__((noreturn)) runtime(const char *real)
{
	runtime_env(real);
	python(); /* runc.execve would have raised: Python reports it */
}

/* runtime() in a child the front waits for: a failed execve is runc not found (127). */
static void __attribute__((noreturn)) runtime_child(const char *real)
{
	runtime_env(real);
	dprintf(2, "execgate: cannot run %s: %s\n", real, strerror(errno));
	_exit(127);
}

/* ---- the front file (common/frontconf.py) -------------------------------------------------- */

struct front {
	const char *version, *state_dir;
	const char *socket; /* the daemon's, NULL: managed execs go to Python */
	long long daemon_timeout_ms;
	int per_exec_cgroups;
	const char *runtimes[MAX_RUNTIMES];
	int nruntimes;
};

/* "dev ino size mtime_ns ctime_ns path": does path's stat (following links, as Python's open
 * and os.stat do) still say that? */
static int stat_matches(const char *fields, const char **path_out)
{
	unsigned long long want[5];
	const char *p = fields;
	char *end;
	struct stat st;

	for (int i = 0; i < 5; i++) {
		if (*p < '0' || *p > '9')
			return 0;
		errno = 0;
		want[i] = strtoull(p, &end, 10);
		if (errno || *end != ' ')
			return 0;
		p = end + 1;
	}
	*path_out = p;
	if (stat(p, &st) != 0)
		return 0;
	unsigned long long mtime = (unsigned long long)st.st_mtim.tv_sec * 1000000000ULL +
				   (unsigned long long)st.st_mtim.tv_nsec;
	unsigned long long ctime = (unsigned long long)st.st_ctim.tv_sec * 1000000000ULL +
				   (unsigned long long)st.st_ctim.tv_nsec;
	return want[0] == (unsigned long long)st.st_dev && want[1] == (unsigned long long)st.st_ino &&
	       want[2] == (unsigned long long)st.st_size && want[3] == mtime && want[4] == ctime;
}

/* Read the front file into f; 0 when it is missing, not ours, stale or not understood. */
static int load_front(struct front *f, const char *config_path)
{
	static char buf[65536];
	struct stat st;
	ssize_t len = 0, r;
	int fd = open(FRONT_CONF, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return 0;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
	    (st.st_mode & 022)) {
		close(fd);
		return 0;
	}
	while ((r = read(fd, buf + len, sizeof(buf) - 1 - len)) > 0)
		len += r;
	close(fd);
	if (r < 0 || len == (ssize_t)sizeof(buf) - 1 || memchr(buf, '\0', len))
		return 0;
	buf[len] = '\0';

	int config_seen = 0, code_seen = 0, ended = 0, per_exec = -1;
	char *line = buf, *nl;
	memset(f, 0, sizeof(*f));
	if (!(nl = strchr(line, '\n')))
		return 0;
	*nl = '\0';
	if (strcmp(line, FRONT_FORMAT))
		return 0;
	for (line = nl + 1; *line; line = nl + 1) {
		if (ended || !(nl = strchr(line, '\n')))
			return 0; /* something after "end", or a line cut short */
		*nl = '\0';
		char *value = strchr(line, ' ');
		if (!strcmp(line, "end")) {
			ended = 1;
			continue;
		}
		if (!value)
			return 0;
		*value++ = '\0';
		if (!strcmp(line, "config")) {
			const char *path;
			if (!strncmp(value, "- ", 2)) { /* recorded as absent: it must still be */
				struct stat cst;
				if (strcmp(value + 2, config_path) ||
				    !(stat(config_path, &cst) != 0 && errno == ENOENT))
					return 0;
			} else if (!stat_matches(value, &path) || strcmp(path, config_path)) {
				return 0;
			}
			config_seen = 1;
		} else if (!strcmp(line, "code")) {
			const char *path;
			if (!stat_matches(value, &path))
				return 0;
			code_seen = 1;
		} else if (!strcmp(line, "version")) {
			f->version = value;
		} else if (!strcmp(line, "state_dir")) {
			f->state_dir = value;
		} else if (!strcmp(line, "per_exec_cgroups")) {
			if (strcmp(value, "0") && strcmp(value, "1"))
				return 0;
			per_exec = value[0] == '1';
		} else if (!strcmp(line, "socket")) {
			if (*value != '/')
				return 0;
			f->socket = value;
		} else if (!strcmp(line, "daemon_timeout_ms")) {
			char *end;
			errno = 0;
			f->daemon_timeout_ms = strtoll(value, &end, 10);
			if (errno || *end || f->daemon_timeout_ms <= 0)
				return 0;
		} else if (!strcmp(line, "runtime")) {
			if (f->nruntimes == MAX_RUNTIMES || !*value)
				return 0;
			f->runtimes[f->nruntimes++] = value;
		} else {
			return 0; /* a newer Python side: it knows better */
		}
	}
	if (!ended || !config_seen || !code_seen || !f->version || !f->state_dir ||
	    !*f->state_dir || per_exec < 0 || !f->nruntimes || (f->socket && !f->daemon_timeout_ms))
		return 0;
	f->per_exec_cgroups = per_exec;
	return 1;
}

/* ---- finding the real runtime (oci/runc.py) ------------------------------------------------ */

/* runc.which(): the first executable non-directory called name in the ':'-separated dirs. */
static int which(const char *name, const char *dirs, char *out)
{
	const char *d = dirs;
	struct stat st;

	for (;;) {
		const char *colon = strchrnul(d, ':');
		int n = (int)(colon - d);
		int len;
		if (n == 0) /* os.path.join("", name) is name: relative to the cwd */
			len = snprintf(out, PATH_MAX, "%s", name);
		else if (d[n - 1] == '/')
			len = snprintf(out, PATH_MAX, "%.*s%s", n, d, name);
		else
			len = snprintf(out, PATH_MAX, "%.*s/%s", n, d, name);
		if (len > 0 && len < PATH_MAX && access(out, X_OK) == 0 &&
		    !(stat(out, &st) == 0 && S_ISDIR(st.st_mode)))
			return 1;
		if (!*colon)
			return 0;
		d = colon + 1;
	}
}

/* runc._is_execgate(): this program, `execgate` on $PATH, or a script of execgate's. */
static int is_execgate(const char *path)
{
	char real[PATH_MAX], own[PATH_MAX], found[PATH_MAX], head[513];
	const char *env_path = getenv("PATH");

	if (!realpath(path, real))
		return -1;
	if (realpath("/proc/self/exe", own) && !strcmp(real, own))
		return 1;
	if (realpath(EXECGATE_PYTHON, own) && !strcmp(real, own))
		return 1;
	if (!env_path)
		env_path = ":/bin:/usr/bin"; /* os.defpath */
	if (*env_path && which("execgate", env_path, found) && realpath(found, own) &&
	    !strcmp(real, own))
		return 1;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	ssize_t n = 0, r;
	while (n < 512 && (r = read(fd, head + n, 512 - n)) > 0)
		n += r;
	close(fd);
	return n >= 2 && head[0] == '#' && head[1] == '!' &&
	       memmem(head, n, "execgate.runtime", 16) != NULL;
}

/* runc.find(): the first candidate that exists, is executable and is not execgate. */
static int find_runtime(const struct front *f, char *out)
{
	static char search[65536];
	const char *env_path = getenv("PATH");
	struct stat st;

	if (snprintf(search, sizeof(search), "%s:%s", env_path ? env_path : "", SEARCH_PATH) >=
	    (int)sizeof(search))
		return 0;
	for (int i = 0; i < f->nruntimes; i++) {
		const char *cand = f->runtimes[i];
		if (strchr(cand, '/')) {
			if (strlen(cand) >= PATH_MAX)
				return 0;
			strcpy(out, cand);
		} else if (!which(cand, search, out)) {
			continue;
		}
		if (access(out, X_OK) != 0 || (stat(out, &st) == 0 && S_ISDIR(st.st_mode)))
			continue;
		int self = is_execgate(out);
		if (self < 0)
			return 0;
		if (!self)
			return 1;
	}
	return 0; /* none: Python falls back to the defaults, or reports it */
}

/* ---- runc's command line (oci/cli.py) ------------------------------------------------------ */

static int in(const char *name, size_t len, const char *const *set)
{
	for (; *set; set++)
		if (strlen(*set) == len && !strncmp(name, *set, len))
			return 1;
	return 0;
}

/* cli._split_flag(): 1 for a flag (name, its length, the inline value or NULL), 0 for not. */
static int split_flag(const char *arg, const char **name, size_t *len, const char **value)
{
	if (strlen(arg) < 2 || arg[0] != '-' || !strcmp(arg, "--"))
		return 0;
	const char *n = arg[1] == '-' ? arg + 2 : arg + 1;
	if (!*n || *n == '-')
		return 0;
	const char *eq = strchr(n, '=');
	*name = n;
	*len = eq ? (size_t)(eq - n) : strlen(n);
	*value = eq ? eq + 1 : NULL;
	return 1;
}

static const char *const GLOBAL_VALUE[] = {"log", "log-format", "root", "criu", "rootless", NULL};
static const char *const GLOBAL_BOOL[] = {"debug", "systemd-cgroup", "help", "h", "version", "v",
					  NULL};
static const char *const EXEC_VALUE[] = {"console-socket", "cwd", "env", "e", "user", "u",
					 "additional-gids", "g", "process", "p", "pid-file",
					 "process-label", "apparmor", "cap", "c", "preserve-fds",
					 "cgroup", NULL};
static const char *const EXEC_BOOL[] = {"tty", "t", "detach", "d", "no-new-privs",
					"no-subreaper", "ignore-paused", NULL};
static const char *const KILL_BOOL[] = {"all", "a", NULL};
static const char *const DELETE_BOOL[] = {"force", "f", NULL};
static const char *const NONE[] = {NULL};

/* The container id of an intercepted subcommand (args from the one after it), parsed as
 * Invocation.command_flags() does, every flag known; NULL when unsure. */
static const char *container_id(int i, const char *const *value_flags,
				const char *const *bool_flags, int interspersed)
{
	const char *cid = NULL;

	for (; args[i]; i++) {
		const char *name, *value;
		size_t len;
		if (!strcmp(args[i], "--"))
			return NULL; /* rare, and cli.py's two modes read it differently */
		if (!split_flag(args[i], &name, &len, &value)) {
			if (!interspersed)
				return args[i];
			if (!cid)
				cid = args[i];
			continue;
		}
		if (in(name, len, value_flags)) {
			if (!value && !args[++i])
				return NULL;
		} else if (!in(name, len, bool_flags)) {
			return NULL;
		}
	}
	return cid;
}

/* Whether exec's flags (args from i, up to the container id) name one of names. */
static int exec_flag(int i, const char *const *names)
{
	for (; args[i]; i++) {
		const char *name, *value;
		size_t len;
		if (!split_flag(args[i], &name, &len, &value))
			return 0;
		if (in(name, len, names))
			return 1;
		if (in(name, len, EXEC_VALUE) && !value)
			i++;
	}
	return 0;
}

/* ---- the container record (common/records.py) ---------------------------------------------- */

/* A small strict JSON reader, enough to find the record's top-level booleans. */
struct json {
	const char *p, *end;
};

static void ws(struct json *j)
{
	while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
		j->p++;
}

/* Skip a string at p ('"'); *plain: it had no escape. */
static int skip_string(struct json *j, int *plain)
{
	*plain = 1;
	for (j->p++; j->p < j->end; j->p++) {
		unsigned char c = (unsigned char)*j->p;
		if (c == '"') {
			j->p++;
			return 1;
		}
		if (c < 0x20)
			return 0;
		if (c == '\\') {
			*plain = 0;
			if (++j->p >= j->end)
				return 0;
			if (*j->p == 'u') {
				for (int k = 0; k < 4; k++) {
					if (++j->p >= j->end || !strchr("0123456789abcdefABCDEF", *j->p))
						return 0;
				}
			} else if (!strchr("\"\\/bfnrt", *j->p) || !*j->p) {
				return 0;
			}
		}
	}
	return 0;
}

static int skip_value(struct json *j, int depth);

static int skip_container(struct json *j, int depth, char close)
{
	int plain;

	if (depth > MAX_DEPTH)
		return 0;
	j->p++;
	ws(j);
	if (j->p < j->end && *j->p == close) {
		j->p++;
		return 1;
	}
	for (;;) {
		ws(j);
		if (close == '}') {
			if (j->p >= j->end || *j->p != '"' || !skip_string(j, &plain))
				return 0;
			ws(j);
			if (j->p >= j->end || *j->p++ != ':')
				return 0;
		}
		if (!skip_value(j, depth + 1))
			return 0;
		ws(j);
		if (j->p >= j->end)
			return 0;
		if (*j->p == close) {
			j->p++;
			return 1;
		}
		if (*j->p++ != ',')
			return 0;
	}
}

static int literal(struct json *j, const char *word)
{
	size_t n = strlen(word);
	if ((size_t)(j->end - j->p) < n || strncmp(j->p, word, n))
		return 0;
	j->p += n;
	return 1;
}

static int skip_value(struct json *j, int depth)
{
	int plain;

	ws(j);
	if (j->p >= j->end)
		return 0;
	switch (*j->p) {
	case '{':
		return skip_container(j, depth, '}');
	case '[':
		return skip_container(j, depth, ']');
	case '"':
		return skip_string(j, &plain);
	case 't':
		return literal(j, "true");
	case 'f':
		return literal(j, "false");
	case 'n':
		return literal(j, "null");
	}
	/* a number, as json.dump writes them (NaN and Infinity: not ours, unsure) */
	const char *start = j->p;
	if (j->p < j->end && *j->p == '-')
		j->p++;
	if (j->p >= j->end || *j->p < '0' || *j->p > '9')
		return 0;
	while (j->p < j->end && strchr("0123456789.eE+-", *j->p))
		j->p++;
	return j->p > start;
}

enum { ABSENT = -1 };

/* The record's top-level "managed" and "prepared" (1 true, 0 false, ABSENT); 0 on any doubt
 * (not pure ASCII JSON, an escaped top-level key, a value that is not a boolean). */
static int record_flags(const char *text, size_t len, int *managed, int *prepared)
{
	struct json j = {text, text + len};
	int plain;

	*managed = *prepared = ABSENT;
	for (size_t k = 0; k < len; k++)
		if ((unsigned char)text[k] >= 0x80 || !text[k])
			return 0; /* json.dump writes ASCII: this is not a record of ours */
	ws(&j);
	if (j.p >= j.end || *j.p != '{')
		return 0;
	j.p++;
	ws(&j);
	if (j.p < j.end && *j.p == '}') {
		j.p++;
	} else {
		for (;;) {
			ws(&j);
			const char *key = j.p + 1;
			if (j.p >= j.end || *j.p != '"' || !skip_string(&j, &plain) || !plain)
				return 0;
			size_t klen = (size_t)(j.p - 1 - key);
			int *slot = NULL;
			if (klen == 7 && !strncmp(key, "managed", 7))
				slot = managed;
			else if (klen == 8 && !strncmp(key, "prepared", 8))
				slot = prepared;
			ws(&j);
			if (j.p >= j.end || *j.p++ != ':')
				return 0;
			ws(&j);
			if (slot) { /* the last one counts, as in json.load */
				if (literal(&j, "true"))
					*slot = 1;
				else if (literal(&j, "false"))
					*slot = 0;
				else
					return 0;
			} else if (!skip_value(&j, 1)) {
				return 0;
			}
			ws(&j);
			if (j.p >= j.end)
				return 0;
			if (*j.p == '}') {
				j.p++;
				break;
			}
			if (*j.p++ != ',')
				return 0;
		}
	}
	ws(&j);
	return j.p == j.end;
}

/* The container's record: 1 read (flags set), 0 none, -1 unsure. */
static int load_record(const char *state_dir, const char *cid, int *managed, int *prepared)
{
	static char text[MAX_RECORD];
	char path[PATH_MAX];
	ssize_t len = 0, r;

	if (!*cid || strchr(cid, '/') || cid[0] == '.')
		return -1; /* records.py refuses such an id */
	if (snprintf(path, sizeof(path), "%s/containers/%s.json", state_dir, cid) >=
	    (int)sizeof(path))
		return -1;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT ? 0 : -1;
	while ((r = read(fd, text + len, sizeof(text) - len)) > 0)
		len += r;
	close(fd);
	if (r < 0 || len == (ssize_t)sizeof(text))
		return -1;
	return record_flags(text, (size_t)len, managed, prepared) ? 1 : -1;
}

/* ---- the daemon's exec op (daemon/exec_op.py) ---------------------------------------------- */

/* A managed non-TTY exec is handed to the daemon, which admits and places it and answers the
 * argv to run runc with; it follows the call to its end itself, so no Python starts. The wire
 * is the daemon's (common/protocol.py): a 4-byte big-endian length, then one msgpack map. Any
 * trouble before `queued` (no daemon, a refusal, a frame not understood, a deadline passed)
 * -> Python, which asks again and fails open as it always has; the daemon closing the socket,
 * or trouble after `queued` -> Python with DAEMON_LOST, which runs the call at once. The bounds
 * on the wait are runtime/admit.py's. */

#define MAX_FRAME (1 << 20)
#define SLACK_MS 5000
#define LIFECYCLE_AFTER_MS 60000 /* a start's prepare retries for 10 s; a loaded host: more */

struct buf {
	char *p;
	size_t len, cap;
};

static int put(struct buf *b, const void *data, size_t n)
{
	if (b->len + n > b->cap) {
		size_t cap = b->cap ? b->cap * 2 : 4096;
		while (cap < b->len + n)
			cap *= 2;
		char *p = realloc(b->p, cap);
		if (!p)
			return 0;
		b->p = p;
		b->cap = cap;
	}
	memcpy(b->p + b->len, data, n);
	b->len += n;
	return 1;
}

/* msgpack's header of a map, array or str of n items/bytes: its short form where it has one. */
static int put_head(struct buf *b, unsigned fix, unsigned fixmax, unsigned char c16, size_t n)
{
	unsigned char h[5];
	if (n <= fixmax) {
		h[0] = (unsigned char)(fix | n);
		return put(b, h, 1);
	}
	if (n <= 0xffff) {
		h[0] = c16, h[1] = (unsigned char)(n >> 8), h[2] = (unsigned char)n;
		return put(b, h, 3);
	}
	h[0] = c16 + 1, h[1] = (unsigned char)(n >> 24), h[2] = (unsigned char)(n >> 16);
	h[3] = (unsigned char)(n >> 8), h[4] = (unsigned char)n;
	return put(b, h, 5);
}

static int put_str(struct buf *b, const char *s)
{
	size_t n = strlen(s);
	if (n <= 31)
		return put_head(b, 0xa0, 31, 0xda, n) && put(b, s, n);
	if (n <= 0xff) {
		unsigned char h[2] = {0xd9, (unsigned char)n};
		return put(b, h, 2) && put(b, s, n);
	}
	return put_head(b, 0xa0, 31, 0xda, n) && put(b, s, n);
}

/* A msgpack reader over one frame: enough for the daemon's answers (maps of strings, numbers,
 * booleans and an array of strings); anything else is skipped, or not understood. */
struct mp {
	const unsigned char *p, *end;
};

static int mp_uint(struct mp *m, int bytes, unsigned long long *v)
{
	if (m->end - m->p < bytes)
		return 0;
	*v = 0;
	for (int k = 0; k < bytes; k++)
		*v = *v << 8 | *m->p++;
	return 1;
}

/* The next item's kind: 's' str (len), 'a' array (len items), 'm' map (len pairs), 'b' bool
 * (len 0/1), 'n' number (*num), 'z' nil, 'x' another kind (bin, ext: skipped by length). */
static int mp_next(struct mp *m, char *kind, size_t *len, double *num)
{
	unsigned long long v;
	if (m->p >= m->end)
		return 0;
	unsigned char c = *m->p++;
	*len = 0;
	if (c <= 0x7f || c >= 0xe0) {
		*kind = 'n', *num = c <= 0x7f ? c : (double)(signed char)c;
		return 1;
	}
	if ((c & 0xe0) == 0xa0)
		return *kind = 's', *len = c & 0x1f, 1;
	if ((c & 0xf0) == 0x90)
		return *kind = 'a', *len = c & 0x0f, 1;
	if ((c & 0xf0) == 0x80)
		return *kind = 'm', *len = c & 0x0f, 1;
	switch (c) {
	case 0xc0:
		return *kind = 'z', 1;
	case 0xc2:
	case 0xc3:
		return *kind = 'b', *len = c == 0xc3, 1;
	case 0xd9: case 0xda: case 0xdb:
		if (!mp_uint(m, 1 << (c - 0xd9), &v))
			return 0;
		return *kind = 's', *len = v, 1;
	case 0xc4: case 0xc5: case 0xc6:
		if (!mp_uint(m, 1 << (c - 0xc4), &v))
			return 0;
		return *kind = 'x', *len = v, 1;
	case 0xdc: case 0xdd:
		if (!mp_uint(m, c == 0xdc ? 2 : 4, &v))
			return 0;
		return *kind = 'a', *len = v, 1;
	case 0xde: case 0xdf:
		if (!mp_uint(m, c == 0xde ? 2 : 4, &v))
			return 0;
		return *kind = 'm', *len = v, 1;
	case 0xcc: case 0xcd: case 0xce: case 0xcf:
		if (!mp_uint(m, 1 << (c - 0xcc), &v))
			return 0;
		return *kind = 'n', *num = (double)v, 1;
	case 0xd0: case 0xd1: case 0xd2: case 0xd3: {
		int bytes = 1 << (c - 0xd0);
		if (!mp_uint(m, bytes, &v))
			return 0;
		if (bytes < 8 && (v >> (bytes * 8 - 1)) & 1)
			v |= ~0ULL << (bytes * 8); /* sign-extend */
		return *kind = 'n', *num = (double)(long long)v, 1;
	}
	case 0xca: {
		float f;
		uint32_t u;
		if (!mp_uint(m, 4, &v))
			return 0;
		u = (uint32_t)v;
		memcpy(&f, &u, 4);
		return *kind = 'n', *num = f, 1;
	}
	case 0xcb: {
		double d;
		if (!mp_uint(m, 8, &v))
			return 0;
		memcpy(&d, &v, 8);
		return *kind = 'n', *num = d, 1;
	}
	}
	return 0; /* fixext/ext and the reserved byte: not the daemon's */
}

static int mp_skip(struct mp *m, int depth)
{
	char kind;
	size_t len;
	double num;
	if (depth > MAX_DEPTH || !mp_next(m, &kind, &len, &num))
		return 0;
	if (kind == 's' || kind == 'x') {
		if ((size_t)(m->end - m->p) < len)
			return 0;
		m->p += len;
	} else if (kind == 'a' || kind == 'm') {
		for (size_t k = 0; k < len * (kind == 'm' ? 2 : 1); k++)
			if (!mp_skip(m, depth + 1))
				return 0;
	}
	return 1;
}

/* What the front reads of a frame. */
struct answer {
	int ok, queued, waiting;
	double progress_s, max_wait_s, max_queued_s; /* < 0: absent */
	char **argv;				     /* the final answer's, NULL-terminated */
	const unsigned char *say, *run; /* run: "exec" or "child" (the lifecycle op) */
	size_t say_len, run_len;
};

static int mp_key_is(const unsigned char *k, size_t n, const char *want)
{
	return strlen(want) == n && !memcmp(k, want, n);
}

static int parse_answer(const unsigned char *body, size_t n, struct answer *a)
{
	struct mp m = {body, body + n};
	char kind;
	size_t len;
	double num;

	memset(a, 0, sizeof(*a));
	a->progress_s = a->max_wait_s = a->max_queued_s = -1;
	if (!mp_next(&m, &kind, &len, &num) || kind != 'm')
		return 0;
	for (size_t k = 0; k < len; k++) {
		size_t klen, vlen;
		if (!mp_next(&m, &kind, &klen, &num) || kind != 's' ||
		    (size_t)(m.end - m.p) < klen)
			return 0;
		const unsigned char *key = m.p;
		m.p += klen;
		const unsigned char *at = m.p;
		if (!mp_next(&m, &kind, &vlen, &num))
			return 0;
		int *flag = mp_key_is(key, klen, "ok")	       ? &a->ok
			    : mp_key_is(key, klen, "queued")  ? &a->queued
			    : mp_key_is(key, klen, "waiting") ? &a->waiting
							      : NULL;
		double *number = mp_key_is(key, klen, "progress_s")	? &a->progress_s
				 : mp_key_is(key, klen, "max_wait_s")	? &a->max_wait_s
				 : mp_key_is(key, klen, "max_queued_s") ? &a->max_queued_s
									: NULL;
		if (flag && kind == 'b') {
			*flag = (int)vlen;
		} else if (number && kind == 'n') {
			*number = num;
		} else if ((mp_key_is(key, klen, "say") || mp_key_is(key, klen, "run")) &&
			   kind == 's') {
			if ((size_t)(m.end - m.p) < vlen)
				return 0;
			if (key[0] == 's')
				a->say = m.p, a->say_len = vlen;
			else
				a->run = m.p, a->run_len = vlen;
			m.p += vlen;
		} else if (mp_key_is(key, klen, "argv") && kind == 'a') {
			if (vlen == 0 || vlen > (size_t)MAX_FRAME)
				return 0;
			char **out = calloc(vlen + 2, sizeof(*out));
			if (!out)
				return 0;
			for (size_t i = 0; i < vlen; i++) {
				size_t slen;
				if (!mp_next(&m, &kind, &slen, &num) || kind != 's' ||
				    (size_t)(m.end - m.p) < slen || memchr(m.p, '\0', slen) ||
				    !(out[i + 1] = strndup((const char *)m.p, slen)))
					return 0;
				m.p += slen;
			}
			a->argv = out; /* out[0]: the runtime's path, set by runtime() */
		} else {
			m.p = at; /* a key we do not read, or a value of another kind */
			if (!mp_skip(&m, 1))
				return 0;
		}
	}
	return m.p == m.end;
}

static long long now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Set when the daemon's end closed (EOF, reset): it died, as opposed to answering late. */
static int peer_closed;

/* Read n bytes by the deadline (ms, monotonic); 0 on EOF, error or time up. */
static int read_by(int fd, unsigned char *out, size_t n, long long deadline)
{
	size_t got = 0;
	while (got < n) {
		long long left = deadline - now_ms();
		if (left <= 0)
			return 0;
		struct pollfd p = {fd, POLLIN, 0};
		int r = poll(&p, 1, left > INT_MAX ? INT_MAX : (int)left);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return 0;
		ssize_t k = read(fd, out + got, n - got);
		if (k < 0 && errno == EINTR)
			continue;
		if (k == 0 || (k < 0 && errno == ECONNRESET))
			peer_closed = 1;
		if (k <= 0)
			return 0;
		got += (size_t)k;
	}
	return 1;
}

static int read_answer(int fd, long long deadline, struct answer *a)
{
	static unsigned char body[MAX_FRAME];
	unsigned char h[4];
	if (!read_by(fd, h, 4, deadline))
		return 0;
	size_t n = (size_t)h[0] << 24 | (size_t)h[1] << 16 | (size_t)h[2] << 8 | h[3];
	if (n > sizeof(body) || !read_by(fd, body, n, deadline))
		return 0;
	if (!parse_answer(body, n, a))
		return 0;
	if (a->say_len) /* for the agent: on the call's stderr, before it starts */
		(void)!write(2, a->say, a->say_len);
	return a->ok;
}

/* Send one frame (b: 4 bytes kept for its length, then the body); 1 when all of it went. */
static int send_frame(int fd, struct buf *b)
{
	size_t n = b->len - 4;
	if (n > MAX_FRAME)
		return 0;
	b->p[0] = (char)(n >> 24), b->p[1] = (char)(n >> 16), b->p[2] = (char)(n >> 8);
	b->p[3] = (char)n;
	for (size_t off = 0; off < b->len;) { /* a local socket: the daemon reads it whole */
		ssize_t k = send(fd, b->p + off, b->len - off, MSG_NOSIGNAL);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return 0;
		off += (size_t)k;
	}
	return 1;
}

/* Connect to the daemon and send op (exec, lifecycle) with our argv; the socket, or -1. */
static int send_op(const struct front *f, const char *op, const char *config_path)
{
	struct sockaddr_un addr = {.sun_family = AF_UNIX};
	struct buf b = {0};
	int argc = 0;

	if (strlen(f->socket) >= sizeof(addr.sun_path))
		return -1;
	strcpy(addr.sun_path, f->socket);
	while (args[argc + 1])
		argc++;
	if (!put(&b, "\0\0\0\0", 4) || !put_head(&b, 0x80, 15, 0xde, 4) ||
	    !put_str(&b, "v") || !put(&b, "\x01", 1) || !put_str(&b, "op") ||
	    !put_str(&b, op) || !put_str(&b, "config") || !put_str(&b, config_path) ||
	    !put_str(&b, "argv") || !put_head(&b, 0x90, 15, 0xdc, (size_t)argc))
		return free(b.p), -1;
	for (int k = 1; k <= argc; k++)
		if (!put_str(&b, args[k]))
			return free(b.p), -1;
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof(addr)) != 0 ||
	    !send_frame(fd, &b)) {
		free(b.p);
		if (fd >= 0)
			close(fd);
		return -1;
	}
	free(b.p);
	return fd;
}

/* The daemon's first answer to the request sent on fd (-1: none could be sent), by the
 * deadline. No daemon, or no answer in time -> Python, which asks again and fails open (an
 * exec with its watcher); a daemon that closed the socket on the request (it died) -> Python
 * with DAEMON_LOST: asked again, a restarted daemon queued the call anew (VM: 104 s). */
static void first_answer(int fd, long long deadline, struct answer *a)
{
	if (fd < 0)
		python();
	if (read_answer(fd, deadline, a))
		return;
	if (peer_closed)
		python_daemon_lost();
	python();
}

/* The managed exec, through the daemon: becomes runc with the daemon's argv, or Python. */
static void __attribute__((noreturn)) exec_via_daemon(const struct front *f,
						      const char *config_path, const char *real)
{
	struct answer a;
	long long t0 = now_ms();
	int fd = send_op(f, "exec", config_path);

	first_answer(fd, t0 + f->daemon_timeout_ms, &a);
	if (!a.argv) {
		if (!a.queued)
			python();
		/* A daemon that keeps us informed is waited for (runtime/admit.py's bounds). */
		double wait = a.max_wait_s >= 0 ? a.max_wait_s : 30;
		double total = a.progress_s > 0 ? (a.max_queued_s > wait ? a.max_queued_s : wait)
						: wait;
		/* A late frame is a loaded daemon, not a dead one (that closes the socket). */
		double silence = a.progress_s > 0 ? a.progress_s * MISSED_FRAMES : wait;
		long long deadline = now_ms() + (long long)(total * 1000) + SLACK_MS;
		for (;;) {
			long long by = now_ms() + (long long)(silence * 1000) + SLACK_MS;
			if (!read_answer(fd, by < deadline ? by : deadline, &a))
				python_daemon_lost();
			if (a.argv)
				break; /* else `queued` (the ticket) or `waiting`: the daemon is at it */
		}
	}
	close(fd);
	args = a.argv;
	runtime(real);
}

/* ---- the daemon's lifecycle op (daemon/lifecycle_op.py) --------------------------------------- */

static volatile pid_t child_pid;

static void forward(int sig)
{
	if (child_pid > 0)
		kill(child_pid, sig);
}

/* Exit as runc did (oci/runc.py's exit_as): its code, or killed by its signal. */
static void __attribute__((noreturn)) exit_as(int status)
{
	if (WIFEXITED(status))
		_exit(WEXITSTATUS(status));
	int sig = WTERMSIG(status);
	signal(sig, SIG_DFL);
	kill(getpid(), sig);
	_exit(128 + sig);
}

/* A container's create, or a managed one's start, kill or delete, through the daemon: it
 * admits, records, thaws, prepares and cleans up as the Python handlers would, and the front runs runc (as its child, signals
 * forwarded, when the daemon has work after it) or becomes runc. */
static void __attribute__((noreturn)) lifecycle_via_daemon(const struct front *f,
							   const char *config_path,
							   const char *real)
{
	static const int forwarded[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT};
	struct answer a;
	int fd = send_op(f, "lifecycle", config_path);

	first_answer(fd, now_ms() + f->daemon_timeout_ms, &a);
	if (!a.run && a.queued) { /* a create waits for its sandbox's admission */
		double wait = a.max_wait_s > 0 ? (a.max_wait_s < 1e6 ? a.max_wait_s : 1e6) : 0;
		if (!read_answer(fd, now_ms() + (long long)(wait * 1000) + SLACK_MS, &a))
			python_daemon_lost();
	}
	if (!a.run)
		python();
	if (a.run_len == 4 && !memcmp(a.run, "exec", 4)) {
		close(fd);
		runtime(real);
	}
	if (a.run_len != 5 || memcmp(a.run, "child", 5))
		python();
	for (size_t k = 0; k < sizeof(forwarded) / sizeof(*forwarded); k++) {
		struct sigaction sa = {.sa_handler = forward};
		sigaction(forwarded[k], &sa, NULL);
	}
	pid_t pid = fork();
	if (pid < 0)
		python();
	if (pid == 0) {
		for (size_t k = 0; k < sizeof(forwarded) / sizeof(*forwarded); k++)
			signal(forwarded[k], SIG_DFL);
		runtime_child(real);
	}
	child_pid = pid;
	int status;
	while (waitpid(pid, &status, 0) < 0)
		if (errno != EINTR)
			_exit(255);
	/* Tell the daemon how runc ended; its work after runc is its own: whatever it says or
	 * however long it takes, we exit as runc did (the start is prepared by then, mostly). */
	struct buf b = {0};
	int code = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
	unsigned char num[5] = {0xd2, (unsigned char)((unsigned)code >> 24),
				(unsigned char)((unsigned)code >> 16),
				(unsigned char)((unsigned)code >> 8), (unsigned char)code};
	if (put(&b, "\0\0\0\0", 4) && put_head(&b, 0x80, 15, 0xde, 2) && put_str(&b, "v") &&
	    put(&b, "\x01", 1) && put_str(&b, "status") && put(&b, num, 5) && send_frame(fd, &b))
		(void)read_answer(fd, now_ms() + LIFECYCLE_AFTER_MS, &a);
	free(b.p);
	exit_as(status);
}

/* ---- the decision ---------------------------------------------------------------------------- */

int main(int argc, char **argv)
{
	struct front f;
	char real[PATH_MAX];
	const char *config_path = getenv("EXECGATE_CONFIG");
	const char *version = NULL;
	int i;

	static char *no_args[2];

	args = argc > 0 ? argv : no_args; /* argv[0] is replaced, so it must have a slot */
	const char *loop = getenv(LOOP_MARKER);
	if (loop && !strcmp(loop, "1"))
		python(); /* called by itself: Python says so */
	if (!config_path || !*config_path)
		config_path = DEFAULT_CONFIG;
	if (config_path[0] != '/' || !load_front(&f, config_path))
		python();

	/* Global flags, up to the subcommand. */
	for (i = 1; args[i]; i++) {
		const char *name, *value;
		size_t len;
		if (!strcmp(args[i], "--"))
			python();
		if (!split_flag(args[i], &name, &len, &value))
			break;
		if (in(name, len, GLOBAL_VALUE)) {
			if (!value && !args[++i])
				python();
		} else if (in(name, len, GLOBAL_BOOL)) {
			if (in(name, len, (const char *const[]){"version", "v", NULL}))
				version = value ? value : "true";
		} else {
			python(); /* a flag of a newer runc: it may take a value */
		}
	}
	const char *command = args[i];

	if (!find_runtime(&f, real))
		python();
	if (!command) {
		if (version && strcasecmp(version, "false") && strcmp(version, "0"))
			dprintf(1, "execgate version %s\nreal runtime: %s\n", f.version, real);
		runtime(real);
	}
	int create = !strcmp(command, "create"), start = !strcmp(command, "start");
	int exec = !strcmp(command, "exec"), kill = !strcmp(command, "kill");
	int delete = !strcmp(command, "delete");
	if (!f.per_exec_cgroups || !(create || start || exec || kill || delete))
		runtime(real);
	if (create && f.socket)
		lifecycle_via_daemon(&f, config_path, real); /* sandbox admission, the record */
	if (create)
		python();

	const char *cid;
	if (start)
		cid = container_id(i + 1, NONE, NONE, 0);
	else if (exec)
		cid = container_id(i + 1, EXEC_VALUE, EXEC_BOOL, 0);
	else if (kill)
		cid = container_id(i + 1, NONE, KILL_BOOL, 1);
	else
		cid = container_id(i + 1, NONE, DELETE_BOOL, 1);
	if (!cid)
		python();
	int managed, prepared;
	int rec = load_record(f.state_dir, cid, &managed, &prepared);
	if (rec < 0)
		python();
	if (rec == 0)
		runtime(real); /* no record: execgate never managed it */
	if (delete && f.socket)
		lifecycle_via_daemon(&f, config_path, real); /* a record to remove */
	if (delete)
		python();
	if (managed != 1)
		runtime(real);
	if (start && prepared != 1 && f.socket)
		lifecycle_via_daemon(&f, config_path, real); /* the cgroup layout to make */
	if (start && prepared != 1)
		python();
	if (start)
		runtime(real);
	if (exec && exec_flag(i + 1, (const char *const[]){"cgroup", NULL}))
		runtime(real); /* the caller placed the call itself */
	if (exec && f.socket &&
	    !exec_flag(i + 1, (const char *const[]){"console-socket", "tty", "t", NULL}))
		exec_via_daemon(&f, config_path, real); /* a tool call */
	if (kill && f.socket)
		lifecycle_via_daemon(&f, config_path, real); /* thaw first */
	python(); /* a TTY call (the terminal relay), or no daemon configured */
}
