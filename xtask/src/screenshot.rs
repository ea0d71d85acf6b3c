//! `cargo xtask screenshot`: docs/report.png, the README's picture of
//! report.html, taken by headless Chromium from the demo's recording with
//! its costliest slow dispatch group opened.
use anyhow::{Context as _, Result};

use crate::util::workspace_root;

#[derive(clap::Args)]
pub struct Args {
    /// Use the existing prof-demo/ instead of running `cargo xtask demo` first.
    #[arg(long)]
    reuse: bool,
}

pub fn run(args: &Args) -> Result<()> {
    let root = workspace_root();
    let dir = root.join("prof-demo");
    if !args.reuse || !dir.join("report.html").is_file() {
        crate::demo::run(&crate::demo::Args::default())?;
    }
    let page = dir.join("report.html");
    let d: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("dispatches.json"))
            .context("reading prof-demo/dispatches.json")?,
    )?;
    // The group whose slowest instance was blocked longest shows every
    // colour of the flame chart; else the costliest group.
    let blocked = d["slow"].as_array().and_then(|slow| {
        slow.iter()
            .filter(|s| s["blocked_ns"].as_u64() > Some(0))
            .max_by_key(|s| s["blocked_ns"].as_u64())
            .and_then(|s| s["key"].as_str())
    });
    let fragment = blocked
        .or(d["groups"][0]["key"].as_str())
        .map(|k| format!("group={}", crate::browser::encode(k)))
        .unwrap_or_default();
    let png = root.join("docs/report.png");
    std::fs::create_dir_all(png.parent().unwrap())?;
    crate::browser::screenshot(&page, &fragment, (1280, 1500), &png)?;
    println!("{}", png.display());
    Ok(())
}
