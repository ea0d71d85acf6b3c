//! The dispatcher's unit tests.
use super::*;
use profiler_common::KIND_EXIT;

fn call(ts_ns: u64, kind: u32, func: u32, sp: u64) -> Event {
    Event {
        ts_ns,
        tid: 1,
        word: Event::pack(kind, func),
        sp,
    }
}

fn wait(ts_ns: u64, exit: bool, is_loop: bool, sp: u64) -> Event {
    Event {
        ts_ns,
        tid: 1,
        word: Event::pack(
            profiler_common::KIND_WAIT,
            profiler_common::wait::word(232, 3, exit, is_loop),
        ),
        sp,
    }
}

/// An event loop's dispatcher: iterations bounded by its waits, slow
/// from 50 ns.
fn loop_config() -> Config {
    Config {
        tid: 1,
        thread_name: "main".into(),
        rule: "loop".into(),
        threshold_ns: 50,
        hang_ns: 1_000,
        frame_interval_ns: 16,
        full_tree: false,
        sample_period_ns: 0,
        wakers: true,
        wait_loop: true,
        preset: false,
    }
}

#[test]
fn loop_iterations_are_bounded_by_the_loops_own_wait() {
    let cfg = loop_config();
    let names = vec!["startup".to_string(), "handler".to_string()];
    let mut d = Dispatcher::new(cfg, 0, names, vec![true, true], 0);
    // Before any wait: outermost calls are dispatches.
    d.on_call(&call(0, KIND_ENTRY, 0, 0x1000));
    d.on_call(&call(10, KIND_EXIT, 0, 0x1008));
    assert_eq!(d.stats.count, 1);
    assert!(d.rule().contains("never waited"), "{}", d.rule());
    // The loop: a fast iteration, then a slow one with a traced
    // handler and a deeper wait inside it, which does not split it.
    d.on_wait(&wait(20, true, true, 0x2000));
    d.on_wait(&wait(25, false, true, 0x2000));
    d.on_wait(&wait(100, true, true, 0x2000));
    d.on_call(&call(110, KIND_ENTRY, 1, 0x1f00));
    d.on_wait(&wait(120, false, false, 0x1e00));
    d.on_wait(&wait(180, true, false, 0x1e00));
    d.on_call(&call(190, KIND_EXIT, 1, 0x1f08));
    assert!(
        d.is_open(),
        "a traced call's return does not end an iteration"
    );
    d.on_wait(&wait(200, false, true, 0x2000));
    assert!(!d.is_open());
    assert_eq!(d.stats.count, 3, "startup call, then two iterations");
    let notices = d.take_notices();
    let [Notice::Slow { duration_ns, .. }] = notices.as_slice() else {
        panic!("one slow iteration: {notices:?}");
    };
    assert_eq!(
        *duration_ns, 100,
        "from the loop wait's return to its next entry"
    );
    let tree = &d.slow[0].tree;
    assert_eq!(tree[0].name, explain::ITERATION_ROOT);
    assert!(tree.iter().any(|n| n.name == "handler"), "{tree:?}");
    assert!(d.rule().contains("epoll_wait on fd 3"), "{}", d.rule());
    assert_eq!((d.loop_wait.loop_waits, d.loop_wait.inner_waits), (2, 1));
}

/// A preset's functions, with the waits watched beside them.
fn preset_config() -> Config {
    Config {
        rule: "preset GLib: g_main_context_dispatch".into(),
        preset: true,
        ..loop_config()
    }
}

#[test]
fn a_preset_the_thread_never_calls_gives_way_to_its_waits() {
    let names = vec!["g_main_context_dispatch".to_string()];
    let mut d = Dispatcher::new(preset_config(), 0, names, vec![true], 0);
    // 25 loop waits, no preset call: given up at the 5th, whose iteration
    // is the first dispatch.
    let step = 100_000_000;
    for i in 1..=25u64 {
        d.on_wait(&wait(i * step, true, true, 0x2000));
        d.on_wait(&wait(i * step + 60, false, true, 0x2000));
    }
    let notices = d.take_notices();
    let lines: Vec<&String> = notices
        .iter()
        .filter_map(|n| match n {
            Notice::Note(l) => Some(l),
            _ => None,
        })
        .collect();
    assert_eq!(lines.len(), 1, "said once: {notices:?}");
    assert!(
        lines[0].contains("returned from 5 waits") && lines[0].contains("preset GLib"),
        "{}",
        lines[0]
    );
    assert!(d.by_waits());
    assert_eq!(d.stats.count, 21, "the iterations from the 5th wait on");
    assert!(d.rule().contains("were never called"), "{}", d.rule());
}

