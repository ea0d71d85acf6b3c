// Bench fixture for dispatch tracking: N dispatches on the main thread.
//
// usage: dispatch N [pipe]
//   Prints "dispatch: pid=<pid> ready", waits for a line on stdin, then runs
//   N iterations of dispatch_message() and prints
//   "result: dispatches=N elapsed_ns=E ns_per_dispatch=X cpu_ns_per_dispatch=C"
//   (C: the CPU time of all its threads, which the probes, the scheduler
//   tracepoints run by its threads and samples taken while they run are
//   charged to, and being preempted by other load is not).
//   Without `pipe`, each dispatch calls handle_fast() and never blocks.
//   With `pipe`, each dispatch calls handle_pipe(), which hands a byte to a
//   worker thread through a pipe and blocks reading its reply: two wake-ups
//   per dispatch (the worker's, then the main thread's, inside the
//   dispatch). Run untraced beside a profiled process, it is a storm of
//   wake-ups outside any traced dispatch. Both threads are pinned to the
//   CPU the program starts on: each round trip is then two context
//   switches on one CPU, with less variance than wake-ups across CPUs.
// Built with a 5-byte nop at each function entry (the cheap probe site), so
// what is measured is the profiler's own work per dispatch.
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../../tests/fixtures/common.h"

#define NOINLINE __attribute__((noinline))

static volatile uint64_t sink;

/* CPU time of the whole process (every thread), ns. */
static uint64_t cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
static int to_worker[2], to_main[2];

NOINLINE void handle_fast(uint64_t i) { sink += i; }

NOINLINE void handle_pipe(uint64_t i)
{
    char c = (char)i;
    if (write(to_worker[1], &c, 1) != 1 || read(to_main[0], &c, 1) != 1)
        abort();
    sink += (uint64_t)c;
}

static int piped;

NOINLINE void dispatch_message(uint64_t i)
{
    if (piped)
        handle_pipe(i);
    else
        handle_fast(i);
}

static void *worker(void *arg)
{
    (void)arg;
    char c;
    while (read(to_worker[0], &c, 1) == 1)
        if (write(to_main[1], &c, 1) != 1)
            break;
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s N [pipe]\n", argv[0]);
        return 2;
    }
    long n = atol(argv[1]);
    piped = argc > 2 && strcmp(argv[2], "pipe") == 0;
    if (piped) {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(sched_getcpu(), &one);
        /* Before the worker starts: it inherits the mask. */
        if (sched_setaffinity(0, sizeof one, &one))
            return 1;
        pthread_t t;
        if (pipe(to_worker) || pipe(to_main) || pthread_create(&t, NULL, worker, NULL))
            return 1;
    }
    printf("dispatch: pid=%d ready\n", getpid());
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin))
        return 1;
    uint64_t c0 = cpu_ns();
    uint64_t t0 = now_ns();
    for (long i = 0; i < n; i++)
        dispatch_message((uint64_t)i);
    uint64_t dt = now_ns() - t0;
    uint64_t dc = cpu_ns() - c0;
    printf("result: dispatches=%ld elapsed_ns=%llu ns_per_dispatch=%.1f cpu_ns_per_dispatch=%.1f\n",
           n, (unsigned long long)dt, (double)dt / (double)n, (double)dc / (double)n);
    fflush(stdout);
    return 0;
}
