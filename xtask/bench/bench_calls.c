// Bench fixture: a tight loop of calls to two noinline functions.
//
// Each iteration calls mid() once, and mid() calls leaf() twice: 3 calls.
//
// usage: calls ITERS [THREADS [CALLS_PER_SEC_PER_THREAD]]
//   Prints "calls: pid=<pid> ready", then waits for a line on stdin so a
//   tracer can attach first. Each thread runs ITERS iterations; with a rate,
//   it runs them in 1 ms batches paced to that many calls per second.
//   With BENCH_PIN=1 in the environment, thread t pins itself to CPU
//   t mod (online CPUs), so several threads share each CPU.
//   Ends by printing one line:
//   "result: threads=T iters=N calls_leaf=L calls_mid=M elapsed_ns=E ns_per_iter=X calls_per_s=R"
//
// Built three ways by `cargo xtask bench`:
//   plain: gcc -O2 -g                                      (uprobe = int3 trap)
//   nop:   gcc -O2 -g -pg -mfentry -mnop-mcount -fno-pic -no-pie
//          (each function starts with a 5-byte nop: optimized uprobe)
//   mcount: gcc -O2 -g -pg                                 (for uftrace)
//   push:  gcc -O2 -g -DPUSH_PROLOGUE   (each function starts with push %rbx)
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "../../tests/fixtures/common.h"

#define NOINLINE __attribute__((noinline))

// The push build clobbers rbx, a register the caller owns, so that each
// function saves it first: `push %rbx`, an ordinary C function's prologue.
#ifdef PUSH_PROLOGUE
#define SAVES_RBX() __asm__ volatile("" ::: "rbx")
#else
#define SAVES_RBX() ((void)0)
#endif

NOINLINE uint64_t leaf(uint64_t x)
{
    SAVES_RBX();
    __asm__ volatile("" : "+r"(x));
    return x * 3 + 1;
}

NOINLINE uint64_t mid(uint64_t x)
{
    SAVES_RBX();
    uint64_t a = leaf(x);
    __asm__ volatile("" : "+r"(a));
    return a + leaf(x + 1);
}

static long iters;
static double rate; // calls per second per thread; 0 = flat out
static volatile uint64_t sink;

static void *worker(void *arg)
{
    const char *pin = getenv("BENCH_PIN");
    if (pin && *pin == '1') {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET((int)((long)arg % (cpus > 0 ? cpus : 1)), &set);
        if (sched_setaffinity(0, sizeof set, &set) != 0) {
            perror("sched_setaffinity");
            exit(3);
        }
    }
    uint64_t acc = 0;
    if (rate <= 0) {
        for (long i = 0; i < iters; i++)
            acc += mid((uint64_t)i);
    } else {
        // Batches of iterations every millisecond, on absolute deadlines, so a
        // thread that falls behind runs flat out instead of sleeping.
        long per_batch = (long)(rate / 3.0 / 1000.0);
        if (per_batch < 1)
            per_batch = 1;
        struct timespec next;
        clock_gettime(CLOCK_MONOTONIC, &next);
        for (long i = 0; i < iters;) {
            long end = i + per_batch < iters ? i + per_batch : iters;
            for (; i < end; i++)
                acc += mid((uint64_t)i);
            next.tv_nsec += 1000000;
            if (next.tv_nsec >= 1000000000) {
                next.tv_nsec -= 1000000000;
                next.tv_sec++;
            }
            clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL);
        }
    }
    sink += acc;
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s ITERS [THREADS [CALLS_PER_SEC_PER_THREAD]]\n", argv[0]);
        return 2;
    }
    iters = atol(argv[1]);
    int threads = argc > 2 ? atoi(argv[2]) : 1;
    rate = argc > 3 ? atof(argv[3]) : 0;
    if (threads < 1 || threads > 64)
        threads = 1;

    printf("calls: pid=%d ready\n", getpid());
    fflush(stdout);
    char line[64];
    if (!fgets(line, sizeof line, stdin))
        return 1;

    pthread_t tids[64];
    uint64_t start = now_ns();
    for (int t = 1; t < threads; t++)
        pthread_create(&tids[t], NULL, worker, (void *)(long)t);
    worker((void *)0L);
    for (int t = 1; t < threads; t++)
        pthread_join(tids[t], NULL);
    uint64_t elapsed = now_ns() - start;

    long total = iters * threads;
    printf("result: threads=%d iters=%ld calls_leaf=%ld calls_mid=%ld elapsed_ns=%llu "
           "ns_per_iter=%.2f calls_per_s=%.0f\n",
           threads, iters, 2 * total, total, (unsigned long long)elapsed,
           (double)elapsed / (double)iters, 3.0 * (double)total * 1e9 / (double)elapsed);
    fflush(stdout);
    return 0;
}
