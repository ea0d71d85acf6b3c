// demo_app: a single-threaded UI-style event loop, used by `cargo xtask demo`.
//
// The main thread waits on a 16 ms timerfd (one "vsync" tick), turns each tick
// into a few events on a deterministic schedule, and dispatches every event
// through dispatch_event() to a named handler. Most handlers take microseconds;
// a few are slow on purpose, the way real main threads are slow:
//
//   tick % 25 == 12   parse_json() of a large "sync" payload  ~80 ms CPU
//   tick % 40 == 30   layout() of a full relayout            ~150 ms CPU
//   tick % 60 == 45   save_state() -> fsync() of a temp file  disk-bound
//                     plus compress_snapshot()                ~50 ms CPU
//   tick % 90 == 70   load_thumbnail() blocked in nanosleep  ~250 ms off-CPU
//   tick % 150 == 149 render_frame() of an animation frame  ~300 ms CPU
//   tick % 60 == 20   apply_edit() waits for the document lock, which the
//                     "autosave" thread holds while flush_to_disk() ->
//                     compress_block() spins ~150 ms: the waker chain
//
// It prints one line, "demo_app: pid=<pid> ready", then runs until killed.
// Build: gcc -O1 -g -fno-omit-frame-pointer -pthread -o demo_app demo_app.c
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "../../tests/fixtures/common.h"

#define NOINLINE __attribute__((noinline))

enum event_kind { EV_INPUT, EV_NETWORK, EV_FRAME, EV_SAVE, EV_THUMBNAIL, EV_EDIT };

struct event {
    enum event_kind kind;
    uint64_t tick;
    unsigned size; // payload size, or work amount, chosen by the schedule
};

struct app_state {
    uint64_t frames;
    uint64_t inputs;
    uint64_t messages;
    uint64_t checksum;
    char doc[4096];
};

static struct app_state app;
static char json_buf[64 * 1024];
static volatile uint64_t sink;

// Spin on real work until `ns` nanoseconds have passed. Inlined, so the time
// lands in the self time of the handler that calls it.
static inline __attribute__((always_inline)) uint64_t burn_cpu(uint64_t ns, uint64_t seed)
{
    uint64_t end = now_ns() + ns, h = seed | 1;
    do {
        for (int i = 0; i < 2000; i++)
            h = (h ^ (h >> 29)) * 0xbf58476d1ce4e5b9ull + (uint64_t)i;
    } while (now_ns() < end);
    return h;
}

NOINLINE unsigned measure_text(const char *s, unsigned len)
{
    unsigned width = 0;
    for (unsigned i = 0; i < len; i++)
        width += (unsigned char)s[i] % 7 + 4;
    return width;
}

NOINLINE uint64_t parse_json(const char *buf, unsigned len)
{
    // A tiny tokenizer: count structural characters and hash string bytes.
    uint64_t h = 1469598103934665603ull;
    unsigned depth = 0, strings = 0;
    int in_str = 0;
    for (unsigned i = 0; i < len; i++) {
        char c = buf[i];
        if (in_str) {
            if (c == '"')
                in_str = 0, strings++;
            else
                h = (h ^ (unsigned char)c) * 1099511628211ull;
        } else if (c == '"') {
            in_str = 1;
        } else if (c == '{' || c == '[') {
            depth++;
        } else if (c == '}' || c == ']') {
            depth--;
        }
    }
    // Large payloads stand for a slow, allocation-heavy parser.
    if (len > 32 * 1024)
        h ^= burn_cpu(80 * 1000000ull, h);
    return h + depth + strings;
}

NOINLINE void handle_input(const struct event *ev)
{
    // Keystrokes carry a small JSON payload from the input method.
    unsigned len = (unsigned)snprintf(json_buf, sizeof json_buf,
                                      "{\"key\":\"k%llu\",\"mods\":[\"shift\"],\"repeat\":%u}",
                                      (unsigned long long)ev->tick, ev->size);
    app.checksum += parse_json(json_buf, len);
    app.inputs++;
}

NOINLINE void handle_network(const struct event *ev)
{
    // A sync message: usually small; a large one every so often.
    unsigned len = ev->size < sizeof json_buf - 1 ? ev->size : sizeof json_buf - 1;
    for (unsigned i = 0; i < len; i++)
        json_buf[i] = "{\"id\":1,\"v\":[1,2,3]}"[i % 20];
    app.checksum += parse_json(json_buf, len);
    app.messages++;
}

NOINLINE unsigned layout(unsigned work)
{
    unsigned total = 0;
    for (unsigned line = 0; line < 32; line++)
        total += measure_text(app.doc + line * 64, 64);
    // A full relayout (window resize, font change) walks the whole tree.
    if (work > 1)
        total += (unsigned)burn_cpu(150 * 1000000ull, total);
    return total;
}

NOINLINE void paint_layers(unsigned n)
{
    uint64_t h = n;
    for (unsigned i = 0; i < n * 100; i++)
        h = h * 6364136223846793005ull + i;
    sink = h;
}

NOINLINE void render_frame(const struct event *ev)
{
    unsigned w = layout(ev->size);
    paint_layers(8);
    // An expensive animation frame (blur + shadow) now and then.
    if (ev->tick % 150 == 149)
        sink = burn_cpu(300 * 1000000ull, w);
    app.frames++;
}