#[test]
fn startup_waits_at_sites_of_their_own_do_not_give_a_preset_up() {
    let names = vec!["uv__run_timers".to_string()];
    let mut d = Dispatcher::new(preset_config(), 0, names, vec![true], 0);
    // A program's startup: 4 futex waits, each at its own stack level,
    // before its loop's first wait.
    let futex = |ts: u64, exit: bool, sp: u64| {
        use profiler_common::wait::{word, NR_FUTEX};
        let mut w = wait(ts, exit, true, sp);
        let futex_word = word(u64::from(NR_FUTEX), 9, exit, true);
        w.word = Event::pack(profiler_common::KIND_WAIT, futex_word);
        w
    };
    for i in 1..=4u64 {
        d.on_wait(&futex(i * 10, false, 0x3000 - i * 0x100));
        d.on_wait(&futex(i * 10 + 5, true, 0x3000 - i * 0x100));
    }
    let step = 100_000_000;
    for i in 1..=4u64 {
        d.on_wait(&wait(i * step, true, true, 0x2000));
        d.on_call(&call(i * step + 10, KIND_ENTRY, 0, 0x1f00));
        d.on_call(&call(i * step + 20, KIND_EXIT, 0, 0x1f08));
        d.on_wait(&wait(i * step + 60, false, true, 0x2000));
    }
    assert!(d.take_notices().is_empty(), "the preset stands");
    assert!(!d.by_waits());
    assert_eq!(d.stats.count, 4, "one dispatch per preset call");
}

#[test]
fn a_preset_the_thread_calls_keeps_its_dispatches() {
    let names = vec!["g_main_context_dispatch".to_string()];
    let mut d = Dispatcher::new(preset_config(), 0, names, vec![true], 0);
    let step = 100_000_000;
    for i in 1..=30u64 {
        d.on_wait(&wait(i * step, true, true, 0x2000));
        d.on_call(&call(i * step + 10, KIND_ENTRY, 0, 0x1f00));
        d.on_call(&call(i * step + 20, KIND_EXIT, 0, 0x1f08));
        d.on_wait(&wait(i * step + 60, false, true, 0x2000));
    }
    assert!(!d.by_waits());
    assert_eq!(d.stats.count, 30, "one dispatch per preset call");
    assert!(d.take_notices().is_empty());
    assert_eq!(d.rule(), "preset GLib: g_main_context_dispatch");
}

#[test]
fn the_iteration_open_at_the_stop_ends_and_none_begins_after_it() {
    let cfg = loop_config();
    let mut d = Dispatcher::new(cfg, 0, vec!["handler".into()], vec![false], 0);
    d.on_wait(&wait(2, false, true, 0x2000));
    d.on_wait(&wait(10, true, true, 0x2000));
    d.stop_at(50);
    d.on_wait(&wait(120, false, true, 0x2000));
    assert_eq!(d.stats.count, 1, "the iteration open at the stop ends");
    assert_eq!(d.take_notices().len(), 1, "and is slow (110 ns)");
    // Probes detaching: the loop's waits are still seen, nothing else.
    d.on_wait(&wait(130, true, true, 0x2000));
    assert!(!d.is_open());
    d.on_wait(&wait(400, false, true, 0x2000));
    assert_eq!((d.stats.count, d.started_after_stop), (1, 1));
    // Idle in the loop's wait before the stop only (2 to 10): not the
    // waits after it, nor the one still in progress at the end.
    d.on_wait(&wait(500, true, true, 0x2000));
    d.on_wait(&wait(510, false, true, 0x2000));
    assert_eq!(d.loop_wait.idle_per_second(Some(900)), [8]);
    assert!(
        d.take_notices().is_empty(),
        "no slow iteration after the stop"
    );
}

