/*
 * memload: reproduce one traced tool call's memory and CPU profile inside a sandbox.
 *
 * The replay driver starts it with `docker exec`, exactly as an agent framework starts a tool
 * call, so the runtime, the per-exec cgroup and the admission path see a real process tree.
 * Pages are really written (RSS and memory.current follow the curve) and released with
 * madvise(MADV_DONTNEED) when the curve falls. The curve is the one bench/trace.py's memory_at()
 * defines; keep the two in sync.
 *
 *   memload --peak-mib 500 --duration 2.0 [--baseline-mib 0] [--shape ramp|spike|plateau|sawtooth]
 *           [--peak-at 0.5] [--hold 0] [--cpu 0] [--retain-mib 0] [--retain-dir /dev/shm]
 *           [--tick-ms 50] [--start-at EPOCH] [--fill-ratio 3] [--hot]
 *
 * Every page written (the heap the curve draws, and the retained file) is filled with data that
 * zstd compresses about --fill-ratio:1, page by page as zram does: real process memory gets
 * 2.5-3.5:1, a page with one byte written ~100:1, which would make compressed swap look free.
 * Each page is a run of pseudo-random bytes (incompressible, different in every page, so no
 * page deduplicates) followed by repeated text. --fill-ratio 0 writes one byte per page (the
 * old, nearly-zero pages).
 *
 * --hot reads one byte of every resident page each tick: the call's working set stays in use,
 * as a real tool's does (a test run, a compiler), so the kernel cannot swap it out for free
 * under the call and reads it back in if it did. Without it, pages are written once and never
 * touched again, which lets compressed swap take a running call's memory at no cost.
 *
 * Silent on success (stdout belongs to the agent's tool output); exit 2 on bad arguments,
 * exit 1 if memory or the retain file cannot be had. With MEMLOAD_TIMINGS=1 in its environment
 * it ends with one line on stderr, CLOCK_MONOTONIC seconds (the host's clock too: containers
 * share it) of when it started, first held its highest level, first let go of it, and ended:
 *   memload: timings start=S full=F left=L end=E
 * The replay driver sets it (not an argument: the command line is what the daemon learns from),
 * so a call's real memory is placed in time apart from the exec's own overhead.
 * Build: gcc -O2 -static -o memload memload.c
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h> /* isfinite only (a macro): no -lm needed */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define MIB (1024.0 * 1024.0)
#define SPIKE_HALF_WIDTH 0.1 /* same constant as trace.py */

enum shape { RAMP, SPIKE, PLATEAU, SAWTOOTH };

static struct {
    double baseline, peak, duration, peak_at, hold, cpu, retain; /* MiB / seconds / fractions */
    double tick;                                                 /* seconds */
    double start_at; /* wall-clock seconds since the epoch; 0: at once */
    double fill_ratio; /* target zstd ratio of every page written; 0: one byte per page */
    int hot;           /* read every resident page each tick */
    enum shape shape;
    const char *retain_dir;
} opt = {0, -1, 1.0, 0.5, 0, 0, 0, 0.05, 0, 3.0, 0, RAMP, "/dev/shm"};

static void usage_error(const char *msg, const char *arg)
{
    fprintf(stderr, "memload: %s%s%s\n", msg, arg ? ": " : "", arg ? arg : "");
    fprintf(stderr, "usage: memload --peak-mib N [--baseline-mib N] [--duration S] "
                    "[--shape ramp|spike|plateau|sawtooth] [--peak-at F] [--hold S] [--cpu F] "
                    "[--retain-mib N] [--retain-dir DIR] [--tick-ms MS] [--start-at EPOCH] "
                    "[--fill-ratio R] [--hot]\n");
    exit(2);
}

