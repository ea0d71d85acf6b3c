//! `profiler list`: the functions a selection would probe, without
//! attaching.
use std::fmt::Write;

use crate::{
    cli::ListArgs,
    tracee::{process::Target, select},
    Result,
};

/// Runs `profiler list`.
pub fn run(args: &ListArgs) -> Result<()> {
    select::compile(&args.select)?;
    let target = Target::open(args.target.pid)?;
    let mut select_args = args.select.clone();
    select_args.max_funcs = Some(usize::MAX);
    let sel = select::select(&target, &select_args, &[])?;
    let mut out = String::new();
    for f in &sel.funcs {
        let _ = writeln!(
            out,
            "{}\t{}\t{:#x}",
            f.name,
            sel.binaries[f.binary as usize].path.display(),
            f.offset
        );
    }
    print!("{out}");
    Ok(())
}
