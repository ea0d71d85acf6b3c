//! `profiler diff`: a differential flame graph of two recordings.
use crate::{
    cli::DiffArgs,
    output::{export::diff, OutDir},
    Error, Result,
};

/// Runs `profiler diff`.
pub fn run(args: &DiffArgs) -> Result<()> {
    let find = |p: &std::path::Path| {
        diff::resolve_folded(p).ok_or_else(|| {
            Error::Usage(format!("{} holds no cpu.folded or trace.folded: give a recording directory or a folded file", p.display()))
        })
    };
    let (before, after) = (find(&args.before)?, find(&args.after)?);
    let title = format!("profiler diff: {} -> {}", before.display(), after.display());
    let svg = diff::diff_svg_with(&before, &after, &title, args.normalize).map_err(Error::Usage)?;
    let dir = args
        .output
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    let name = args
        .output
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| Error::Usage("--output must name a file".into()))?;
    OutDir::prepare(dir, &[name])?.write(name, &svg)?;
    eprintln!("profiler: wrote {}", args.output.display());
    Ok(())
}
