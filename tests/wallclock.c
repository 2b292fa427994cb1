/* A wall clock that jumps, for the chaos test (tests/workers/test_chaos.py): an LD_PRELOAD
 * library that adds an offset to every reading of CLOCK_REALTIME (clock_gettime,
 * gettimeofday, time) and to nothing else. The offset, in seconds (a signed decimal), is
 * read from the file AGENTRUN_WALLCLOCK_FILE names, at most every 0.2 s, so a test moves
 * the clock of running processes by rewriting the file.
 *
 * Why not libfaketime (Debian's faketime 0.9.10): told to leave the monotonic clock alone
 * (FAKETIME_DONT_FAKE_MONOTONIC=1), it still rewrites the deadline of an absolute
 * clock_nanosleep on CLOCK_MONOTONIC as if it were a realtime one, a negative time: every
 * Python time.sleep() fails with EINVAL. Faking the monotonic clock too would make a jump
 * move it, which no real clock step does (NTP, a VM resumed, an operator's `date -s`).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>

static int (*real_clock_gettime)(clockid_t, struct timespec *);
static long long offset_ns;  /* the current jump */
static long long read_at_ns; /* monotonic time the file was last read */

static void refresh(void) {
    struct timespec now;
    const char *path;
    FILE *file;
    double seconds;
    long long t;

    real_clock_gettime(CLOCK_MONOTONIC_COARSE, &now);
    t = now.tv_sec * 1000000000LL + now.tv_nsec;
    if (read_at_ns && t - __atomic_load_n(&read_at_ns, __ATOMIC_RELAXED) < 200000000LL)
        return;
    __atomic_store_n(&read_at_ns, t, __ATOMIC_RELAXED);
    path = getenv("AGENTRUN_WALLCLOCK_FILE");
    if (!path || !(file = fopen(path, "r")))
        return;
    if (fscanf(file, "%lf", &seconds) == 1)
        __atomic_store_n(&offset_ns, (long long)(seconds * 1e9), __ATOMIC_RELAXED);
    fclose(file);
}

int clock_gettime(clockid_t clock, struct timespec *ts) {
    int rc;
    long long t;

    if (!real_clock_gettime)
        real_clock_gettime = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    rc = real_clock_gettime(clock, ts);
    if (rc == 0 && (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE)) {
        refresh();
        t = ts->tv_sec * 1000000000LL + ts->tv_nsec + __atomic_load_n(&offset_ns, __ATOMIC_RELAXED);
        ts->tv_sec = t / 1000000000LL;
        ts->tv_nsec = t % 1000000000LL;
    }
    return rc;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    struct timespec ts;
    int rc = clock_gettime(CLOCK_REALTIME, &ts);

    (void)tz;
    if (rc == 0) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return rc;
}

time_t time(time_t *out) {
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    if (out)
        *out = ts.tv_sec;
    return ts.tv_sec;
}
