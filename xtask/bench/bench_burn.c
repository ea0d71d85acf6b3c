// Bench fixture for sampling: a CPU-bound call chain burn_a -> burn_b -> burn_c.
//
// usage: burn N
//   Prints "burn: pid=<pid> ready", waits for a line on stdin, then runs N
//   rounds of burn_a() and prints "result: rounds=N elapsed_ns=E".
// Each round spins 1 unit in burn_a, 2 in burn_b and 5 in burn_c, so the
// expected self-time shares are 12.5%, 25% and 62.5%.
// Built -O2 -fno-omit-frame-pointer -fno-optimize-sibling-calls so frame-pointer unwinding sees the chain.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "../../tests/fixtures/common.h"

#define NOINLINE __attribute__((noinline))
#define UNIT 1000

static volatile uint64_t sink;

static inline uint64_t spin(uint64_t x, int units)
{
    for (int i = 0; i < units * UNIT; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        __asm__ volatile("" : "+r"(x));
    }
    return x;
}

NOINLINE uint64_t burn_c(uint64_t x) { return spin(x, 5); }

// The spin after each call keeps the calls from becoming tail jumps.
NOINLINE uint64_t burn_b(uint64_t x) { return spin(burn_c(spin(x, 1)), 1); }

NOINLINE uint64_t burn_a(uint64_t x) { return burn_b(spin(x, 1)) + 1; }

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s N\n", argv[0]);
        return 2;
    }
    long n = atol(argv[1]);
    printf("burn: pid=%d ready\n", getpid());
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin))
        return 1;
    uint64_t t0 = now_ns();
    uint64_t x = 1;
    for (long i = 0; i < n; i++)
        x = burn_a(x);
    sink = x;
    uint64_t dt = now_ns() - t0;
    printf("result: rounds=%ld elapsed_ns=%llu\n", n, (unsigned long long)dt);
    fflush(stdout);
    return 0;
}
