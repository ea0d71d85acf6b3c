//! `profiler tables FILE…`: compiles each file's unwind tables as the
//! samplers would (`unwind::cfi`), and says how big they are,
//! how long they took to build and what they cover. No root needed; nothing
//! is loaded into the kernel.
use std::fmt::Write;
use std::time::Instant;

use serde::Serialize;

use crate::{cli::TablesArgs, error::Error, unwind::cfi, Result};

/// One file's figures (`--json`).
#[derive(Serialize)]
struct FileJson {
    path: String,
    file_bytes: u64,
    /// Fastest build over `--repeat` (the first includes reading caches in).
    build_ms: f64,
    first_build_ms: f64,
    fdes: usize,
    rows: usize,
    table_bytes: usize,
    no_cfi_rows: usize,
    unsupported_rows: usize,
    plt_rows: usize,
    /// Rows whose saved-`rbp` offset an 8-byte row cannot hold (their
    /// `rbp` is unknown after the frame).
    rbp_narrowed_rows: usize,
    /// Rows 4 GiB or more past the first (dropped: frame pointers there).
    rows_past_4gib: usize,
    eh_frame: bool,
    debug_frame: bool,
}

/// Runs `profiler tables`.
pub fn run(args: &TablesArgs) -> Result<()> {
    let mut files = Vec::new();
    for path in &args.files {
        let elf = std::fs::read(path).map_err(|e| {
            Error::Usage(format!(
                "cannot read {}: {e}; give an ELF file's path",
                path.display()
            ))
        })?;
        let mut times = Vec::new();
        let mut table = None;
        for _ in 0..args.repeat.max(1) {
            let t = Instant::now();
            let built = cfi::build(&elf[..]).map_err(|e| {
                Error::Usage(format!("{}: {e}; give an x86-64 ELF file", path.display()))
            })?;
            times.push(t.elapsed().as_secs_f64() * 1e3);
            table = Some(built);
        }
        let table = table.expect("built at least once");
        let s = &table.stats;
        files.push(FileJson {
            path: path.display().to_string(),
            file_bytes: elf.len() as u64,
            build_ms: times.iter().copied().fold(f64::MAX, f64::min),
            first_build_ms: times[0],
            fdes: s.fdes(),
            rows: s.rows,
            table_bytes: s.rows * size_of::<profiler_common::UnwindRow>(),
            no_cfi_rows: s.rows_no_cfi,
            unsupported_rows: s.unsupported(),
            plt_rows: s.rows_plt,
            rbp_narrowed_rows: s.rows_rbp_narrowed,
            rows_past_4gib: s.rows_past_4gib,
            eh_frame: s.has_eh_frame,
            debug_frame: s.has_debug_frame,
        });
    }
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&files).expect("plain data serializes")
        );
        return Ok(());
    }
    let mut out = String::new();
    for f in &files {
        let _ = writeln!(
            out,
            "{}: {:.1} MB; table built in {:.1} ms (first {:.1} ms): {} rows, {:.1} MiB, {} FDEs \
             ({:.1} bytes each), {} without CFI, {} unsupported, {} PLT{}{}; sections: {}{}",
            f.path,
            f.file_bytes as f64 / 1e6,
            f.build_ms,
            f.first_build_ms,
            f.rows,
            f.table_bytes as f64 / (1 << 20) as f64,
            f.fdes,
            f.table_bytes as f64 / f.fdes.max(1) as f64,
            f.no_cfi_rows,
            f.unsupported_rows,
            f.plt_rows,
            match f.rbp_narrowed_rows {
                0 => String::new(),
                n => format!(", {n} with an rbp offset a row cannot hold"),
            },
            match f.rows_past_4gib {
                0 => String::new(),
                n => format!(", {n} dropped 4 GiB past the first"),
            },
            if f.eh_frame { ".eh_frame " } else { "" },
            if f.debug_frame { ".debug_frame" } else { "" },
        );
    }
    print!("{out}");
    Ok(())
}
