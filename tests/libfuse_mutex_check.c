/*
 * libfuse_mutex_check: preloaded (LD_PRELOAD) into a daemon under test, it stops the daemon at
 * once, with one line on stderr, when libfuse destroys a mutex that is still locked.
 *
 * libfuse frees a request (destroy_req: pthread_mutex_destroy of its lock, then free) when
 * its last reference goes. A request answered from inside its own interrupt registration
 * (fuse_req_interrupt_func, which holds the request's lock and no reference of its own) is
 * freed with its lock held, and libfuse then unlocks the mutex in the freed memory. Neither
 * step is seen by AddressSanitizer: libfuse is not instrumented, and glibc's destroy of a
 * locked mutex only returns EBUSY, which libfuse ignores. The first step is unmistakable
 * here: glibc refuses to destroy a mutex someone holds, and only a request's lock is
 * destroyed by libfuse while its threads serve.
 *
 * Only calls made from libfuse itself are checked (the daemon's other libraries are left
 * alone). Build: gcc -O2 -Wall -Wextra -Werror -shared -fPIC -o X.so libfuse_mutex_check.c -ldl
 */

#define _GNU_SOURCE

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int called_from_libfuse(void *address)
{
	Dl_info info;
	return dladdr(address, &info) != 0 && info.dli_fname != NULL &&
	       strstr(info.dli_fname, "libfuse3.so") != NULL;
}

int pthread_mutex_destroy(pthread_mutex_t *mutex)
{
	static int (*real)(pthread_mutex_t *);
	if (real == NULL)
		real = (int (*)(pthread_mutex_t *))dlsym(RTLD_NEXT, "pthread_mutex_destroy");
	int rc = real(mutex);
	if (rc == EBUSY && called_from_libfuse(__builtin_return_address(0))) {
		static const char said[] = "libfuse_mutex_check: libfuse destroyed a locked mutex "
					   "(a request freed while its lock was held)\n";
		ssize_t ignored = write(STDERR_FILENO, said, sizeof said - 1);
		(void)ignored;
		abort();
	}
	return rc;
}