/* A finite, non-negative number with nothing trailing; anything else is a usage error. */
static double number(const char *name, const char *s, double max)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < 0 || v > max)
        usage_error(name, s);
    return v;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void sleep_until(double t)
{
    struct timespec ts = {(time_t)t, (long)((t - (time_t)t) * 1e9)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
        ;
}

/* Fraction of the way from baseline (0) to peak (1) at fraction x of the active time. */
static double shape_fraction(double x, double p)
{
    x = x < 0 ? 0 : x > 1 ? 1 : x;
    switch (opt.shape) {
    case RAMP: /* linear rise to p, then held */
        return p <= 0 ? 1 : (x / p < 1 ? x / p : 1);
    case SPIKE: { /* triangle centred on p */
        double d = x > p ? x - p : p - x;
        double f = 1 - d / SPIKE_HALF_WIDTH;
        return f > 0 ? f : 0;
    }
    case PLATEAU: /* at peak until p, then baseline */
        return x <= p ? 1 : 0;
    case SAWTOOTH: { /* teeth of length p */
        if (p <= 0)
            return 1;
        double r = x - (long)(x / p) * p; /* fmod without libm: x >= 0 */
        return (r == 0 && x > 0) ? 1 : r / p;
    }
    }
    return 0;
}

/* Target MiB at t seconds; the --hold interval freezes the curve at its first peak. */
static double level_at(double t)
{
    double hold = opt.hold < opt.duration ? opt.hold : opt.duration;
    double active = opt.duration - hold, x;
    if (active <= 0)
        return opt.peak;
    double t_peak = opt.peak_at * active;
    if (t < t_peak)
        x = t / active;
    else if (t < t_peak + hold)
        return opt.peak;
    else
        x = (t - hold) / active;
    return opt.baseline + (opt.peak - opt.baseline) * shape_fraction(x, opt.peak_at);
}

/* What compresses to nothing in a page: source-like text, repeated. */
static const char TEXT[] =
    "def handle(request, ctx):\n    if not request.ok:\n        return ctx.error(404)\n"
    "    for item in request.items:\n        total += item.size * item.count\n";

/* Bytes of pseudo-random data per page for a target ratio: a page compressed alone (as zram
 * does) takes about its random run plus FILL_OVERHEAD (the text's first copy as literals, its
 * repeats, zstd's frame), so page / (random + overhead) = ratio. Calibrated with zstd -3 page by
 * page; the whole buffer compresses ~10 % better (tests/unit/test_bench_memload.py). */
#define FILL_OVERHEAD 130

static size_t random_bytes_per_page(long page)
{
    if (opt.fill_ratio <= 1)
        return (size_t)page;
    double r = page / opt.fill_ratio - FILL_OVERHEAD;
    return r < 0 ? 0 : (size_t)r;
}

/* A page of TEXT repeated, made once: each page's text part is one memcpy from it. */
static const char *text_page(long page)
{
    static char *text;
    if (!text) {
        text = malloc((size_t)page);
        if (!text) {
            fprintf(stderr, "memload: malloc: %s\n", strerror(errno));
            exit(1);
        }
        for (long i = 0; i < page; i++)
            text[i] = TEXT[i % (long)(sizeof TEXT - 1)];
    }
    return text;
}

/* One page of fill: `seed` makes its random run differ from every other page's. */
static void fill_page(char *p, long page, unsigned long long seed)
{
    size_t rnd = random_bytes_per_page(page), i;
    unsigned long long x = seed * 0x9e3779b97f4a7c15ULL + 0x2545f4914f6cdd1dULL;
    for (i = 0; i + 8 <= rnd; i += 8) { /* xorshift64* */
        x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
        unsigned long long v = x * 0x2545f4914f6cdd1dULL;
        memcpy(p + i, &v, 8);
    }
    for (; i < rnd; i++)
        p[i] = (char)(x >> (i % 8 * 8));
    memcpy(p + rnd, text_page(page) + rnd, (size_t)page - rnd);
}

/* A per-process seed, so two calls' pages differ too. */
static unsigned long long fill_seed(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ((unsigned long long)getpid() << 32) ^ (unsigned long long)ts.tv_nsec;
}

/* Write pages [from, to) of `mem` (bytes, page-aligned): filled, or one byte each. */
static void touch(char *mem, size_t from, size_t to, long page, unsigned long long seed)
{
    for (size_t off = from; off < to; off += page) {
        if (opt.fill_ratio > 0)
            fill_page(mem + off, page, seed + off / page);
        else
            mem[off] = (char)(off / page) | 1;
    }
}

/* Leave `retain` MiB behind in tmpfs: shmem stays charged to the sandbox after we exit. */
static void write_retained(void)
{
    char path[4096];
    static char buf[1 << 16];
    size_t left = (size_t)(opt.retain * MIB);
    long page = sysconf(_SC_PAGESIZE);
    unsigned long long seed = fill_seed() ^ 0x5bd1e995ULL, chunk = 0;
    snprintf(path, sizeof path, "%s/memload-retained-%ld", opt.retain_dir, (long)getpid());
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        fprintf(stderr, "memload: %s: %s\n", path, strerror(errno));
        exit(1);
    }
    /* non-zero: a sparse or zero-deduplicated file holds nothing */
    if (opt.fill_ratio <= 0)
        memset(buf, 0xa5, sizeof buf);
    while (left > 0) {
        if (opt.fill_ratio > 0)
            touch(buf, 0, sizeof buf, page, seed + (chunk++) * (sizeof buf / page));
        ssize_t n = write(fd, buf, left < sizeof buf ? left : sizeof buf);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            fprintf(stderr, "memload: writing %s: %s\n", path, n < 0 ? strerror(errno) : "short");
            exit(1);
        }
        left -= (size_t)n;
    }
    close(fd);
}

