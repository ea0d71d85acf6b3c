//! `cargo xtask demo`: profile the bundled event-loop program for a few
//! seconds and show where the report, the JSON and the flame graph went.

use std::process::Command;

use anyhow::{bail, Result};

use crate::proc::Target;
use crate::util::{exec, gcc, profiler_bin, workspace_root};

#[derive(clap::Args)]
pub struct Args {
    /// How long to record.
    #[arg(long, default_value = "5s")]
    duration: String,
    /// Function globs to probe (default: the demo's own functions).
    #[arg(long = "func")]
    funcs: Vec<String>,
}

impl Default for Args {
    fn default() -> Self {
        Args {
            duration: "5s".into(),
            funcs: Vec::new(),
        }
    }
}

/// The globs that cover the demo's call tree, from the loop down to the leaves.
const DEFAULT_FUNCS: &[&str] = &[
    "run_event_loop",
    "wait_for_tick",
    "schedule_events",
    "handle_*",
    "parse_json",
    "layout",
    "measure_text",
    "render_frame",
    "paint_layers",
    "save_state",
    "compress_snapshot",
    "load_thumbnail",
    "apply_edit",
];

pub fn run(args: &Args) -> Result<()> {
    crate::build()?;
    let root = workspace_root();
    let exe = root.join("target/xtask/demo_app");
    gcc(
        &root.join("xtask/demo/demo_app.c"),
        &exe,
        &["-O1", "-g", "-fno-omit-frame-pointer", "-pthread"],
    )?;

    let mut target = Target::start(&mut Command::new(&exe))?;
    let pid = target.pid();
    eprintln!("demo: started {} as pid {pid}", exe.display());

    let out = root.join("prof-demo");
    let mut cmd = Command::new(profiler_bin());
    // The headline feature: slow dispatches of the main thread's event loop,
    // explained (call tree, on-CPU vs blocked, samples), plus CPU samples.
    cmd.args(["record", "--pid", &pid.to_string(), "--out"])
        .arg(&out)
        .args(["--duration", &args.duration])
        .args([
            "--dispatch",
            "dispatch_event",
            "--threshold",
            "50ms",
            "--sample",
        ]);
    let funcs: Vec<&str> = if args.funcs.is_empty() {
        DEFAULT_FUNCS.to_vec()
    } else {
        args.funcs.iter().map(String::as_str).collect()
    };
    for f in funcs {
        cmd.args(["--func", f]);
    }
    let recorded = exec(&mut cmd);

    target.guard.child.kill().ok();
    target.guard.child.wait().ok();
    eprintln!("demo: stopped the target (pid {pid})");
    recorded?;

    let files = [
        "report.html",
        "dispatches.txt",
        "dispatches.json",
        "dispatch-1.svg",
        "report.txt",
        "functions.json",
        "flamegraph.svg",
        "trace.json",
        "profile.pb.gz",
        "cpu.svg",
    ]
    .map(|f| out.join(f));
    let missing: Vec<_> = files.iter().filter(|p| !p.is_file()).collect();
    if !missing.is_empty() {
        bail!("the profiler exited 0 but did not write {missing:?}");
    }
    // The page first: it is the one to open.
    println!("\n{}", out.join("report.html").display());
    println!("\nOutputs:");
    for f in &files {
        println!("  {}", f.display());
    }
    println!("  {}", out.join("trace.folded").display());
    println!("\nOpen report.html in a browser (one file, works offline); trace.json in https://ui.perfetto.dev.");
    Ok(())
}
