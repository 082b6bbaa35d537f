/*
 * fsops: the workload driver of scripts/bench.sh.
 *
 * Each timed mode runs one loop of system calls and prints its own elapsed wall time in
 * seconds (CLOCK_MONOTONIC) on stdout, so process start-up, `smithfs run` and the shell are
 * never part of a measurement. A failing call ends the program with a message and status 1.
 *
 *   fsops create DIR N SIZE        mkdir DIR; N x (open O_CREAT|O_TRUNC, write SIZE bytes, close)
 *   fsops stat DIR N               N x lstat of DIR/fNNNNN
 *   fsops read DIR N               N x (open, read to EOF, close) of DIR/fNNNNN
 *   fsops par DIR P N SIZE         P processes, each creating N files of SIZE bytes in one
 *                                  shared directory DIR (names pK-fNNNNN)
 *   fsops tree DIR N PERDIR SIZE   N files of SIZE bytes, PERDIR per directory DIR/dNNNN/
 *   fsops seqwrite FILE MIB        write MIB MiB in 1 MiB blocks, fsync, close
 *   fsops seqread FILE             read FILE to EOF in 1 MiB blocks
 *   fsops time CMD [ARG...]        run CMD, print its wall time; exit with its status
 *   fsops stamp FILE               write CLOCK_REALTIME in ns to FILE (hook latency probe)
 *   fsops inbox FILE               write a task to FILE, close it, print CLOCK_REALTIME in ns
 *                                  taken right after close() returned
 *   fsops latency FILE N           N x statx(AT_STATX_FORCE_SYNC) of FILE (opened O_PATH), each
 *                                  timed: on FUSE one GETATTR round trip each, whatever the
 *                                  attribute cache holds. Prints "latency_us P50 P99 MAX", then
 *                                  the total seconds
 *
 * Build: gcc -O2 -o fsops fsops.c
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void die(const char *what, const char *path)
{
	fprintf(stderr, "fsops: %s %s: %s\n", what, path ? path : "", strerror(errno));
	exit(1);
}

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static long long realtime_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static long num(const char *s)
{
	char *end;
	long v = strtol(s, &end, 10);
	if (*s == '\0' || *end != '\0' || v < 0) {
		fprintf(stderr, "fsops: not a count: %s\n", s);
		exit(2);
	}
	return v;
}

static char *block(size_t size)
{
	char *b = malloc(size ? size : 1);
	if (!b)
		die("malloc", NULL);
	for (size_t i = 0; i < size; i++)
		b[i] = (char)('a' + i % 26);
	return b;
}

static void write_all(int fd, const char *buf, size_t len, const char *path)
{
	while (len > 0) {
		ssize_t n = write(fd, buf, len);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			die("write", path);
		}
		buf += n;
		len -= (size_t)n;
	}
}

static void mkdir_ok(const char *path)
{
	if (mkdir(path, 0755) != 0 && errno != EEXIST)
		die("mkdir", path);
}

/* Files DIR/<prefix>NNNNN; each starts with its own name, so no two have the same content. */
static void create_files(const char *dir, const char *prefix, long n, char *buf, size_t size)
{
	char path[4096];
	for (long i = 0; i < n; i++) {
		int len = snprintf(path, sizeof path, "%s/%s%05ld", dir, prefix, i);
		int fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0644);
		if (fd < 0)
			die("open", path);
		if (size > 0)
			memcpy(buf, path, (size_t)len < size ? (size_t)len : size);
		write_all(fd, buf, size, path);
		if (close(fd) != 0)
			die("close", path);
	}
}

static int cmd_create(char **a)
{
	size_t size = (size_t)num(a[2]);
	long n = num(a[1]);
	char *buf = block(size);
	double t0 = now();
	mkdir_ok(a[0]);
	create_files(a[0], "f", n, buf, size);
	printf("%.6f\n", now() - t0);
	return 0;
}

static int cmd_stat(char **a)
{
	long n = num(a[1]);
	char path[4096];
	struct stat st;
	double t0 = now();
	for (long i = 0; i < n; i++) {
		snprintf(path, sizeof path, "%s/f%05ld", a[0], i);
		if (lstat(path, &st) != 0)
			die("lstat", path);
	}
	printf("%.6f\n", now() - t0);
	return 0;
}

static int cmd_read(char **a)
{
	long n = num(a[1]);
	char path[4096];
	static char buf[65536];
	double t0 = now();
	for (long i = 0; i < n; i++) {
		snprintf(path, sizeof path, "%s/f%05ld", a[0], i);
		int fd = open(path, O_RDONLY);
		if (fd < 0)
			die("open", path);
		ssize_t r;
		while ((r = read(fd, buf, sizeof buf)) > 0)
			;
		if (r < 0)
			die("read", path);
		close(fd);
	}
	printf("%.6f\n", now() - t0);
	return 0;
}

static int cmd_par(char **a)
{
	long p = num(a[1]), n = num(a[2]);
	size_t size = (size_t)num(a[3]);
	char *buf = block(size);
	char prefix[32];
	mkdir_ok(a[0]);
	double t0 = now();
	for (long k = 0; k < p; k++) {
		pid_t pid = fork();
		if (pid < 0)
			die("fork", NULL);
		if (pid == 0) {
			snprintf(prefix, sizeof prefix, "p%ld-f", k);
			create_files(a[0], prefix, n, buf, size);
			_exit(0);
		}
	}
	int failed = 0, st;
	while (wait(&st) > 0)
		if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
			failed = 1;
	if (failed) {
		fprintf(stderr, "fsops: a writer failed\n");
		return 1;
	}
	printf("%.6f\n", now() - t0);
	return 0;
}