NOINLINE uint64_t compress_snapshot(void)
{
    return burn_cpu(50 * 1000000ull, app.checksum);
}

NOINLINE int save_state(void)
{
    char path[] = "/var/tmp/demo_app-state-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0)
        return -1;
    uint64_t c = compress_snapshot();
    int ok = write(fd, app.doc, sizeof app.doc) == (ssize_t)sizeof app.doc &&
             write(fd, &c, sizeof c) == (ssize_t)sizeof c;
    // The classic main-thread mistake: a synchronous fsync on the UI thread.
    if (fsync(fd) != 0)
        ok = 0;
    close(fd);
    unlink(path);
    return ok ? 0 : -1;
}

NOINLINE void load_thumbnail(const struct event *ev)
{
    // A blocking read from a slow network share, simulated by sleeping.
    struct timespec ts = { 0, (long)ev->size * 1000000L };
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
    app.checksum += ev->size;
}

// The autosave thread: told to save, it takes the document lock and
// compresses the document while holding it.
static pthread_mutex_t doc_lock = PTHREAD_MUTEX_INITIALIZER;
static sem_t autosave_go, autosave_locked;

NOINLINE uint64_t compress_block(void)
{
    return burn_cpu(150 * 1000000ull, app.checksum);
}

NOINLINE void flush_to_disk(void)
{
    sink = compress_block();
    pthread_mutex_unlock(&doc_lock);
}

static void *autosave_main(void *arg)
{
    (void)arg;
    pthread_setname_np(pthread_self(), "autosave");
    for (;;) {
        sem_wait(&autosave_go);
        pthread_mutex_lock(&doc_lock);
        sem_post(&autosave_locked);
        flush_to_disk();
    }
    return NULL;
}

NOINLINE void apply_edit(const struct event *ev)
{
    // Edits need the document: they wait while an autosave holds it.
    pthread_mutex_lock(&doc_lock);
    app.doc[ev->tick % sizeof app.doc] ^= 1;
    pthread_mutex_unlock(&doc_lock);
}

NOINLINE void dispatch_event(const struct event *ev)
{
    switch (ev->kind) {
    case EV_INPUT:
        handle_input(ev);
        break;
    case EV_NETWORK:
        handle_network(ev);
        break;
    case EV_FRAME:
        render_frame(ev);
        break;
    case EV_SAVE:
        save_state();
        break;
    case EV_THUMBNAIL:
        load_thumbnail(ev);
        break;
    case EV_EDIT:
        apply_edit(ev);
        break;
    }
}

// The deterministic schedule: which events a given tick produces.
NOINLINE unsigned schedule_events(uint64_t tick, struct event *out)
{
    unsigned n = 0;
    if (tick % 60 == 20) {
        // Between ticks, the autosave starts and holds the document; the
        // edit is handled first.
        sem_post(&autosave_go);
        sem_wait(&autosave_locked);
        out[n++] = (struct event){ EV_EDIT, tick, 0 };
    }
    out[n++] = (struct event){ EV_INPUT, tick, (unsigned)(tick % 3) };
    if (tick % 5 == 0 || tick % 25 == 12)
        out[n++] = (struct event){ EV_NETWORK, tick, tick % 25 == 12 ? 48 * 1024 : 256 };
    out[n++] = (struct event){ EV_FRAME, tick, tick % 40 == 30 ? 2 : 1 };
    if (tick % 60 == 45)
        out[n++] = (struct event){ EV_SAVE, tick, 0 };
    if (tick % 90 == 70)
        out[n++] = (struct event){ EV_THUMBNAIL, tick, 250 };
    return n;
}

NOINLINE int wait_for_tick(int tfd, uint64_t *expirations)
{
    struct pollfd pfd = { .fd = tfd, .events = POLLIN };
    for (;;) {
        int r = poll(&pfd, 1, -1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -1;
        if (read(tfd, expirations, sizeof *expirations) == (ssize_t)sizeof *expirations)
            return 0;
    }
}

NOINLINE void run_event_loop(int tfd)
{
    struct event queue[8];
    uint64_t tick = 0, expirations;
    for (;;) {
        if (wait_for_tick(tfd, &expirations) != 0) {
            perror("demo_app: poll");
            exit(1);
        }
        // Ticks missed while a slow handler ran are coalesced, like vsync.
        unsigned n = schedule_events(tick, queue);
        for (unsigned i = 0; i < n; i++)
            dispatch_event(&queue[i]);
        tick++;
    }
}

int main(void)
{
    for (unsigned i = 0; i < sizeof app.doc; i++)
        app.doc[i] = (char)('a' + i % 26);
    sem_init(&autosave_go, 0, 0);
    sem_init(&autosave_locked, 0, 0);
    pthread_t saver;
    pthread_create(&saver, NULL, autosave_main, NULL);
    int tfd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC);
    if (tfd < 0) {
        perror("demo_app: timerfd_create");
        return 1;
    }
    struct itimerspec its = { .it_interval = { 0, 16000000 }, .it_value = { 0, 16000000 } };
    if (timerfd_settime(tfd, 0, &its, NULL) != 0) {
        perror("demo_app: timerfd_settime");
        return 1;
    }
    printf("demo_app: pid=%d ready\n", getpid());
    fflush(stdout);
    run_event_loop(tfd);
    return 0;
}