#[test]
fn slow_dispatches_and_hangs_are_queued_as_notices() {
    let cfg = Config {
        tid: 1,
        thread_name: "main".into(),
        rule: "--dispatch run".into(),
        threshold_ns: 50,
        hang_ns: 100,
        frame_interval_ns: 16,
        full_tree: false,
        sample_period_ns: 0,
        wakers: true,
        wait_loop: false,
        preset: false,
    };
    let names = vec!["run".to_string(), "work".to_string()];
    let mut d = Dispatcher::new(cfg, 0, names, vec![true, false], 0);
    d.on_call(&call(0, KIND_ENTRY, 0, 0x1000));
    d.on_call(&call(10, KIND_ENTRY, 1, 0x0f00));
    d.tick(90);
    assert!(d.take_notices().is_empty(), "not a hang before --hang");
    d.tick(120);
    d.tick(130);
    assert_eq!(
        d.take_notices(),
        [Notice::Hang {
            index: 0,
            tid: 1,
            running_ns: 120,
            stack: vec!["work".into(), "run".into()],
        }],
        "one notice per hang, while it runs"
    );
    d.on_call(&call(140, KIND_EXIT, 1, 0x0f08));
    d.on_call(&call(150, KIND_EXIT, 0, 0x1008));
    let notices = d.take_notices();
    let [Notice::Slow { duration_ns, .. }] = notices.as_slice() else {
        panic!("one slow-dispatch notice: {notices:?}");
    };
    assert_eq!(*duration_ns, 150);
    assert_eq!(d.hangs[0].duration_ns, Some(150));
    d.on_call(&call(200, KIND_ENTRY, 0, 0x1000));
    d.on_call(&call(210, KIND_EXIT, 0, 0x1008));
    assert!(d.take_notices().is_empty(), "a fast dispatch is not told");
    assert_eq!(d.stats.count, 2);
}

#[test]
fn a_hang_is_told_while_a_slow_dispatchs_names_are_still_being_read() {
    let mut d = slow_to_name();
    d.on_call(&call(0, KIND_ENTRY, 0, 0x1000));
    d.on_sample(
        50,
        &[0x1234, 0x5678],
        &[],
        profiler_common::unwind_end::ROOT,
    );
    let began = std::time::Instant::now();
    d.on_call(&call(100, KIND_EXIT, 0, 0x1008));
    // The next dispatch hangs while the slow one's sampled frames are
    // still being named.
    d.on_call(&call(200, KIND_ENTRY, 0, 0x1000));
    d.tick(1_300);
    assert!(
        began.elapsed() < Duration::from_millis(200),
        "the thread that reads the rings waited {:?} for names",
        began.elapsed()
    );
    let notices = d.take_notices();
    assert!(
        matches!(notices.as_slice(), [Notice::Hang { index: 1, .. }]),
        "the hang is told at once, the slow dispatch once named: {notices:?}"
    );
    // Named later, on a tick.
    let waited = std::time::Instant::now();
    while !d.deferred.is_empty() && waited.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
        d.explain_waiting();
    }
    assert!(d.deferred.is_empty(), "explained within 5 s");
    assert_eq!((d.slow.len(), d.slow[0].index), (1, 0));
    let notices = d.take_notices();
    assert!(
        matches!(notices.as_slice(), [Notice::Slow { .. }]),
        "{notices:?}"
    );
    d.on_call(&call(2_000, KIND_EXIT, 0, 0x1008));
    d.finish();
    assert_eq!(d.slow.len(), 2, "the hang, slow too, explained at the end");
}

#[test]
fn the_end_of_a_recording_waits_for_the_names_still_being_read() {
    let pid = std::process::id();
    let mut d = Dispatcher::new(config(50, 1_000), pid, vec!["run".into()], vec![true], 0);
    d.set_symbolizer(Symbolizer::slowed(pid, Duration::from_millis(200)));
    d.live();
    for (i, t) in [0u64, 1_000].into_iter().enumerate() {
        d.on_call(&call(t, KIND_ENTRY, 0, 0x1000));
        d.on_sample(
            t + 50,
            &[0x1234 + i as u64],
            &[],
            profiler_common::unwind_end::ROOT,
        );
        d.on_call(&call(t + 100, KIND_EXIT, 0, 0x1008));
    }
    assert_eq!(d.deferred.len(), 2, "both wait for names");
    d.finish();
    assert_eq!(d.deferred.len(), 0);
    let indexes: Vec<u64> = d.slow.iter().map(|s| s.index).collect();
    assert_eq!(indexes, [0, 1], "explained, in order");
    assert_eq!(d.take_notices().len(), 2);
}