int main(int argc, char **argv)
{
    double started = now();
    static const struct option longopts[] = {
        {"peak-mib", required_argument, 0, 'p'},  {"baseline-mib", required_argument, 0, 'b'},
        {"duration", required_argument, 0, 'd'},  {"shape", required_argument, 0, 's'},
        {"peak-at", required_argument, 0, 'a'},   {"hold", required_argument, 0, 'h'},
        {"cpu", required_argument, 0, 'c'},       {"retain-mib", required_argument, 0, 'r'},
        {"retain-dir", required_argument, 0, 'D'}, {"tick-ms", required_argument, 0, 't'},
        {"start-at", required_argument, 0, 'S'},  {"fill-ratio", required_argument, 0, 'f'},
        {"hot", no_argument, 0, 'H'},             {0, 0, 0, 0},
    };
    const double big = 1 << 24; /* 16 TiB or ~194 days: beyond any sane step */
    int c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (c) {
        case 'p': opt.peak = number("--peak-mib", optarg, big); break;
        case 'b': opt.baseline = number("--baseline-mib", optarg, big); break;
        case 'd': opt.duration = number("--duration", optarg, big); break;
        case 'a': opt.peak_at = number("--peak-at", optarg, 1); break;
        case 'h': opt.hold = number("--hold", optarg, big); break;
        case 'c': opt.cpu = number("--cpu", optarg, 1); break;
        case 'r': opt.retain = number("--retain-mib", optarg, big); break;
        case 'D': opt.retain_dir = optarg; break;
        case 't': opt.tick = number("--tick-ms", optarg, 10000) / 1000; break;
        case 'S': opt.start_at = number("--start-at", optarg, 1e12); break;
        case 'f': opt.fill_ratio = number("--fill-ratio", optarg, 1000); break;
        case 'H': opt.hot = 1; break;
        case 's':
            if (!strcmp(optarg, "ramp")) opt.shape = RAMP;
            else if (!strcmp(optarg, "spike")) opt.shape = SPIKE;
            else if (!strcmp(optarg, "plateau")) opt.shape = PLATEAU;
            else if (!strcmp(optarg, "sawtooth")) opt.shape = SAWTOOTH;
            else usage_error("unknown --shape", optarg);
            break;
        default: usage_error("unknown option or missing value", argv[optind - 1]);
        }
    }
    if (optind < argc) usage_error("unexpected argument", argv[optind]);
    if (opt.peak < 0) usage_error("--peak-mib is required", NULL);
    if (opt.baseline > opt.peak) usage_error("--baseline-mib exceeds --peak-mib", NULL);
    if (opt.retain > opt.peak) usage_error("--retain-mib exceeds --peak-mib", NULL);
    if (opt.hold > opt.duration) usage_error("--hold exceeds --duration", NULL);
    if (opt.tick < 0.001) usage_error("--tick-ms must be >= 1", NULL);
    if (opt.fill_ratio > 0 && opt.fill_ratio < 1) usage_error("--fill-ratio must be 0 or >= 1", NULL);

    long page = sysconf(_SC_PAGESIZE);
    size_t cap = ((size_t)(opt.peak * MIB) + page - 1) / page * page;
    char *mem = NULL;
    if (cap > 0) {
        /* NORESERVE: reserve address space only; pages exist once written, like a real heap. */
        mem = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
        if (mem == MAP_FAILED) {
            fprintf(stderr, "memload: mmap %zu bytes: %s\n", cap, strerror(errno));
            return 1;
        }
    }

    /* Calls started in several sandboxes at once (docker exec takes its time, unevenly) begin
     * their curves at one shared instant; a call that arrives late starts at once. */
    if (opt.start_at > 0) {
        struct timespec ts = {(time_t)opt.start_at,
                              (long)((opt.start_at - (time_t)opt.start_at) * 1e9)};
        while (clock_nanosleep(CLOCK_REALTIME, TIMER_ABSTIME, &ts, NULL) == EINTR)
            ;
    }

    size_t resident = 0; /* bytes at the start of `mem` that are currently written */
    size_t highest = 0;  /* the most it has held, and when it first held it / let go of it */
    double full = -1, left = -1;
    unsigned long long seed = fill_seed();
    volatile double sink = 1.0;
    double t0 = now();
    for (long k = 0;; k++) {
        double tick_start = t0 + k * opt.tick;
        double t = tick_start - t0;
        if (t > opt.duration)
            t = opt.duration;
        size_t want = (size_t)(level_at(t) * MIB) / page * page;
        if (want > cap)
            want = cap;
        if (want > resident) { /* grow: write the pages so the kernel must back them */
            touch(mem, resident, want, page, seed);
            seed += (want - resident) / page; /* pages written again after a shrink differ */
            resident = want;
            if (resident > highest)
                highest = resident, full = now(), left = -1;
        } else if (want < resident) { /* shrink: hand the pages back, RSS drops at once */
            if (resident == highest && left < 0)
                left = now();
            madvise(mem + want, resident - want, MADV_DONTNEED);
            resident = want;
        }
        if (t >= opt.duration)
            break;
        if (opt.hot) /* the working set in use: one read per page */
            for (size_t off = 0; off < resident; off += page)
                sink += mem[off];
        /* Burn the CPU share of this tick (page faults above count towards it), sleep the rest. */
        double burn_until = tick_start + opt.cpu * opt.tick;
        while (now() < burn_until)
            for (int i = 0; i < 1000; i++)
                sink = sink * 1.0000001 + 1e-9;
        double next = tick_start + opt.tick;
        if (next > t0 + opt.duration)
            next = t0 + opt.duration;
        sleep_until(next);
    }

    if (mem)
        munmap(mem, cap);
    double ended = now();
    if (opt.retain > 0)
        write_retained();
    const char *timings = getenv("MEMLOAD_TIMINGS");
    if (timings && !strcmp(timings, "1")) {
        if (full < 0) /* never grew: it held nothing above zero the whole time */
            full = t0;
        fprintf(stderr, "memload: timings start=%.6f full=%.6f left=%.6f end=%.6f\n", started,
                full, left < 0 ? ended : left, now());
    }
    return 0;
}
