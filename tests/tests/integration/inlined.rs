//! Symbolization with DWARF: a function inlined into another shows up as
//! its own `_[i]` frame, and the hottest frames carry `file:line`.
use profiler_tests::*;

#[test]
fn inlined_frames_and_file_line_from_dwarf() {
    require_root!();
    let exe = build_c("inlined.c", "inlined", &["-O2", "-g"]);
    let out = TempDir::new("inlined");
    // Under emulation the sampler takes tens of seconds to attach: the
    // fixture runs long enough for it (and is killed at the end).
    let secs = if emulated() { "90" } else { "3" };
    let mut fx = Fixture::spawn(&exe, &[secs]);
    fx.go();
    let fin = profiler(&[
        "sample",
        "--pid",
        &fx.pid.to_string(),
        "--duration",
        "1s",
        "--out",
        out.path().to_str().unwrap(),
    ]);
    assert!(fin.status.success(), "profiler sample failed: {fin:?}");
    let folded = read(out.path(), "cpu.folded");
    assert!(
        folded.lines().any(|l| l.contains("hot_loop;mix_[i] ")),
        "no inlined mix_[i] under hot_loop:\n{folded}"
    );
    let txt = read(out.path(), "cpu.txt");
    let mix = txt
        .lines()
        .find(|l| l.contains("mix_[i]"))
        .unwrap_or_else(|| panic!("{txt}"));
    assert!(
        mix.contains("(inlined.c:"),
        "no file:line for mix_[i]: {mix}"
    );
}
