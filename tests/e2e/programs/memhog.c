/* memhog MIB [HOLD_SECONDS]: allocate MIB MiB, touch every page, hold, exit 0.
 * Static test helper for the e2e suite: prints nothing, so stdout comparisons stay exact. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	if (argc < 2)
		return 2;
	size_t mib = strtoul(argv[1], NULL, 10);
	double hold = argc > 2 ? atof(argv[2]) : 0;
	size_t len = mib << 20;
	char *p = mmap(NULL, len ? len : 1, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return 1;
	for (size_t off = 0; off < len; off += 4096)
		p[off] = 1;
	if (hold > 0) {
		struct timespec ts = { (time_t)hold, (long)((hold - (time_t)hold) * 1e9) };
		nanosleep(&ts, NULL);
	}
	return 0;
}
