/* bench_escalation [STALL_MS]: part r's server, for the throughput of a
 * program while `profiler watch` traces one of its stall groups and after
 * the probes come off. A single-threaded epoll HTTP/1.1 server on a
 * loopback port of the kernel's choosing, keep-alive. Every request runs
 * serve -> handle_request -> parse_body -> tokenize (noinline, frame
 * pointers: built -O2 -g -fno-omit-frame-pointer by xtask), a few µs of
 * work; `GET /slow` spins STALL_MS (default 200) in tokenize, a stall of
 * the same chain, so the functions escalation probes are the ones every
 * request runs. Each slow request prints its ground truth as it ends:
 *     stall DURATION_NS
 * It prints `ready pid=PID port=PORT` first and runs until killed. */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_CONNS 256
#define BUF 8192

static volatile unsigned long sink;

static inline __attribute__((always_inline)) unsigned long long clock_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
}

/* A request's parse: 500 rounds; a slow one's runs to its deadline. */
__attribute__((noinline)) void tokenize(const char *req, size_t len, unsigned long long ns)
{
    unsigned long long end = ns ? clock_ns() + ns : 0;
    do {
        for (int i = 0; i < 500; i++)
            sink += (unsigned long)(req[(size_t)i % len] ^ i);
    } while (ns && clock_ns() < end);
}

__attribute__((noinline)) void parse_body(const char *req, size_t len, unsigned long long ns)
{
    tokenize(req, len, ns);
    sink++;
}

__attribute__((noinline)) int handle_request(const char *req, size_t len, unsigned long long ns)
{
    parse_body(req, len, ns);
    sink++;
    return ns != 0;
}

struct conn {
    char buf[BUF];
    size_t len;
};

static struct conn *conns[MAX_CONNS];
static const char RESPONSE[] = "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n";

/* Answers every whole request in fd's buffer; -1 when it closed. */
__attribute__((noinline)) int serve(int fd, unsigned long long stall_ns)
{
    struct conn *c = conns[fd];
    ssize_t k = read(fd, c->buf + c->len, BUF - c->len);
    if (k <= 0)
        return k == 0 || errno != EAGAIN ? -1 : 0;
    c->len += (size_t)k;
    char *p = c->buf;
    size_t left = c->len;
    char *end;
    while ((end = memmem(p, left, "\r\n\r\n", 4)) != NULL) {
        size_t n = (size_t)(end - p) + 4;
        int slow = n >= 9 && memcmp(p, "GET /slow", 9) == 0;
        unsigned long long t0 = slow ? clock_ns() : 0;
        handle_request(p, n, slow ? stall_ns : 0);
        if (write(fd, RESPONSE, sizeof RESPONSE - 1) < 0)
            return -1;
        if (slow)
            printf("stall %llu\n", clock_ns() - t0);
        p += n;
        left -= n;
    }
    memmove(c->buf, p, left);
    c->len = left;
    return c->len == BUF ? -1 : 0;
}

int main(int argc, char **argv)
{
    unsigned long long stall_ns = (unsigned long long)(argc > 1 ? atol(argv[1]) : 200) * 1000000ull;
    setvbuf(stdout, NULL, _IOLBF, 0);
    int ls = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    int one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof a;
    if (bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, 128) ||
        getsockname(ls, (struct sockaddr *)&a, &alen)) {
        perror("bench_escalation: listen");
        return 1;
    }
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = ls};
    epoll_ctl(ep, EPOLL_CTL_ADD, ls, &ev);
    printf("ready pid=%d port=%d\n", getpid(), ntohs(a.sin_port));
    for (;;) {
        struct epoll_event out[64];
        int n = epoll_wait(ep, out, 64, -1);
        for (int i = 0; i < n; i++) {
            int fd = out[i].data.fd;
            if (fd == ls) {
                int c = accept4(ls, NULL, NULL, SOCK_NONBLOCK);
                if (c < 0)
                    continue;
                if (c >= MAX_CONNS) {
                    close(c);
                    continue;
                }
                setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                conns[c] = calloc(1, sizeof **conns);
                struct epoll_event cev = {.events = EPOLLIN, .data.fd = c};
                epoll_ctl(ep, EPOLL_CTL_ADD, c, &cev);
            } else if (serve(fd, stall_ns) < 0) {
                epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
                close(fd);
                free(conns[fd]);
                conns[fd] = NULL;
            }
        }
    }
}