static int cmd_tree(char **a)
{
	long n = num(a[1]), per = num(a[2]);
	size_t size = (size_t)num(a[3]);
	char *buf = block(size);
	char sub[4096];
	if (per < 1)
		per = 1;
	double t0 = now();
	mkdir_ok(a[0]);
	for (long d = 0; d * per < n; d++) {
		snprintf(sub, sizeof sub, "%s/d%04ld", a[0], d);
		mkdir_ok(sub);
		long left = n - d * per;
		create_files(sub, "f", left < per ? left : per, buf, size);
	}
	printf("%.6f\n", now() - t0);
	return 0;
}

#define MIB (1024 * 1024)

static int cmd_seqwrite(char **a)
{
	long mib = num(a[1]);
	char *buf = block(MIB);
	double t0 = now();
	int fd = open(a[0], O_CREAT | O_WRONLY | O_TRUNC, 0644);
	if (fd < 0)
		die("open", a[0]);
	for (long i = 0; i < mib; i++)
		write_all(fd, buf, MIB, a[0]);
	if (fsync(fd) != 0)
		die("fsync", a[0]);
	if (close(fd) != 0)
		die("close", a[0]);
	printf("%.6f\n", now() - t0);
	return 0;
}

static int cmd_seqread(char **a)
{
	char *buf = block(MIB);
	double t0 = now();
	int fd = open(a[0], O_RDONLY);
	if (fd < 0)
		die("open", a[0]);
	ssize_t r;
	while ((r = read(fd, buf, MIB)) > 0)
		;
	if (r < 0)
		die("read", a[0]);
	close(fd);
	printf("%.6f\n", now() - t0);
	return 0;
}

static int cmd_time(char **a)
{
	double t0 = now();
	pid_t pid = fork();
	if (pid < 0)
		die("fork", NULL);
	if (pid == 0) {
		execvp(a[0], a);
		fprintf(stderr, "fsops: exec %s: %s\n", a[0], strerror(errno));
		_exit(127);
	}
	int st;
	if (waitpid(pid, &st, 0) < 0)
		die("waitpid", NULL);
	double t = now() - t0;
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
		fprintf(stderr, "fsops: %s failed (status %d)\n", a[0], st);
		return 1;
	}
	printf("%.6f\n", t);
	return 0;
}

static int cmd_stamp(char **a)
{
	long long t = realtime_ns();
	char s[64];
	int len = snprintf(s, sizeof s, "%lld\n", t);
	int fd = open(a[0], O_CREAT | O_WRONLY | O_TRUNC, 0644);
	if (fd < 0)
		die("open", a[0]);
	write_all(fd, s, (size_t)len, a[0]);
	close(fd);
	return 0;
}

static int cmd_inbox(char **a)
{
	static const char task[] = "# bench task\n\nExit at once.\n";
	int fd = open(a[0], O_CREAT | O_WRONLY | O_TRUNC, 0644);
	if (fd < 0)
		die("open", a[0]);
	write_all(fd, task, sizeof task - 1, a[0]);
	if (close(fd) != 0)
		die("close", a[0]);
	printf("%lld\n", realtime_ns());
	return 0;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static int cmd_latency(char **a)
{
	long n = num(a[1]);
	if (n < 1) {
		fprintf(stderr, "fsops: latency needs N >= 1\n");
		return 2;
	}
	int fd = open(a[0], O_PATH);
	if (fd < 0)
		die("open", a[0]);
	double *lat = malloc((size_t)n * sizeof *lat);
	if (!lat)
		die("malloc", NULL);
	struct statx stx;
	double t0 = now();
	for (long i = 0; i < n; i++) {
		double t = now();
		if (statx(fd, "", AT_EMPTY_PATH | AT_STATX_FORCE_SYNC, STATX_BASIC_STATS, &stx) != 0)
			die("statx", a[0]);
		lat[i] = now() - t;
	}
	double total = now() - t0;
	close(fd);
	qsort(lat, (size_t)n, sizeof *lat, cmp_double);
	printf("latency_us %.1f %.1f %.1f\n", lat[(n - 1) / 2] * 1e6, lat[(long)((n - 1) * 0.99)] * 1e6,
	       lat[n - 1] * 1e6);
	printf("%.6f\n", total);
	free(lat);
	return 0;
}

static const struct {
	const char *name;
	int args; /* minimum */
	int (*run)(char **);
} modes[] = {
	{"create", 3, cmd_create},     {"stat", 2, cmd_stat},   {"read", 2, cmd_read},
	{"par", 4, cmd_par},           {"tree", 4, cmd_tree},   {"seqwrite", 2, cmd_seqwrite},
	{"seqread", 1, cmd_seqread},   {"time", 1, cmd_time},   {"stamp", 1, cmd_stamp},
	{"inbox", 1, cmd_inbox},       {"latency", 2, cmd_latency},
};

int main(int argc, char **argv)
{
	if (argc >= 2)
		for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++)
			if (strcmp(argv[1], modes[i].name) == 0) {
				if (argc - 2 < modes[i].args)
					break;
				return modes[i].run(argv + 2);
			}
	fprintf(stderr, "usage: fsops create|stat|read|par|tree|seqwrite|seqread|time|stamp|inbox|latency ARGS (see the source)\n");
	return 2;
}
