//! Frame names as slow dispatches group and explain them: one name per
//! function, and which frames are the program's own.
//!
//! - **One name per function.** V8's perf-map names carry the tier the code
//!   was compiled by (`JS:~f` interpreted, `JS:^f` baseline, `JS:+f`
//!   Maglev, `JS:*f` TurboFan; `LazyCompile:*f`, `Function:~f` in older
//!   versions). [`display`] drops that marker, so one function is one node
//!   of a dispatch's tree and one key, whatever tier ran it. (CPU profiles,
//!   `cpu.*`, keep perf's names as the map has them.)
//! - **Keys hold names, never raw addresses.** [`key_name`] turns an
//!   unnamed frame into `module+0xoffset`, which ASLR does not change, and
//!   a frame outside any file mapping into `[unknown]`; glibc's internal
//!   aliases become the names programs call (`__GI___poll` → `poll`).
//! - **The program's own frames** ([`is_own`]): a named frame that is not
//!   the C library's or the dynamic loader's (`__GI_epoll_pwait`,
//!   `__libc_read`, `_start`, `pthread_*`, the libc calls of [`LIBC`]),
//!   nor a runtime's: V8 and Node (`Builtins_*`, `Builtin:`,
//!   `BytecodeHandler:`, `v8::`, `node::`, `llhttp_*`, JS frames of Node's
//!   own library, located `node:…`), libuv (`uv_*`), CPython (`_Py*`,
//!   `Py*`); a C++ thunk is judged by the function it calls. Names are
//!   what decides, not the file a frame came from, so a replay of
//!   `profile.data` (which keeps names only) decides the same way.

use std::borrow::Cow;

/// V8 perf-map name prefixes that a tier marker may follow.
const V8_TAGS: &[&str] = &[
    "JS:",
    "Eval:",
    "Script:",
    "Function:",
    "LazyCompile:",
    "Builtin:",
];

/// V8's tier markers: interpreted, baseline (Sparkplug), Maglev, TurboFan.
const TIERS: &[char] = &['~', '^', '+', '*'];

/// `name` without a V8 tier marker: `JS:*slowHandler /app.js:3:20` →
/// `JS:slowHandler /app.js:3:20`. Anything else is returned as it is.
pub fn display(name: &str) -> Cow<'_, str> {
    if let Some(bare) = python_function(name) {
        return Cow::Owned(bare);
    }
    for tag in V8_TAGS {
        if let Some(rest) = name.strip_prefix(tag) {
            if let Some(bare) = rest.strip_prefix(TIERS) {
                return Cow::Owned(format!("{tag}{bare}"));
            }
        }
    }
    Cow::Borrowed(name)
}

/// The name a key holds for frame `name`: [`display`], with an unnamed
/// frame's raw address dropped (`[unknown] libx.so+0x1a2` →
/// `libx.so+0x1a2`, `[unknown] 0x7f3a…` → `[unknown]`).
pub fn key_name(name: &str) -> String {
    match name.strip_prefix("[unknown] ") {
        Some(rest) if rest.starts_with("0x") => "[unknown]".to_string(),
        Some(rest) => rest.to_string(),
        None => libc_name(&display(name)).to_string(),
    }
}

/// A C library function by the name programs call it by: glibc's
/// internal aliases (`__GI___poll`, `__GI___libc_write`,
/// `___pthread_mutex_lock`, `__clock_nanosleep`) lose their prefixes
/// (`poll`, `write`, `pthread_mutex_lock`, `clock_nanosleep`). Names
/// with fewer than two leading underscores are left alone.
pub fn libc_name(name: &str) -> &str {
    if !name.starts_with("__") {
        return name;
    }
    let mut n = name;
    loop {
        let before = n;
        n = n.strip_prefix("__GI_").unwrap_or(n);
        n = n.trim_start_matches('_');
        n = n.strip_prefix("libc_").unwrap_or(n);
        if n == before {
            break;
        }
    }
    if n.is_empty() {
        name
    } else {
        n
    }
}

