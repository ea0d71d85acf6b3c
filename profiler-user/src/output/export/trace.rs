//! Chrome Trace Event JSON (`trace.json`), which Perfetto and
//! chrome://tracing open: `{"traceEvents":[...],"displayTimeUnit":"ns"}`.
//!
//! [`TraceWriter`] streams events straight to a buffered file, so memory
//! does not grow with the number of events. Timestamps are nanoseconds
//! (relative to the session start) written as microseconds with a
//! fractional part, as the format wants. Every string goes through
//! serde_json, and `<`, `>`, `&` are written as `\u003c`… so the JSON can be
//! pasted into an HTML `<script>` (as trace2html does) safely.
use std::fs::File;
use std::io::{self, BufWriter, Write};

/// Writes one Chrome trace file, event by event.
///
/// Call [`TraceWriter::finish`] to close the JSON; if the writer is
/// dropped unfinished (e.g. on an early error) it closes it on a best-effort
/// basis, so the file still parses.
pub struct TraceWriter {
    out: Option<BufWriter<File>>,
    events: u64,
}

/// `name` as a JSON string literal, safe inside HTML, for [`TraceWriter::call`].
pub fn json_name(name: &str) -> String {
    json_str(name)
}

/// A JSON string literal for `s`, safe inside HTML.
fn json_str(s: &str) -> String {
    let quoted = serde_json::to_string(s).expect("strings always serialize");
    // serde_json never emits these inside an escape, so plain replacement
    // is exact.
    quoted
        .replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
}

/// Microseconds, with the nanoseconds as the fraction.
fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

/// `{"k":"v",…}` for event args.
fn args_obj(args: &[(&str, String)]) -> String {
    let mut s = String::from("{");
    for (i, (k, v)) in args.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        s.push_str(&json_str(k));
        s.push(':');
        s.push_str(&json_str(v));
    }
    s.push('}');
    s
}

impl TraceWriter {
    /// Starts a trace in `file` (truncated by the caller) and writes the
    /// header.
    pub fn create(file: File) -> io::Result<Self> {
        let mut out = BufWriter::with_capacity(64 * 1024, file);
        out.write_all(b"{\"traceEvents\":[")?;
        Ok(Self {
            out: Some(out),
            events: 0,
        })
    }

    /// Events written so far.
    #[cfg(test)]
    pub fn events(&self) -> u64 {
        self.events
    }

    /// Writes one event object (without separators).
    fn event(&mut self, body: std::fmt::Arguments) -> io::Result<()> {
        let out = self.out.as_mut().expect("writer used after finish");
        if self.events > 0 {
            out.write_all(b",")?;
        }
        out.write_all(b"\n{")?;
        out.write_fmt(body)?;
        out.write_all(b"}")?;
        self.events += 1;
        Ok(())
    }

    /// Names process `pid` (a metadata "M" event).
    pub fn process_name(&mut self, pid: u32, name: &str) -> io::Result<()> {
        let name = json_str(name);
        self.event(format_args!(
            r#""name":"process_name","ph":"M","pid":{pid},"tid":0,"args":{{"name":{name}}}"#
        ))
    }

    /// Names thread `tid` of process `pid` (a metadata "M" event).
    pub fn thread_name(&mut self, pid: u32, tid: u32, name: &str) -> io::Result<()> {
        let name = json_str(name);
        self.event(format_args!(
            r#""name":"thread_name","ph":"M","pid":{pid},"tid":{tid},"args":{{"name":{name}}}"#
        ))
    }

    /// Opens a slice on a thread ("B"); close it with [`TraceWriter::end`].
    #[cfg(test)]
    pub fn begin(&mut self, pid: u32, tid: u32, name: &str, ts_ns: u64) -> io::Result<()> {
        let (name, ts) = (json_str(name), us(ts_ns));
        self.event(format_args!(
            r#""name":{name},"ph":"B","ts":{ts},"pid":{pid},"tid":{tid}"#
        ))
    }

