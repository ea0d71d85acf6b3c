//! Escaping for the page: text for HTML, and JSON for a `<script>` element.
//! Names come from the target's binaries, so anything may be in them.

/// `s` as HTML text (element content or a quoted attribute).
pub fn html_text(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c if c.is_control() => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
}

/// Serialized JSON made safe inside `<script type="application/json">`:
/// `<`, `>` and `&` (so no `</script>` or `<!--` can appear), U+2028/9 and
/// every control character left as a `\uXXXX` escape. These characters
/// occur only inside JSON strings, where the escape means the same.
pub fn script_json(json: &str) -> String {
    let mut out = String::with_capacity(json.len() + json.len() / 16);
    for c in json.chars() {
        match c {
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => push_escape(&mut out, c),
            c if c.is_control() && c != '\n' => push_escape(&mut out, c),
            c => out.push(c),
        }
    }
    out
}

fn push_escape(out: &mut String, c: char) {
    use std::fmt::Write;
    let _ = write!(out, "\\u{:04x}", c as u32);
}