/// A Python or Java frame's name without the line it was at:
/// `py:parse (/app/x.py:12)` → `py:parse (/app/x.py)`,
/// `java:a.B.run (B.java:7)` → `java:a.B.run (B.java)` (as a compiled
/// frame is named), so that one function is one node and one key
/// whatever line ran. None for other frames, or a name already without
/// its line.
fn python_function(name: &str) -> Option<String> {
    if !name.starts_with("py:") && !name.starts_with("java:") {
        return None;
    }
    // An inlined Java method's.
    if let Some(bare) = name.strip_suffix("_[i]") {
        return python_function(bare).map(|f| format!("{f}_[i]"));
    }
    let inner = name.strip_suffix(')')?;
    let (_, line) = inner.rsplit_once(':')?;
    if line.is_empty() || !line.bytes().all(|b| b.is_ascii_digit() || b == b'?') {
        return None;
    }
    Some(format!("{})", &inner[..inner.len() - line.len() - 1]))
}

/// True for a Python frame of the interpreter's own library (its
/// standard library, frozen modules), not of the program.
fn is_python_runtime(name: &str) -> bool {
    let Some((_, file)) = name.rsplit_once(" (") else {
        return false;
    };
    file.starts_with("<frozen ")
        || (file.contains("/lib/python3.")
            && !file.contains("/site-packages/")
            && !file.contains("/dist-packages/"))
}

/// True for a frame the symbolizer could not name (`[unknown] …`).
pub fn is_unnamed(name: &str) -> bool {
    name.starts_with("[unknown")
}

/// Exported C library functions that are wrappers of system calls or of
/// blocking waits: the program called them, they are not the program.
pub const LIBC: &[&str] = &[
    "read",
    "write",
    "pread",
    "pread64",
    "pwrite",
    "pwrite64",
    "readv",
    "writev",
    "preadv",
    "pwritev",
    "recv",
    "recvfrom",
    "recvmsg",
    "recvmmsg",
    "send",
    "sendto",
    "sendmsg",
    "sendmmsg",
    "accept",
    "accept4",
    "connect",
    "poll",
    "ppoll",
    "select",
    "pselect",
    "epoll_wait",
    "epoll_pwait",
    "epoll_pwait2",
    "nanosleep",
    "clock_nanosleep",
    "usleep",
    "sleep",
    "pause",
    "sigsuspend",
    "sigwait",
    "sigwaitinfo",
    "sigtimedwait",
    "syscall",
    "futex",
    "fsync",
    "fdatasync",
    "sync",
    "syncfs",
    "msync",
    "open",
    "open64",
    "openat",
    "openat64",
    "close",
    "fcntl",
    "fcntl64",
    "ioctl",
    "flock",
    "lockf",
    "wait",
    "waitpid",
    "wait3",
    "wait4",
    "waitid",
    "fork",
    "vfork",
    "execve",
    "posix_spawn",
    "posix_spawnp",
    "system",
    "clone",
    "clone3",
    "kill",
    "raise",
    "tgkill",
    "eventfd_read",
    "eventfd_write",
    "getrandom",
    "io_uring_enter",
    "io_getevents",
    "start_thread",
    "abort",
    "exit",
];

/// [`is_own`] for a frame called from Python code (a `py:` frame is among
/// its callers): then only Python frames are the program's own, and native
/// ones are the interpreter's (`time_sleep`, `task_step_impl`, named when
/// the interpreter's debug symbols are installed) or an extension's,
/// whose Python caller names the cause.
pub fn is_own_in(name: &str, under_python: bool) -> bool {
    if under_python && !name.starts_with("py:") {
        return false;
    }
    is_own(name)
}

/// For a stack innermost first, whether each frame has a Python frame
/// among its callers (further out).
pub fn under_python(names: &[String]) -> Vec<bool> {
    let mut out = vec![false; names.len()];
    let mut seen = false;
    for (i, n) in names.iter().enumerate().rev() {
        out[i] = seen;
        seen |= n.starts_with("py:");
    }
    out
}