    /// Closes the innermost open slice of a thread ("E").
    #[cfg(test)]
    pub fn end(&mut self, pid: u32, tid: u32, ts_ns: u64) -> io::Result<()> {
        let ts = us(ts_ns);
        self.event(format_args!(
            r#""ph":"E","ts":{ts},"pid":{pid},"tid":{tid}"#
        ))
    }

    /// A whole slice ("X") with a category (e.g. `dispatch`, `hang`) and
    /// string args shown in the details panel.
    #[allow(clippy::too_many_arguments)]
    pub fn complete(
        &mut self,
        pid: u32,
        tid: u32,
        name: &str,
        cat: &str,
        start_ns: u64,
        dur_ns: u64,
        args: &[(&str, String)],
    ) -> io::Result<()> {
        let (name, cat, args) = (json_str(name), json_str(cat), args_obj(args));
        let (ts, dur) = (us(start_ns), us(dur_ns));
        self.event(format_args!(
            r#""name":{name},"cat":{cat},"ph":"X","ts":{ts},"dur":{dur},"pid":{pid},"tid":{tid},"args":{args}"#
        ))
    }

    /// A call slice ("X", category "call", no args) whose name is already a
    /// JSON string literal (see [`json_name`]): the hot path, one per traced
    /// call, allocates nothing.
    pub fn call(
        &mut self,
        pid: u32,
        tid: u32,
        name_json: &str,
        start_ns: u64,
        dur_ns: u64,
    ) -> io::Result<()> {
        let (ts, dur) = (us(start_ns), us(dur_ns));
        self.event(format_args!(
            r#""name":{name_json},"cat":"call","ph":"X","ts":{ts},"dur":{dur},"pid":{pid},"tid":{tid},"args":{{}}"#
        ))
    }

    /// A process-scoped counter sample ("C"): a track named `name`
    /// with one series, `series`, at `value` from `ts_ns` on.
    pub fn counter(
        &mut self,
        pid: u32,
        name: &str,
        series: &str,
        ts_ns: u64,
        value: f64,
    ) -> io::Result<()> {
        let (name, series, ts) = (json_str(name), json_str(series), us(ts_ns));
        self.event(format_args!(
            r#""name":{name},"ph":"C","ts":{ts},"pid":{pid},"args":{{{series}:{value:.1}}}"#
        ))
    }

    /// A thread-scoped instant ("i", `"s":"t"`), e.g. one sample.
    pub fn instant(
        &mut self,
        pid: u32,
        tid: u32,
        name: &str,
        ts_ns: u64,
        args: &[(&str, String)],
    ) -> io::Result<()> {
        let (name, args, ts) = (json_str(name), args_obj(args), us(ts_ns));
        self.event(format_args!(
            r#""name":{name},"ph":"i","s":"t","ts":{ts},"pid":{pid},"tid":{tid},"args":{args}"#
        ))
    }

    /// One end of a flow arrow (legacy flow events, which Perfetto and
    /// chrome://tracing draw): `start` writes "s" (from the slice enclosing
    /// `ts_ns` on that thread), otherwise "f" with `"bp":"e"` (to the slice
    /// enclosing `ts_ns`). Both ends share `id`.
    #[allow(clippy::too_many_arguments)]
    pub fn flow(
        &mut self,
        start: bool,
        id: u64,
        pid: u32,
        tid: u32,
        name: &str,
        cat: &str,
        ts_ns: u64,
    ) -> io::Result<()> {
        let (name, cat, ts) = (json_str(name), json_str(cat), us(ts_ns));
        let ph = if start {
            r#""ph":"s""#
        } else {
            r#""ph":"f","bp":"e""#
        };
        self.event(format_args!(
            r#""name":{name},"cat":{cat},{ph},"id":{id},"ts":{ts},"pid":{pid},"tid":{tid}"#
        ))
    }

    /// Closes the JSON and flushes it to the file.
    pub fn finish(mut self) -> io::Result<()> {
        self.close()
    }

    fn close(&mut self) -> io::Result<()> {
        let Some(mut out) = self.out.take() else {
            return Ok(());
        };
        out.write_all(b"\n],\"displayTimeUnit\":\"ns\"}\n")?;
        out.flush()
    }
}

impl Drop for TraceWriter {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

#[cfg(test)]
mod tests;
