//! `profiler report DIR`: renders a recording's outputs again from its
//! `profile.data`, offline and without root. The stream is fed through the
//! same pipeline as live, with the journaled hang checks, thread exits,
//! thread names and symbolized addresses, so with the recorded settings the
//! outputs come out byte for byte the same; dispatch thresholds can be
//! changed. A recording cut short or damaged is replayed up to its last
//! whole block, and every output says the figures cover only that part.
use crate::{
    cli::ReportArgs,
    output::writers,
    output::OutDir,
    session::{datafile, pipeline::Overrides, replay},
    Result,
};

/// Runs `profiler report`.
pub fn run(args: &ReportArgs) -> Result<()> {
    let watched = args.recording.join(crate::session::watch::STALLS);
    if args.recording.is_dir() && watched.is_file() && !args.recording.join("profile.data").exists()
    {
        if args.threshold.is_some() || args.hang.is_some() || args.out.is_some() {
            return Err(crate::Error::Usage(format!(
                "{} is a `watch` directory: its reports are rendered again in place, \
                 with the thresholds they were found with; drop --out, --threshold and --hang",
                args.recording.display()
            )));
        }
        return crate::session::watch::render(&args.recording);
    }
    let file = if args.recording.is_dir() {
        args.recording.join("profile.data")
    } else {
        args.recording.clone()
    };
    let data = datafile::read(&file)?;
    let damage = data.damage.as_ref().map(|d| d.message());
    if let Some(d) = &damage {
        eprintln!("profiler: warning: {}: {d}", file.display());
    }
    if let Some((at, n)) = data.trailing {
        eprintln!(
            "profiler: warning: {}: {n} bytes after the trailer, at byte {at}, were ignored",
            file.display()
        );
    }
    let dir = args
        .out
        .clone()
        .or_else(|| file.parent().map(|p| p.to_path_buf()))
        .unwrap_or_else(|| ".".into());
    let out = OutDir::prepare(&dir, writers::RECORD_FILES)?;
    let ns = |d: Option<std::time::Duration>| d.map(|d| d.as_nanos() as u64);
    let o = Overrides {
        threshold_ns: ns(args.threshold),
        hang_ns: ns(args.hang),
        frame_interval_ns: ns(args.frame_interval),
        full_tree: args.full_tree,
        trace_events: args.trace_events,
    };
    replay::replay(data, damage, &out, &o)?;
    eprintln!(
        "profiler: replayed {} into {}",
        file.display(),
        out.path().display()
    );
    Ok(())
}