#[test]
fn a_hang_blocked_in_a_sleep_is_told_where_it_blocked() {
    // run { sleeps in clock_nanosleep <- debug_command }, past --hang:
    // never sampled, as a blocked thread is not; its line names where
    // it blocked. A sample taken before the block is older, so not it.
    let n = |s: &str| vec![s.to_string()];
    let journal = vec![
        (7, 0x1000, n("clock_nanosleep")),
        (7, 0x1fff, n("debug_command")),
        (7, 0x2fff, n("run")),
        (7, 0x3000, n("parse")),
    ];
    let mut d = Dispatcher::new(config(50, 1_000), 7, vec!["run".to_string()], vec![true], 0);
    d.set_symbolizer(Symbolizer::offline(7, journal));
    d.on_call(&call(0, KIND_ENTRY, 0, 0x1000));
    d.on_sample(
        10,
        &[0x3000, 0x3000],
        &[],
        profiler_common::unwind_end::ROOT,
    );
    d.on_switch_out(20, true, Some((&[0x1000, 0x2000, 0x3000], &[])));
    d.tick(1_100);
    let notices = d.take_notices();
    let [Notice::Hang { stack, .. }] = notices.as_slice() else {
        panic!("one hang: {notices:?}");
    };
    assert_eq!(
        stack,
        &[
            "clock_nanosleep (blocked)",
            "debug_command (blocked)",
            "run"
        ],
        "where it blocked, down to its innermost traced call"
    );
    // A dispatch with nothing known past its start says so.
    assert_eq!(
        hang_stack_text(&[]),
        "no traced call open, and no sample or blocked stack of it yet"
    );
}

#[test]
fn a_hang_waits_a_moment_for_its_frames_names_then_says_they_are_pending() {
    let mut d = slow_to_name();
    d.on_call(&call(0, KIND_ENTRY, 0, 0x1000));
    d.on_sample(
        50,
        &[0x1234, 0x5678],
        &[],
        profiler_common::unwind_end::ROOT,
    );
    d.tick(1_100);
    assert!(
        d.take_notices().is_empty(),
        "past --hang, its sampled frames' names are waited for"
    );
    d.tick(1_000 + HANG_NAMES_WAIT_NS);
    let notices = d.take_notices();
    let [Notice::Hang { stack, .. }] = notices.as_slice() else {
        panic!("told once the wait is over: {notices:?}");
    };
    assert_eq!(stack, &[NAMES_PENDING, "run"], "with its traced calls");
}

/// A live dispatcher (`run` its dispatch function, --hang 1000 ns)
/// whose every name takes 300 ms to read, as a large binary's symbols
/// do the first time (seconds on a slow machine).
fn slow_to_name() -> Dispatcher {
    let mut d = Dispatcher::new(
        config(50, 1_000),
        std::process::id(),
        vec!["run".to_string()],
        vec![true],
        0,
    );
    d.set_symbolizer(Symbolizer::slowed(
        std::process::id(),
        Duration::from_millis(300),
    ));
    d.live();
    d
}

/// A dispatcher whose kernel addresses 0xa000 (uprobe handling) and
/// 0xb000 (a syscall's wait) are named, one sample standing for 10 ns.
fn with_kernel_names() -> Dispatcher {
    let mut cfg = config(100, 10_000);
    cfg.sample_period_ns = 10;
    let mut d = Dispatcher::new(cfg, 7, vec!["run".to_string()], vec![true], 0);
    // Durations corrected: run's hits are outside its own duration.
    d.set_costs(vec![ProbeCost {
        entry_ns: 1,
        exit_ns: 1,
        inside_ns: 0,
    }]);
    d.set_symbolizer(Symbolizer::offline(
        7,
        [
            (0, 0xa000, vec!["uprobe_notify_resume".to_string()]),
            (0, 0xb000, vec!["ep_poll".to_string()]),
        ],
    ));
    d
}

#[test]
fn a_callers_corrected_time_never_ends_shorter_than_its_traced_calls() {
    // work's two hits are calibrated at 40 ns each: more than run's
    // 30 ns around work. run is not taken below work's 100 ns.
    let names = vec!["run".to_string(), "work".to_string()];
    let mut d = Dispatcher::new(config(10, 10_000), 0, names, vec![true, false], 0);
    d.set_costs(vec![
        ProbeCost::default(),
        ProbeCost {
            entry_ns: 40,
            exit_ns: 40,
            inside_ns: 0,
        },
    ]);
    d.on_call(&call(0, KIND_ENTRY, 0, 0x1000));
    d.on_call(&call(10, KIND_ENTRY, 1, 0x0f00));
    d.on_call(&call(110, KIND_EXIT, 1, 0x0f08));
    d.on_call(&call(130, KIND_EXIT, 0, 0x1008));
    d.finish();
    let tree = &d.slow[0].tree;
    let total = |name: &str| tree.iter().find(|n| n.name == name).unwrap().total_ns;
    assert_eq!((total("run"), total("work")), (100, 100), "{tree:?}");
}

