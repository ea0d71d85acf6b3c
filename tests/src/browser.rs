//! Headless Chromium (Debian's `chromium`, installed by `cargo xtask
//! setup`) for checking `report.html`: the DOM after the page's scripts
//! ran (`--dump-dom`), screenshots, and a scan for web references.
use std::path::{Path, PathBuf};
use std::process::Command;

/// The browser, or a panic saying how to install it.
pub fn chromium() -> PathBuf {
    ["chromium", "chromium-browser"]
        .iter()
        .find_map(|name| {
            std::env::var_os("PATH").and_then(|paths| {
                std::env::split_paths(&paths)
                    .map(|d| d.join(name))
                    .find(|p| p.is_file())
            })
        })
        .expect("chromium is not installed: run `cargo xtask setup` (Debian package chromium)")
}

/// `page#fragment` as a file URL (the fragment percent-encoded).
pub fn page_url(page: &Path, fragment: &str) -> String {
    let mut url = format!("file://{}", page.display());
    if !fragment.is_empty() {
        url.push('#');
        url.push_str(fragment);
    }
    url
}

/// Percent-encodes a fragment parameter's value.
pub fn encode(value: &str) -> String {
    let mut out = String::new();
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn headless(extra: &[&str], url: &str) -> std::process::Output {
    headless_tried(extra, url).unwrap_or_else(|err| panic!("chromium failed on {url}: {err}"))
}

/// [`headless`], or chromium's stderr when every try failed.
fn headless_tried(extra: &[&str], url: &str) -> Result<std::process::Output, String> {
    // Under emulation chromium's GPU process (software rendering) crashes
    // when it draws (SIGSEGV, then "GPU process isn't usable"; 12 of 13
    // screenshots in the 6.1 and 6.12 VMs): the browser is tried three
    // times there.
    // The retries run the GPU work another way: without SwiftShader, then
    // inside the browser's own process.
    const RETRY_FLAGS: [&[&str]; 3] = [
        &[],
        &["--disable-software-rasterizer"],
        &["--disable-software-rasterizer", "--in-process-gpu"],
    ];
    let tries = if crate::emulated() { 3 } else { 1 };
    let mut err = String::new();
    for attempt in 1..=tries {
        let with: Vec<&str> = extra
            .iter()
            .chain(RETRY_FLAGS[attempt - 1])
            .copied()
            .collect();
        let out = headless_once(&with, url);
        if out.status.success() {
            return Ok(out);
        }
        err = String::from_utf8_lossy(&out.stderr).into_owned();
        if attempt < tries {
            eprintln!(
                "chromium failed (attempt {attempt} of {tries}, under emulation): {}",
                err.lines()
                    .rev()
                    .find(|l| l.contains("FATAL"))
                    .unwrap_or("")
            );
        }
    }
    Err(err)
}

fn headless_once(extra: &[&str], url: &str) -> std::process::Output {
    let profile = crate::TempDir::new("chromium");
    Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--hide-scrollbars",
            "--virtual-time-budget=5000",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        // Its crash reporter writes under $HOME/.config whatever the
        // profile: read-only inside the kernels' VMs.
        .env("HOME", profile.path())
        .args(extra)
        .arg(url)
        .output()
        .expect("run chromium")
}

/// The page's DOM once its scripts ran, with its data element removed.
pub fn dump_dom(page: &Path, fragment: &str) -> String {
    let out = headless(&["--dump-dom"], &page_url(page, fragment));
    let dom = String::from_utf8(out.stdout).expect("DOM is UTF-8");
    assert!(dom.contains("</html>"), "no DOM dumped: {dom:.200}");
    match (
        dom.find("<script type=\"application/json\""),
        dom.rfind("</body>"),
    ) {
        (Some(a), Some(b)) if a < b => format!("{}{}", &dom[..a], &dom[b..]),
        _ => dom,
    }
}

/// Takes a `width`×`height` screenshot of `page#fragment` into `png`.
/// False only under emulation, when chromium failed every try: drawing
/// needs its GPU process (software rendering), which crashes in the 6.1
/// and 6.12 VMs more often than not, and the page draws the same on every
/// kernel (the DOM is still checked there).
pub fn screenshot(page: &Path, fragment: &str, width: u32, height: u32, png: &Path) -> bool {
    let url = page_url(page, fragment);
    let tried = headless_tried(
        &[
            &format!("--window-size={width},{height}"),
            &format!("--screenshot={}", png.display()),
        ],
        &url,
    );
    match tried {
        Ok(_) => {}
        Err(err) if !crate::relaxed("no screenshot: chromium's GPU process crashed on every try under emulation; the page's DOM is checked") => {
            panic!("chromium failed on {url}: {err}")
        }
        Err(_) => return false,
    }
    assert!(png.is_file(), "chromium wrote no screenshot");
    true
}

/// A decoded screenshot: RGB pixels.
pub struct Pixels {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// RGB triples, row by row.
    pub rgb: Vec<[u8; 3]>,
}

impl Pixels {
    /// Decodes a PNG file.
    pub fn load(path: &Path) -> Pixels {
        let decoder = png::Decoder::new(std::io::BufReader::new(
            std::fs::File::open(path).expect("open the screenshot"),
        ));
        let mut reader = decoder.read_info().expect("a PNG");
        let mut buf = vec![0; reader.output_buffer_size()];
        let info = reader.next_frame(&mut buf).expect("a PNG frame");
        let step = info.color_type.samples();
        assert!(
            step >= 3,
            "colour screenshot expected, got {:?}",
            info.color_type
        );
        let rgb = buf[..info.buffer_size()]
            .chunks(step)
            .map(|p| [p[0], p[1], p[2]])
            .collect();
        Pixels {
            width: info.width,
            height: info.height,
            rgb,
        }
    }

    /// Distinct colours.
    pub fn colours(&self) -> usize {
        self.rgb
            .iter()
            .collect::<std::collections::HashSet<_>>()
            .len()
    }

    /// Share of pixels that are not (near) white.
    pub fn ink(&self) -> f64 {
        let n = self
            .rgb
            .iter()
            .filter(|p| p.iter().any(|&c| c < 235))
            .count();
        n as f64 / self.rgb.len().max(1) as f64
    }

    /// Pixels within `tol` of `colour` on every channel.
    pub fn count_near(&self, colour: [u8; 3], tol: u8) -> usize {
        self.rgb
            .iter()
            .filter(|p| (0..3).all(|i| p[i].abs_diff(colour[i]) <= tol))
            .count()
    }
}

/// Every place where `html` makes the browser load something from the web:
/// an `http(s)://` URL as the value of `src`, `href`, `action`, `poster`,
/// `srcset`, `data` or a `url(...)`/`@import`, quoted or not, escaped
/// inside JSON or not. XML namespace declarations (`xmlns="http://…"`) are
/// names, not fetches, and are not reported.
pub fn web_references(html: &str) -> Vec<String> {
    let lower = html.to_ascii_lowercase();
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(at) = lower[from..].find("://").map(|i| i + from) {
        from = at + 3;
        let scheme_start = lower[..at]
            .rfind(|c: char| !c.is_ascii_alphabetic())
            .map_or(0, |i| i + 1);
        let scheme = &lower[scheme_start..at];
        if scheme != "http" && scheme != "https" {
            continue;
        }
        // What the URL is the value of: skip quotes, backslashes (JSON),
        // spaces, `=` and `(` back to the attribute or function name.
        let before = lower[..scheme_start].trim_end_matches(|c: char| "\"'\\ =(\t\n".contains(c));
        let name_start = before
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == ':' || c == '@'))
            .map_or(0, |i| i + 1);
        let name = &before[name_start..];
        let fetches = matches!(
            name,
            "src"
                | "href"
                | "xlink:href"
                | "action"
                | "poster"
                | "srcset"
                | "data"
                | "url"
                | "@import"
                | "import"
                | "fetch"
                | "open"
                | "location"
        );
        if fetches {
            let end = html[at..]
                .find(|c: char| c.is_whitespace() || "\"'<>)\\".contains(c))
                .map_or(html.len(), |i| i + at);
            found.push(format!("{name}: {}", &html[scheme_start..end]));
        }
    }
    found
}

/// `<td class="key">` cells etc.: text as the DOM serializes it.
pub fn html_escaped(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('\u{a0}', "&nbsp;")
}

/// The page under `dir`, checked to exist.
pub fn report_html(dir: &Path) -> PathBuf {
    let p = dir.join("report.html");
    assert!(p.is_file(), "no report.html in {}", dir.display());
    p
}
