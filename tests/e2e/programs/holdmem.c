/* holdmem MIB: a sandbox's idle baseline, for the e2e suite (run as the container's init).
 *
 * Holds MIB MiB of anonymous memory filled like real process memory: each page a run of
 * pseudo-random bytes (a third of it, different in every page) then repeated text, so zstd
 * compresses it ~3:1 page by page as zram does (zero pages would compress ~100:1 and make swap
 * look free). Writes the checksum of all of it to /tmp/holdmem.ready once filled, then sleeps;
 * on SIGUSR1 it reads every page again (faulting back whatever went to swap) and writes the
 * checksum to /tmp/holdmem.sum. A handler is installed, so the signal reaches it as PID 1.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define PAGE 4096
static const char TEXT[] = "def handler(event, context):\n    return {'status': 200, 'body': "
			   "json.dumps(event)}  # agent framework heap, module text, caches\n";
static volatile sig_atomic_t asked;

static void on_usr1(int sig) { (void)sig; asked = 1; }

static unsigned long long checksum(const unsigned char *p, size_t len)
{
	unsigned long long h = 1469598103934665603ULL; /* FNV-1a over 8-byte words */
	for (size_t i = 0; i + 8 <= len; i += 8) {
		unsigned long long v;
		memcpy(&v, p + i, 8);
		h = (h ^ v) * 1099511628211ULL;
	}
	return h;
}

static void put(const char *path, unsigned long long sum)
{
	char tmp[64];
	snprintf(tmp, sizeof tmp, "%s.tmp", path);
	FILE *f = fopen(tmp, "w");
	if (!f)
		exit(1);
	fprintf(f, "%016llx\n", sum);
	fclose(f);
	rename(tmp, path);
}

int main(int argc, char **argv)
{
	if (argc < 2)
		return 2;
	size_t len = strtoul(argv[1], NULL, 10) << 20;
	unsigned char *p = mmap(NULL, len ? len : PAGE, PROT_READ | PROT_WRITE,
				MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return 1;
	unsigned long long x = 0x9e3779b97f4a7c15ULL ^ (unsigned long long)getpid();
	for (size_t off = 0; off < len; off += PAGE) {
		size_t i = 0, rnd = PAGE / 3;
		for (; i + 8 <= rnd; i += 8) { /* xorshift64* */
			x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
			unsigned long long v = x * 0x2545f4914f6cdd1dULL;
			memcpy(p + off + i, &v, 8);
		}
		for (size_t t = 0; i < PAGE; i++, t = (t + 1) % (sizeof TEXT - 1))
			p[off + i] = (unsigned char)TEXT[t];
	}
	struct sigaction sa = { 0 };
	sa.sa_handler = on_usr1;
	sigaction(SIGUSR1, &sa, NULL);
	signal(SIGTERM, SIG_DFL);
	put("/tmp/holdmem.ready", checksum(p, len));
	for (;;) {
		while (!asked)
			pause();
		asked = 0;
		put("/tmp/holdmem.sum", checksum(p, len));
	}
}