/// run lasts `10 * n` ns, sampled every 10 ns: `n` samples, the first
/// `in_probes` of them inside uprobe handling (kernel address 0xa000).
fn run_with_probe_samples(d: &mut Dispatcher, n: u64, in_probes: u64) {
    d.on_call(&call(0, KIND_ENTRY, 0, 0x1000));
    for i in 0..n {
        let kernel: &[u64] = if i < in_probes { &[0xa000] } else { &[] };
        d.on_sample(
            5 + i * 10,
            &[0x1234],
            kernel,
            profiler_common::unwind_end::ROOT,
        );
    }
    d.on_call(&call(n * 10, KIND_EXIT, 0, 0x1008));
    d.finish();
}

#[test]
fn time_sampled_in_the_probes_handling_is_taken_out_before_judging() {
    // run lasts 170 ns, 17 samples: 16 inside uprobe handling, which
    // prove 16 - 2·4 = 8 periods (80 ns) of the probes' own. Calibrated
    // hits: none. It ran 90 ns without them, but its wall time, what the
    // user felt, is over the threshold: slow, flagged as slow mainly
    // because of the probes, and their share said (issue 44).
    let mut d = with_kernel_names();
    run_with_probe_samples(&mut d, 17, 16);
    assert_eq!(d.stats.count, 1);
    assert_eq!((d.slow.len(), d.groups.len()), (1, 1), "slow");
    assert!(d.slow[0].probes_mainly);
    assert_eq!((d.slow[0].duration_ns, d.slow[0].probe_ns), (90, 80));
    assert!(
        d.slow[0].verdict.ends_with(
            " (lasted 170 ns, of which ~80 ns in the profiler's probes: slow mainly because of \
             them, under the threshold without their estimated cost; a loop that runs to a \
             deadline lasts as long without them)"
        ),
        "{}",
        d.slow[0].verdict
    );
    let [Notice::Slow { duration_ns, .. }] = d.take_notices()[..] else {
        panic!("one notice")
    };
    assert_eq!(duration_ns, 170, "the notice tells the wall time");
    assert_eq!(d.slow_only_with_probes, 1);
    assert_eq!(d.probe_ns, 80);
    assert_eq!(d.stats.worst()[0].duration_ns, 90);
    // `--raw-durations` (every cost zero): as measured, slow.
    let mut d = with_kernel_names();
    d.set_costs(vec![ProbeCost::default()]);
    run_with_probe_samples(&mut d, 17, 16);
    assert_eq!(
        (d.slow.len(), d.slow_only_with_probes, d.probe_ns),
        (1, 0, 0)
    );
    assert_eq!(d.slow[0].duration_ns, 170);
}

#[test]
fn one_sample_in_a_probe_hit_takes_nothing_out() {
    // A hit of a few ns caught by one 10-ns sample: the dispatch is not
    // made 10 ns shorter than the code it ran.
    let mut d = with_kernel_names();
    run_with_probe_samples(&mut d, 12, 1);
    assert_eq!((d.slow.len(), d.probe_ns), (1, 0));
    assert_eq!(d.slow[0].duration_ns, 120);
}

#[test]
fn time_blocked_in_the_probes_handling_is_taken_out_and_other_blocking_is_not() {
    // Blocked 60 ns waiting in uprobe handling (the kernel's probe
    // registration held a lock): 130 - 60 = 70 ns, slow as felt but
    // mainly because of the probes. The same wait in epoll is the
    // program's: 130 ns, slow.
    for (kernel, mainly, probe_ns) in [(0xa000, true, 60), (0xb000, false, 0)] {
        let mut d = with_kernel_names();
        d.on_call(&call(0, KIND_ENTRY, 0, 0x1000));
        d.on_switch_out(20, true, Some((&[0x1234], &[kernel])));
        d.on_wakeup(80);
        d.on_switch_in(80);
        d.on_call(&call(130, KIND_EXIT, 0, 0x1008));
        d.finish();
        assert_eq!(d.stats.count, 1);
        assert_eq!(d.slow.len(), 1, "kernel stack {kernel:#x}");
        assert_eq!(d.slow[0].probes_mainly, mainly);
        assert_eq!(
            d.slow[0].verdict.contains("in the profiler's probes"),
            mainly,
            "{}",
            d.slow[0].verdict
        );
        assert_eq!(d.slow_only_with_probes, u64::from(mainly));
        assert_eq!(d.probe_ns, probe_ns, "kernel stack {kernel:#x}");
        assert_eq!(d.stats.worst()[0].duration_ns, 130 - probe_ns);
    }
}