/// True unless `name` is unnamed, the C library's or the loader's, or a
/// language runtime's (see the module doc).
pub fn is_own(name: &str) -> bool {
    let name = display(name);
    let name = name.as_ref();
    if is_unnamed(name) || name.starts_with('[') || name.ends_with("_[k]") {
        return false;
    }
    if name.starts_with("py:") {
        return !name.starts_with("py:[") && !is_python_runtime(name);
    }
    // Java: the JDK's own classes, and the JVM's stubs, are the runtime.
    if let Some(rest) = name.strip_prefix("java:") {
        return !["[", "java.", "javax.", "jdk.", "sun.", "com.sun."]
            .iter()
            .any(|p| rest.starts_with(p));
    }
    // The C library, the loader, the vDSO.
    if name.starts_with('_')
        || name.starts_with("pthread_")
        || name.starts_with("sem_")
        || name.starts_with("0x")
        || name.ends_with("@plt")
        || LIBC.contains(&name)
    {
        return false;
    }
    // A C++ thunk is whose function it calls.
    if let Some(inner) = thunk_target(name) {
        return is_own(inner);
    }
    // V8 and Node (with its HTTP parser).
    if [
        "Builtins_",
        "Builtin:",
        "BytecodeHandler:",
        "Stub:",
        "Handler:",
        "RegExp:",
    ]
    .iter()
    .any(|p| name.starts_with(p))
        || ["v8::", "node::", "uv_", "uv__", "llhttp_"]
            .iter()
            .any(|p| name.starts_with(p))
    {
        return false;
    }
    // JS of Node's own library: `JS:execSync node:child_process:866:18`;
    // and V8's builtins written in JavaScript or Torque, which have no
    // script: `JS:sin` (Math.sin), `JS:push`.
    if let Some(rest) = V8_TAGS.iter().find_map(|t| name.strip_prefix(t)) {
        match rest.rsplit_once(' ') {
            Some((_, at)) if at.starts_with("node:") => return false,
            None => return false,
            Some(_) => {}
        }
    }
    // CPython.
    let mut chars = name.chars();
    if chars.next() == Some('P')
        && chars.next() == Some('y')
        && chars.next().is_some_and(|c| c.is_ascii_uppercase())
    {
        return false;
    }
    true
}

