//! The text exposition format 0.0.4, as far as the registry writes it:
//! `# HELP` and `# TYPE` lines, samples `name{label="value",…} value`,
//! label values escaped (backslash, double quote, line feed), numbers as
//! Go's `ParseFloat` reads them (`+Inf`, `-Inf`, `NaN`).

use std::fmt::Write as _;

/// `# HELP NAME HELP` and `# TYPE NAME KIND`. In HELP text a backslash and
/// a line feed are escaped (a double quote is not).
pub fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    out.push_str("# HELP ");
    out.push_str(name);
    out.push(' ');
    for c in help.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push_str("\n# TYPE ");
    out.push_str(name);
    out.push(' ');
    out.push_str(kind);
    out.push('\n');
}

/// One sample line: `labels` (already escaped, `a="x",b="y"`, or empty)
/// then `extra` (escaped here), then the value.
pub fn sample(out: &mut String, name: &str, labels: &str, extra: &[(&str, &str)], value: f64) {
    out.push_str(name);
    if !labels.is_empty() || !extra.is_empty() {
        out.push('{');
        out.push_str(labels);
        for (i, (k, v)) in extra.iter().enumerate() {
            if i > 0 || !labels.is_empty() {
                out.push(',');
            }
            label(out, k, v.as_bytes());
        }
        out.push('}');
    }
    out.push(' ');
    out.push_str(&number(value));
    out.push('\n');
}

/// `name="value"`, the value read as UTF-8 (invalid bytes become U+FFFD)
/// and escaped. `name` is one of the registry's own, `[a-z_]+`.
pub fn label(out: &mut String, name: &str, value: &[u8]) {
    debug_assert!(name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'));
    out.push_str(name);
    out.push_str("=\"");
    for c in String::from_utf8_lossy(value).chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A sample value as the format spells it.
pub fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".to_owned()
    } else if v == f64::INFINITY {
        "+Inf".to_owned()
    } else if v == f64::NEG_INFINITY {
        "-Inf".to_owned()
    } else {
        // Rust's shortest round-trip decimal, never an exponent: Go's
        // ParseFloat reads it back to the same f64.
        let mut s = String::new();
        let _ = write!(s, "{v}");
        s
    }
}