#[test]
fn waits_in_the_probes_handling_are_not_the_programs_blocking_stacks() {
    // run: 200 ns, blocked 60 ns in uprobe handling, then 50 ns in
    // epoll. 140 ns is slow; only the epoll wait is its blocking.
    let mut d = with_kernel_names();
    d.on_call(&call(0, KIND_ENTRY, 0, 0x1000));
    for (out, back, kernel) in [(20, 80, 0xa000), (100, 150, 0xb000)] {
        d.on_switch_out(out, true, Some((&[0x1234], &[kernel])));
        d.on_wakeup(back);
        d.on_switch_in(back);
    }
    d.on_call(&call(200, KIND_EXIT, 0, 0x1008));
    d.finish();
    assert_eq!(d.slow.len(), 1);
    let s = &d.slow[0];
    assert_eq!((s.duration_ns, s.split.blocked_ns), (140, 50));
    assert_eq!(s.blocking_stacks.len(), 1, "{:?}", s.blocking_stacks);
    assert_eq!(s.blocking_stacks[0].0, 50);
    assert_eq!(s.blocking_stacks[0].1[0], "ep_poll_[k]");
}

fn config(threshold_ns: u64, hang_ns: u64) -> Config {
    Config {
        tid: 1,
        thread_name: "main".into(),
        rule: "--dispatch run".into(),
        threshold_ns,
        hang_ns,
        frame_interval_ns: 16,
        full_tree: false,
        sample_period_ns: 0,
        wakers: true,
        wait_loop: false,
        preset: false,
    }
}

#[test]
fn detached_frames_close_at_the_detach_and_the_dispatch_ends_at_its_return() {
    // run { call { hash x150 } }: hash is detached at 500; its returns
    // never come. No hang; the dispatch ends at run's return, and its
    // tree marks the hash frames detached.
    let names = vec!["run".to_string(), "call".to_string(), "hash".to_string()];
    let mut d = Dispatcher::new(config(50, 600), 0, names, vec![true, false, false], 0);
    d.on_call(&call(0, KIND_ENTRY, 0, 0x10000));
    d.on_call(&call(10, KIND_ENTRY, 1, 0xf000));
    for i in 0..150 {
        d.on_call(&call(20 + i, KIND_ENTRY, 2, 0xe000 - i * 64));
    }
    d.on_detached(&[2], 500);
    assert!(d.is_open());
    // It really runs past --hang: its stack no longer holds hash.
    d.tick(650);
    assert_eq!(
        d.take_notices(),
        [Notice::Hang {
            index: 0,
            tid: 1,
            running_ns: 650,
            stack: vec!["call".into(), "run".into()],
        }]
    );
    d.on_call(&call(700, KIND_EXIT, 1, 0xf008));
    d.on_call(&call(800, KIND_EXIT, 0, 0x10008));
    assert!(!d.is_open());
    assert_eq!(d.hangs[0].duration_ns, Some(800));
    assert_eq!(d.stats.count, 1);
    assert_eq!(d.ended_by_detach, 0);
    let s = &d.slow[0];
    assert_eq!((s.duration_ns, s.detached_frames), (800, 150));
    let hash = s
        .tree
        .iter()
        .find(|n| n.name == "hash")
        .expect("hash in the tree");
    assert_eq!(hash.detached, hash.calls, "{:?}", s.tree);
    assert!(hash.total_ns <= 500, "{hash:?}");
}

