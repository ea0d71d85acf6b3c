//! Headless Chromium (Debian's `chromium`, installed by `setup`): the
//! screenshot of the demo's report.html and the page-load bench.
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context as _, Result};

use crate::util::find_program;

fn chromium() -> Result<PathBuf> {
    find_program("chromium")
        .or_else(|| find_program("chromium-browser"))
        .context("chromium is not installed: run `cargo xtask setup`")
}

/// Runs headless Chromium on `page#fragment` with `args`; returns stdout.
fn run(page: &Path, fragment: &str, args: &[String]) -> Result<String> {
    let profile = std::env::temp_dir().join(format!("xtask-chromium-{}", std::process::id()));
    let mut url = format!("file://{}", page.display());
    if !fragment.is_empty() {
        url = format!("{url}#{fragment}");
    }
    let out = Command::new(chromium()?)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(&url)
        .output()
        .context("running chromium")?;
    let _ = std::fs::remove_dir_all(&profile);
    if !out.status.success() {
        bail!(
            "chromium failed on {url}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A `width`×`height` screenshot of `page#fragment` into `png`, once the
/// page's scripts have run.
pub fn screenshot(page: &Path, fragment: &str, size: (u32, u32), png: &Path) -> Result<()> {
    run(
        page,
        fragment,
        &[
            format!("--window-size={},{}", size.0, size.1),
            "--virtual-time-budget=5000".into(),
            format!("--screenshot={}", png.display()),
        ],
    )?;
    if !png.is_file() {
        bail!("chromium wrote no {}", png.display());
    }
    Ok(())
}

/// The DOM of `page` after its load event (real time, so the page's own
/// `performance.now()` figures are real).
pub fn dump_dom(page: &Path) -> Result<String> {
    run(page, "", &["--dump-dom".into()])
}

/// Percent-encodes a URL fragment parameter's value.
pub fn encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