/// The function a demangled C++ thunk forwards to:
/// `{virtual override thunk({offset(-56)}, node::Parser::OnStreamRead(long))}`,
/// `non-virtual thunk to Foo::bar()`.
fn thunk_target(name: &str) -> Option<&str> {
    if let Some(rest) = name
        .strip_prefix("non-virtual thunk to ")
        .or_else(|| name.strip_prefix("virtual thunk to "))
    {
        return Some(rest);
    }
    let rest = name.strip_prefix("{virtual override thunk(")?;
    let (_, inner) = rest.split_once("}, ")?;
    Some(inner.strip_suffix(")}").unwrap_or(inner))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn java_frames_lose_their_line_and_the_jdk_is_not_the_program() {
        assert_eq!(
            display("java:app.Ui.slowLayout (Ui.java:42)"),
            "java:app.Ui.slowLayout (Ui.java)"
        );
        assert_eq!(
            display("java:app.Ui.slowLayout (Ui.java)"),
            "java:app.Ui.slowLayout (Ui.java)"
        );
        assert_eq!(
            display("java:app.Ui.measure (Ui.java:9)_[i]"),
            "java:app.Ui.measure (Ui.java)_[i]"
        );
        assert!(is_own("java:app.Ui.slowLayout (Ui.java:42)"));
        assert!(!is_own("java:java.lang.Thread.sleep (Thread.java)"));
        assert!(!is_own(
            "java:javax.swing.Timer.fireActionPerformed (Timer.java:317)"
        ));
        assert!(!is_own("java:[StubRoutines (1)]"));
    }

    #[test]
    fn tier_markers_are_dropped() {
        for raw in [
            "JS:*slowHandler /app.js:3:20",
            "JS:^slowHandler /app.js:3:20",
            "JS:~slowHandler /app.js:3:20",
            "JS:+slowHandler /app.js:3:20",
        ] {
            assert_eq!(display(raw), "JS:slowHandler /app.js:3:20", "{raw}");
            assert_eq!(key_name(raw), "JS:slowHandler /app.js:3:20", "{raw}");
        }
        assert_eq!(
            display("LazyCompile:*work app.js:9"),
            "LazyCompile:work app.js:9"
        );
        assert_eq!(display("Function:^work"), "Function:work");
        assert_eq!(display("Eval:~ /app.js:1:1"), "Eval: /app.js:1:1");
        // Not a tier marker: left alone.
        assert_eq!(display("JS:slowHandler"), "JS:slowHandler");
        assert_eq!(display("operator*"), "operator*");
        assert_eq!(display("~Widget"), "~Widget");
    }

    #[test]
    fn keys_hold_module_and_offset_never_an_address() {
        assert_eq!(
            key_name("[unknown] libc.so.6+0x10a409"),
            "libc.so.6+0x10a409"
        );
        assert_eq!(key_name("[unknown] 0x7f37665f0409"), "[unknown]");
        assert_eq!(key_name("[unknown] 0x7efc49d94409"), "[unknown]");
        assert_eq!(key_name("handle_request"), "handle_request");
        // glibc's internal aliases, by the name programs call.
        assert_eq!(key_name("__GI___poll"), "poll");
        assert_eq!(key_name("__GI___nanosleep"), "nanosleep");
        assert_eq!(key_name("__GI___libc_write"), "write");
        assert_eq!(key_name("__GI_epoll_pwait"), "epoll_pwait");
        assert_eq!(key_name("___pthread_mutex_lock"), "pthread_mutex_lock");
        assert_eq!(key_name("_start"), "_start");
    }

    #[test]
    fn python_frames_are_one_per_function_and_the_stdlib_is_the_runtime() {
        assert_eq!(display("py:parse (/app/x.py:12)"), "py:parse (/app/x.py)");
        assert_eq!(display("py:parse (/app/x.py)"), "py:parse (/app/x.py)");
        assert_eq!(key_name("py:C.run (/a b/x.py:?)"), "py:C.run (/a b/x.py)");
        assert!(is_own("py:parse (/app/x.py:12)"));
        assert!(is_own(
            "py:get (/venv/lib/python3.11/site-packages/requests/api.py:73)"
        ));
        assert!(!is_own(
            "py:Handle._run (/usr/lib/python3.11/asyncio/events.py:80)"
        ));
        assert!(!is_own(
            "py:_call_with_frames_removed (<frozen importlib._bootstrap>:241)"
        ));
        assert!(!is_own("py:[freed code object]"));
        // Called from Python, the interpreter's C functions are its own.
        let stack: Vec<String> = [
            "clock_nanosleep",
            "time_sleep",
            "py:staller (/a.py:3)",
            "main",
        ]
        .map(String::from)
        .to_vec();
        let under = under_python(&stack);
        assert_eq!(under, vec![true, true, false, false]);
        let own: Vec<bool> = stack
            .iter()
            .zip(&under)
            .map(|(n, &u)| is_own_in(n, u))
            .collect();
        assert_eq!(own, vec![false, false, true, true]);
    }

    #[test]
    fn wrappers_and_runtimes_are_not_the_programs_own() {
        for f in [
            "__GI_epoll_pwait",
            "epoll_pwait",
            "__GI___clock_nanosleep",
            "clock_nanosleep",
            "nanosleep",
            "read",
            "poll",
            "__libc_start_main",
            "_start",
            "pthread_cond_wait",
            "Builtins_InterpreterEntryTrampoline",
            "Builtin:DateNow",
            "BytecodeHandler:LdaZero",
            "v8::internal::Execution::Call",
            "node::SyncProcessRunner::Spawn",
            "uv_run",
            "uv__io_poll",
            "llhttp__internal_execute",
            "{virtual override thunk({offset(-56)}, node::(anonymous namespace)::Parser::OnStreamRead(long, uv_buf_t const&))}",
            "non-virtual thunk to node::StreamBase::ReadStart()",
            "JS:~execSync node:child_process:866:18",
            "JS:*emit node:events:514:28",
            "JS:sin",
            "JS:*push",
            "_PyEval_EvalFrameDefault",
            "PyObject_Call",
            "[unknown] libc.so.6+0x10a409",
            "[unknown] 0x7f37665f0409",
        ] {
            assert!(!is_own(f), "{f} is not the program's own");
        }
        for f in [
            "handle_sleep",
            "parse_json",
            "JS:~sleepHandler /tmp/app.js:9:22",
            "JS:*slowHandler /tmp/app.js:3:21",
            "JS:~ /tmp/app.js:14:35",
            "Widget::render",
            "non-virtual thunk to Widget::render()",
            "pyramid",
        ] {
            assert!(is_own(f), "{f} is the program's own");
        }
    }
}
