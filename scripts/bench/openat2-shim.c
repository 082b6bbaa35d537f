/*
 * openat2-shim: LD_PRELOAD for profiling smithfs under valgrind 3.19, which does not know
 * openat2 (syscall 437) and fails it with ENOSYS. The shim turns `syscall(SYS_openat2, ...)`
 * into openat(2) with O_NOFOLLOW; RESOLVE_BENEATH is dropped, which is fine for a profile in a
 * scratch directory and never for real use. Callgrind counts user-space instructions only, so
 * the counts are those of the real program.
 *
 * Build: gcc -O2 -shared -fPIC -o openat2-shim.so openat2-shim.c
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

struct how {
	uint64_t flags, mode, resolve;
};

long syscall(long nr, ...)
{
	va_list ap;
	long a[6];
	va_start(ap, nr);
	for (int i = 0; i < 6; i++)
		a[i] = va_arg(ap, long);
	va_end(ap);
	if (nr == SYS_openat2) {
		const struct how *h = (const struct how *)a[2];
		int fd = openat((int)a[0], (const char *)a[1], (int)h->flags | O_NOFOLLOW, (mode_t)h->mode);
		return fd;
	}
	/* Every other call: the raw system call. */
	long ret;
	register long r10 __asm__("r10") = a[3];
	register long r8 __asm__("r8") = a[4];
	register long r9 __asm__("r9") = a[5];
	__asm__ volatile("syscall"
			 : "=a"(ret)
			 : "a"(nr), "D"(a[0]), "S"(a[1]), "d"(a[2]), "r"(r10), "r"(r8), "r"(r9)
			 : "rcx", "r11", "memory");
	if (ret < 0 && ret > -4096) {
		errno = (int)-ret;
		return -1;
	}
	return ret;
}
