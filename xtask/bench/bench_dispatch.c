// Bench fixture for dispatch tracking: N fast dispatches on the main thread.
//
// usage: dispatch N
//   Prints "dispatch: pid=<pid> ready", waits for a line on stdin, then runs
//   N iterations of dispatch_message() -> handle_fast() and prints
//   "result: dispatches=N elapsed_ns=E ns_per_dispatch=X".
// Built with a 5-byte nop at each function entry (the cheap probe site), so
// what is measured is the profiler's own work per dispatch.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "../../tests/fixtures/common.h"

#define NOINLINE __attribute__((noinline))

static volatile uint64_t sink;

NOINLINE void handle_fast(uint64_t i) { sink += i; }

NOINLINE void dispatch_message(uint64_t i) { handle_fast(i); }

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s N\n", argv[0]);
        return 2;
    }
    long n = atol(argv[1]);
    printf("dispatch: pid=%d ready\n", getpid());
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin))
        return 1;
    uint64_t t0 = now_ns();
    for (long i = 0; i < n; i++)
        dispatch_message((uint64_t)i);
    uint64_t dt = now_ns() - t0;
    printf("result: dispatches=%ld elapsed_ns=%llu ns_per_dispatch=%.1f\n", n,
           (unsigned long long)dt, (double)dt / (double)n);
    fflush(stdout);
    return 0;
}
