// Bench fixture for event-loop iterations found from the loop's waits
// (`record` with no dispatch function): a stripped epoll loop woken by a
// timerfd every 100 us, about 10,000 iterations a second (or every
// PERIOD_US: `cargo xtask bench --only watch` runs it at 1,000 a second).
//
// usage: loop N [PERIOD_US]
//   Prints "loop: pid=<pid> ready", waits for a line on stdin, then runs N
//   iterations (epoll_wait, read the timerfd, a little work) and prints
//   "result: iterations=N elapsed_ns=E cpu_ns=C" (C: the CPU time of the
//   whole process, which the syscall tracepoints the profiler attaches
//   are charged to).
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "../../tests/fixtures/common.h"

static volatile uint64_t sink;

static uint64_t cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s N [PERIOD_US]\n", argv[0]);
        return 2;
    }
    uint64_t n = strtoull(argv[1], NULL, 10);
    long period_us = argc > 2 ? strtol(argv[2], NULL, 10) : 100;
    if (period_us < 1 || period_us >= 1000000) {
        fprintf(stderr, "loop: PERIOD_US must be 1 to 999999\n");
        return 2;
    }
    int ep = epoll_create1(0);
    int tfd = timerfd_create(CLOCK_MONOTONIC, 0);
    struct itimerspec its = {.it_interval = {0, period_us * 1000}, .it_value = {0, period_us * 1000}};
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = tfd};
    if (ep < 0 || tfd < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, tfd, &ev)) {
        perror("loop: setup");
        return 2;
    }
    printf("loop: pid=%d ready\n", (int)getpid());
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin))
        return 2;
    timerfd_settime(tfd, 0, &its, NULL);
    uint64_t t0 = now_ns(), c0 = cpu_ns();
    for (uint64_t i = 0; i < n; i++) {
        struct epoll_event got;
        uint64_t ticks;
        if (epoll_wait(ep, &got, 1, -1) == 1 && read(tfd, &ticks, sizeof ticks) == sizeof ticks)
            sink += ticks;
        for (int k = 0; k < 200; k++)
            sink += k;
    }
    uint64_t elapsed = now_ns() - t0, cpu = cpu_ns() - c0;
    printf("result: iterations=%llu elapsed_ns=%llu cpu_ns=%llu\n", (unsigned long long)n,
           (unsigned long long)elapsed, (unsigned long long)cpu);
    fflush(stdout);
    return 0;
}
