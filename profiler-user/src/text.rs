//! Formatting shared by every output: times and counts for people, and
//! frame names made safe for the folded-stack format.

/// Formats nanoseconds for people: `812 ns`, `12.4 µs`, `3.21 ms`, `1.52 s`.
pub fn fmt_ns(ns: u64) -> String {
    let f = ns as f64;
    if ns < 1_000 {
        format!("{ns} ns")
    } else if ns < 1_000_000 {
        format!("{:.1} µs", f / 1e3)
    } else if ns < 1_000_000_000 {
        format!("{:.2} ms", f / 1e6)
    } else {
        format!("{:.2} s", f / 1e9)
    }
}

/// Formats a count with a K/M suffix.
pub fn fmt_count(n: u64) -> String {
    if n < 10_000 {
        n.to_string()
    } else if n < 10_000_000 {
        format!("{:.1}K", n as f64 / 1e3)
    } else {
        format!("{:.1}M", n as f64 / 1e6)
    }
}

/// Appends `line` and a newline to `out` when `cond` holds: the notes and
/// warnings a text report carries only when they apply.
pub fn line_if(out: &mut String, cond: bool, line: std::fmt::Arguments) {
    if cond {
        let _ = std::fmt::Write::write_fmt(out, line);
        out.push('\n');
    }
}

/// Makes a name safe for the folded format: no `;` (the frame separator),
/// no control bytes or line breaks.
pub fn folded_frame(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c == ';' {
                ':'
            } else if c.is_control() {
                '?'
            } else {
                c
            }
        })
        .collect()
}

/// Bytes as the reports and `--unwind-memory` write them (`512K`, `32M`,
/// `1.5M`, `1G`).
pub fn fmt_bytes(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{}G", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{}M", b >> 20),
        b if b >= 1 << 20 => format!("{:.1}M", b as f64 / (1 << 20) as f64),
        b => format!("{}K", b.div_ceil(1 << 10)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_times_and_counts() {
        assert_eq!(fmt_ns(812), "812 ns");
        assert_eq!(fmt_ns(12_400), "12.4 µs");
        assert_eq!(fmt_ns(3_210_000), "3.21 ms");
        assert_eq!(fmt_ns(1_520_000_000), "1.52 s");
        assert_eq!(fmt_count(999), "999");
        assert_eq!(fmt_count(123_456), "123.5K");
        assert_eq!(fmt_count(12_345_678), "12.3M");
    }

    #[test]
    fn lines_only_when_they_apply() {
        let mut out = String::new();
        line_if(&mut out, false, format_args!("never"));
        line_if(&mut out, true, format_args!("{} lost", 3));
        assert_eq!(out, "3 lost\n");
    }

    #[test]
    fn hostile_names_are_neutralised() {
        assert_eq!(folded_frame("a;b\nc\u{1}"), "a:b?c?");
    }
}
