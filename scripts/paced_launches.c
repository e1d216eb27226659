/* Launches at a fixed rate through a libcuda.so.1, for scripts/bench_daemon.py.

       paced_launches LIB RATE SECONDS

   Loads LIB (the stand-in libcuda.so.1 of tests/fixtures), prints "ready" and
   waits for a line on stdin (the benchmark reads the tracer's CPU time in
   between), then calls cuLaunchKernel RATE times a second for SECONDS: a
   batch every millisecond on absolute deadlines, so that a late tick is made
   up at once and the rate holds on average.  Prints one JSON line: the
   launches made, the seconds they took, and the latest any batch started. */

#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef int (*launch_fn)(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                         unsigned shmem, void *stream, void **params, void **extra);

#define TICK_NS 1000000L

static long long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s LIB RATE SECONDS\n", argv[0]);
        return 2;
    }
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "%s\n", dlerror());
        return 1;
    }
    launch_fn launch = (launch_fn)dlsym(lib, "cuLaunchKernel");
    if (!launch) {
        fprintf(stderr, "no cuLaunchKernel in %s\n", argv[1]);
        return 1;
    }
    long rate = atol(argv[2]);
    double seconds = atof(argv[3]);
    long ticks = (long)(seconds * 1e9 / TICK_NS);
    printf("ready\n");
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin))
        return 1;
    long long t0 = now_ns(), worst = 0;
    long made = 0;
    for (long tick = 0; tick < ticks; tick++) {
        long long due = t0 + tick * TICK_NS;
        struct timespec d = {due / 1000000000LL, due % 1000000000LL};
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &d, NULL);
        long long late = now_ns() - due;
        if (late > worst)
            worst = late;
        /* the launches due by the end of this tick: RATE * (tick + 1) ms / 1000, made up if behind */
        long target = (long)((tick + 1) * (double)rate * TICK_NS / 1e9);
        for (; made < target; made++)
            launch((void *)1, (unsigned)made + 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
    }
    double took = (now_ns() - t0) / 1e9;
    printf("{\"launches\": %ld, \"seconds\": %.6f, \"latest_tick_ms\": %.3f}\n", made, took, worst / 1e6);
    return 0;
}
