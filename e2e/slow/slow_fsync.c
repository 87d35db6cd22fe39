/*
 * Fault injector, named as such: a slow disk. Preloaded into a process (LD_PRELOAD), it makes
 * every fsync and fdatasync take longer, the way a busy cloud volume does: a steady delay on
 * each call, and now and then a long stall.
 *
 *   URSULA_FAULT_FSYNC_DELAY_MS   added to every call (default 0)
 *   URSULA_FAULT_FSYNC_STALL_MS   a longer stall ...          (default 0)
 *   URSULA_FAULT_FSYNC_STALL_EVERY ... on every Nth call       (default 0: never)
 *
 * The real call runs after the delay, so durability is unchanged: only time is added.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <errno.h>

static atomic_ulong calls;

static long setting(const char *name) {
    const char *text = getenv(name);
    return text ? atol(text) : 0;
}

static void delay(void) {
    long ms = setting("URSULA_FAULT_FSYNC_DELAY_MS");
    long every = setting("URSULA_FAULT_FSYNC_STALL_EVERY");
    unsigned long n = atomic_fetch_add(&calls, 1) + 1;
    if (every > 0 && n % (unsigned long)every == 0)
        ms += setting("URSULA_FAULT_FSYNC_STALL_MS");
    if (ms <= 0)
        return;
    struct timespec left = {ms / 1000, (ms % 1000) * 1000000L};
    int saved = errno;
    while (nanosleep(&left, &left) != 0 && errno == EINTR) {
    }
    errno = saved;
}

int fsync(int fd) {
    static int (*real)(int);
    if (!real)
        real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    delay();
    return real(fd);
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (!real)
        real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    delay();
    return real(fd);
}