#[test]
fn a_detached_dispatch_function_ends_its_dispatch_at_the_detach() {
    // The fallback rule: every function is a dispatch function, and
    // any may be detached. The outermost one's return never comes.
    let names = vec!["outer".to_string(), "inner".to_string()];
    let mut d = Dispatcher::new(config(50, 100), 0, names, vec![true, true], 0);
    d.on_call(&call(10, KIND_ENTRY, 0, 0x1000));
    d.on_call(&call(20, KIND_ENTRY, 1, 0x0f00));
    d.on_call(&call(30, KIND_EXIT, 1, 0x0f08));
    d.on_detached(&[0], 60);
    assert!(!d.is_open());
    assert_eq!((d.stats.count, d.ended_by_detach), (1, 1));
    assert_eq!(d.stats.worst()[0].duration_ns, 50);
    // Later dispatches open and end as usual.
    d.on_call(&call(200, KIND_ENTRY, 1, 0x1000));
    d.on_call(&call(230, KIND_EXIT, 1, 0x1008));
    d.tick(1000);
    assert!(d
        .take_notices()
        .iter()
        .all(|n| !matches!(n, Notice::Hang { .. })));
    assert_eq!(d.stats.count, 2);
}

#[test]
fn a_dispatch_whose_return_is_never_seen_ends_at_its_last_event() {
    // outer(0x1000) { inner(0xf00) }, outer's return lost; the next
    // outermost call (same stack level, 900 later) proves it gone: the
    // first dispatch ends at its last event (inner's return, 40), not at
    // 900 or never.
    let names = vec!["outer".to_string(), "inner".to_string()];
    let mut d = Dispatcher::new(config(50, 100), 0, names, vec![true, false], 0);
    d.on_call(&call(0, KIND_ENTRY, 0, 0x1000));
    d.on_call(&call(10, KIND_ENTRY, 1, 0x0f00));
    d.on_call(&call(40, KIND_EXIT, 1, 0x0f08));
    d.on_switch_out(45, true, None);
    d.on_wakeup(890);
    d.on_switch_in(895);
    d.on_call(&call(900, KIND_ENTRY, 0, 0x1000));
    assert_eq!((d.stats.count, d.ended_unseen), (1, 1));
    assert_eq!(d.stats.worst()[0].duration_ns, 40);
    assert!(d.is_open(), "the new call opens the next dispatch");
    d.on_call(&call(920, KIND_EXIT, 0, 0x1008));
    assert_eq!(d.stats.count, 2);
    d.tick(5000);
    assert!(d.take_notices().is_empty(), "no hang, nothing slow");
}

/// A wake-up of the watched thread out of its loop's wait, by thread 7.
fn loop_wake(ts_ns: u64, pid: u32) -> wakers::WakeRec {
    wakers::WakeRec {
        ts_ns,
        tid: 7,
        pid,
        comm: "notifier".into(),
        kernel_thread: false,
        user: Box::new([]),
        kernel: Box::new([]),
        loop_wake: true,
    }
}

#[test]
fn an_iteration_is_sourced_by_who_woke_its_loop_read_before_or_after_its_start() {
    let pid = std::process::id();
    let mut d = Dispatcher::new(loop_config(), pid, vec!["h".into()], vec![true], 0);
    d.on_wait(&wait(10, false, true, 0x2000));
    // Read before the wait's return (from the waker's CPU).
    d.on_waker(loop_wake(95, pid));
    d.on_wait(&wait(100, true, true, 0x2000));
    d.on_wait(&wait(200, false, true, 0x2000));
    // Read after the return it caused.
    d.on_wait(&wait(300, true, true, 0x2000));
    d.on_waker(loop_wake(290, pid));
    d.on_wait(&wait(400, false, true, 0x2000));
    // A wait that never blocked: no wake-up, and none carried over from
    // the one before.
    d.on_wait(&wait(500, true, true, 0x2000));
    d.on_wait(&wait(600, false, true, 0x2000));
    // A wake-up out of the next wait, read before this iteration ends,
    // is the next iteration's.
    d.on_wait(&wait(700, true, true, 0x2000));
    d.on_waker(loop_wake(805, pid));
    d.on_wait(&wait(800, false, true, 0x2000));
    d.on_wait(&wait(810, true, true, 0x2000));
    d.on_wait(&wait(900, false, true, 0x2000));
    let who: Vec<Option<String>> = d
        .slow
        .iter()
        .map(|s| s.source.as_ref().map(|w| w.who()))
        .collect();
    let by_7 = Some("notifier (tid 7)".to_string());
    assert_eq!(
        who,
        vec![by_7.clone(), by_7.clone(), None, None, by_7],
        "each iteration's source"
    );
    let s = d.slow[0].source.as_ref().unwrap();
    assert_eq!(
        (s.kind, s.wakes_ns.as_slice()),
        (wakers::WakerKind::Thread, &[95][..])
    );
}
