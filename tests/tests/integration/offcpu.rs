//! `--off-cpu`: time blocked, by stack, against the fixture's own
//! measurement of its sleeps.
use profiler_tests::*;

#[test]
fn blocked_time_is_attributed_to_the_sleeping_chain() {
    require_root!();
    let exe = build_c(
        "offcpu.c",
        "offcpu",
        &["-O1", "-g", "-fno-omit-frame-pointer"],
    );
    let out = TempDir::new("offcpu");
    let mut fx = Fixture::spawn(&exe, &["10", "50"]);
    let rec = Recording::start(fx.pid, out.path(), &["--func", "wait_io", "--off-cpu"]);
    let truth = fx.run();
    let fin = rec.wait();
    assert!(fin.status.success(), "profiler failed: {fin:?}");
    let slept = truth["slept_ns"].as_u64().expect("slept_ns");

    let folded_text = read(out.path(), "offcpu.folded");
    let mut in_waiter = 0u64;
    for line in folded_text.lines() {
        let (stack, ns) = line.rsplit_once(' ').expect("folded line");
        let ns: u64 = ns.parse().expect("weight");
        if stack.split(';').any(|f| f == "waiter") {
            assert!(
                stack.contains("_[k]"),
                "no kernel frames in a blocked stack: {stack}"
            );
            in_waiter += ns;
        }
    }
    // Off-CPU time runs from switch-out to switch-in: the sleep plus the
    // wait for a CPU after the wake-up, minus the bit of each call spent
    // running. 10% covers both on a loaded 2-CPU machine.
    eprintln!("off-CPU under waiter: {in_waiter} ns; fixture slept {slept} ns");
    assert!(
        in_waiter.abs_diff(slept) * 10 <= slept,
        "off-CPU time under waiter {in_waiter} ns vs {slept} ns slept:\n{folded_text}"
    );
    // The traced wait_io calls agree too, exactly counted.
    let o = Outputs::load(out.path());
    assert_eq!(o.sum("wait_io", "calls"), 10);
    for name in ["offcpu.svg", "offcpu.txt"] {
        assert!(out.join(name).exists(), "no {name}");
    }
}
