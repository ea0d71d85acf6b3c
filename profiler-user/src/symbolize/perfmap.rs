//! `/tmp/perf-PID.map`: names for JIT-compiled code (node
//! `--perf-basic-prof`, the JVM's perf agents, .NET, LuaJIT…), one
//! `START SIZE NAME` line per function, hexadecimal.
//!
//! Any user can create `/tmp/perf-PID.map` for any PID, and the profiler
//! reads it as root, so, as perf does, the file is used only when it is a
//! regular file owned by root or by the target's user. It is opened with
//! `O_NONBLOCK | O_NOFOLLOW` and checked with `fstat` before anything is
//! read (a FIFO would otherwise block the read forever, a symlink could
//! point at a file only root may read). A refused file gets one warning
//! and nothing from it is used.
//!
//! What is read is bounded ([`MAX_BYTES`], [`MAX_ENTRIES`], [`MAX_NAME`]);
//! malformed lines are skipped and counted. Names are data: control
//! characters become `?` here, so they cannot break a line of any output
//! (the writers escape the rest: `;` in folded stacks, markup in SVG).
use std::{
    collections::{HashMap, HashSet},
    fs::File,
    io::{Read, Seek, SeekFrom},
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    sync::Mutex,
    time::{Duration, Instant},
};

use crate::untrusted;

/// At most this much of a perf map is read.
pub const MAX_BYTES: u64 = 256 << 20;
/// At most this many entries are kept.
pub const MAX_ENTRIES: usize = 4 << 20;
/// Longer names are cut to this many bytes.
pub const MAX_NAME: usize = 4096;
/// A growing perf map is read again at most this often.
pub const RELOAD_EVERY: Duration = Duration::from_secs(1);
/// ... or this often when an address in JIT memory had no entry: the
/// runtime writes an entry when it compiles the code, so one that ran just
/// now is likely in what was appended since the last read.
pub const RELOAD_ON_MISS: Duration = Duration::from_millis(20);
/// Entries examined before an address when looking it up (entries may
/// overlap when code was moved and the older entry is stale).
const LOOKBACK: usize = 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    start: u64,
    end: u64,
    name: (u32, u32),
}

/// The parsed entries of one perf map, sorted by start address.
#[derive(Debug, Default)]
pub struct PerfMap {
    entries: Vec<Entry>,
    /// Every name, one after the other.
    names: String,
    /// Lines that did not parse.
    pub malformed: u64,
    /// Entries dropped past [`MAX_ENTRIES`].
    pub dropped: u64,
}

/// A hexadecimal number, with or without `0x`, 1 to 16 digits.
fn hex(s: &[u8]) -> Option<u64> {
    let s = s
        .strip_prefix(b"0x")
        .or_else(|| s.strip_prefix(b"0X"))
        .unwrap_or(s);
    if s.is_empty() || s.len() > 16 || !s.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    u64::from_str_radix(std::str::from_utf8(s).ok()?, 16).ok()
}

/// `START SIZE NAME` → (start, end, name), or None if malformed.
fn parse_line(line: &[u8]) -> Option<(u64, u64, &[u8])> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let ws = |b: &u8| *b == b' ' || *b == b'\t';
    let skip_ws = |s: &'_ [u8]| -> usize { s.iter().take_while(|b| ws(b)).count() };
    let line = &line[skip_ws(line)..];
    let end = line.iter().position(ws)?;
    let start = hex(&line[..end])?;
    let rest = &line[end..];
    let rest = &rest[skip_ws(rest)..];
    let end = rest.iter().position(ws)?;
    let size = hex(&rest[..end])?;
    let rest = &rest[end..];
    let name = &rest[skip_ws(rest)..];
    if name.is_empty() {
        return None;
    }
    Some((start, start.checked_add(size)?, name))
}

/// A name made safe for every output: lossy UTF-8, control characters as
/// `?` (as `report::flame::folded_frame` does), at most [`MAX_NAME`] bytes.
pub fn clean_name(raw: &[u8]) -> String {
    let mut s: String = String::from_utf8_lossy(raw)
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    if s.len() > MAX_NAME {
        let mut cut = MAX_NAME;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}

impl PerfMap {
    /// An empty map.
    pub fn new() -> Self {
        Self::default()
    }

    /// Parses the complete lines of `text` (what follows the last newline
    /// is ignored: a writer may be in the middle of it) and adds them; a
    /// later entry for the same start address replaces an earlier one.
    /// Returns how many bytes were consumed (up to the last newline).
    pub fn add(&mut self, text: &[u8]) -> usize {
        let Some(last_nl) = text.iter().rposition(|&b| b == b'\n') else {
            return 0;
        };
        let before = self.entries.len();
        for line in text[..last_nl].split(|&b| b == b'\n') {
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let Some((start, end, name)) = parse_line(line) else {
                self.malformed += 1;
                continue;
            };
            if self.entries.len() >= MAX_ENTRIES
                || self.names.len() as u64 + name.len() as u64 >= u32::MAX as u64
            {
                self.dropped += 1;
                continue;
            }
            let name = clean_name(name);
            let off = self.names.len() as u32;
            self.names.push_str(&name);
            self.entries.push(Entry {
                start,
                end,
                name: (off, name.len() as u32),
            });
        }
        if self.entries.len() > before {
            // Stable: for one start, the entries stay in file order, and
            // the last one written wins.
            self.entries.sort_by_key(|e| e.start);
            let mut kept: Vec<Entry> = Vec::with_capacity(self.entries.len());
            for e in self.entries.drain(..) {
                match kept.last_mut() {
                    Some(last) if last.start == e.start => *last = e,
                    _ => kept.push(e),
                }
            }
            self.entries = kept;
        }
        last_nl + 1
    }

    /// Number of entries.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True if there are no entries.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The name of the function whose `[start, start + size)` holds `addr`
    /// (a size-0 entry holds only its start).
    pub fn lookup(&self, addr: u64) -> Option<&str> {
        let i = self.entries.partition_point(|e| e.start <= addr);
        self.entries[..i]
            .iter()
            .rev()
            .take(LOOKBACK)
            .find(|e| addr < e.end || (e.start == e.end && e.start == addr))
            .map(|e| &self.names[e.name.0 as usize..(e.name.0 + e.name.1) as usize])
    }
}

/// Why a perf map is not used.
#[derive(Debug)]
pub enum Refusal {
    /// The last component is a symbolic link (`O_NOFOLLOW`).
    Symlink,
    /// Not a regular file: what it is.
    NotRegular(&'static str),
    /// Owned by another user.
    Owner {
        /// The file's owner.
        owner: u32,
        /// The target's real uid.
        target: u32,
    },
    /// It could not be opened or examined.
    Io(std::io::Error),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Symlink => write!(f, "it is a symbolic link"),
            Refusal::NotRegular(kind) => write!(f, "it is {kind}"),
            Refusal::Owner { owner, target } => write!(
                f,
                "it is owned by uid {owner}, the target runs as uid {target}"
            ),
            Refusal::Io(e) => write!(f, "cannot open it ({e})"),
        }
    }
}

/// Opens the perf map at `path` without blocking or following a symlink
/// and checks it: a regular file owned by one of `owners` (root and the
/// target's uids). `Ok(None)` when there is no such file.
pub fn open_checked(
    path: &Path,
    owners: &[u32],
) -> Result<Option<(File, std::fs::Metadata)>, Refusal> {
    let f = match untrusted::open_nonblocking(path, false) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Err(Refusal::Symlink),
        Err(e) => return Err(Refusal::Io(e)),
    };
    let md = f.metadata().map_err(Refusal::Io)?;
    if !md.is_file() {
        return Err(Refusal::NotRegular(untrusted::kind_of(md.mode())));
    }
    if !owners.contains(&md.uid()) {
        return Err(Refusal::Owner {
            owner: md.uid(),
            target: owners.get(1).copied().unwrap_or(0),
        });
    }
    Ok(Some((f, md)))
}

/// Where a process's perf map is, and who may own it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    /// The path opened.
    pub path: PathBuf,
    /// The path as messages name it (`/tmp/perf-PID.map` for a process in
    /// our own root and PID namespace).
    pub shown: String,
    /// Root, then the target's real and effective uids.
    pub owners: Vec<u32>,
}

/// Real and effective uid (`Uid:`) and the PID in the innermost PID
/// namespace (last field of `NStgid:`) from the text of `/proc/PID/status`.
fn parse_status(text: &str) -> Option<(u32, u32, Option<u32>)> {
    let field = |name: &str| text.lines().find_map(|l| l.strip_prefix(name));
    let mut uids = field("Uid:")?.split_whitespace();
    let real = uids.next()?.parse().ok()?;
    let effective = uids.next()?.parse().ok()?;
    let ns_tgid = field("NStgid:").and_then(|l| l.split_whitespace().last()?.parse().ok());
    Some((real, effective, ns_tgid))
}

impl Location {
    /// The perf map of live process `pid`: `/tmp/perf-NSPID.map` seen from
    /// its root (so a containerised JIT's map is found, as blazesym did).
    pub fn of(pid: u32) -> Option<Location> {
        let loc = Self::read(pid);
        let mut seen = REMEMBERED.lock().unwrap_or_else(|e| e.into_inner());
        let seen = seen.get_or_insert_with(HashMap::new);
        match loc {
            Some(loc) => {
                seen.insert(pid, loc.clone());
                Some(loc)
            }
            // Gone: where its map was, and whose it was, while it lived (a
            // launched command often exits before its samples are named).
            None => seen
                .get(&pid)
                .filter(|l| l.path.starts_with("/tmp"))
                .cloned(),
        }
    }

    /// Forgets where exited process `pid`'s map was.
    pub fn forget(pid: u32) {
        let mut seen = REMEMBERED.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(seen) = seen.as_mut() {
            seen.remove(&pid);
        }
    }

    fn read(pid: u32) -> Option<Location> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let (real, effective, ns_tgid) = parse_status(&status)?;
        let ns_pid = ns_tgid.unwrap_or(pid);
        let same_root = match (
            std::fs::metadata(format!("/proc/{pid}/root")),
            std::fs::metadata("/"),
        ) {
            (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
            // No root: a zombie (or gone); what was remembered applies.
            _ => return None,
        };
        let (path, shown) = if same_root && ns_pid == pid {
            let p = format!("/tmp/perf-{pid}.map");
            (PathBuf::from(&p), p)
        } else {
            let p = format!("/proc/{pid}/root/tmp/perf-{ns_pid}.map");
            (PathBuf::from(&p), p)
        };
        let mut owners = vec![0, real];
        if effective != real {
            owners.push(effective);
        }
        Some(Location {
            path,
            shown,
            owners,
        })
    }
}

/// Perf map locations of the processes seen alive, for after they exit.
static REMEMBERED: Mutex<Option<HashMap<u32, Location>>> = Mutex::new(None);

/// Prints `msg` on stderr once per `key` for the whole process (several
/// symbolizers may read the same file).
fn warn_once(key: &str, msg: &str) {
    static SEEN: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    if seen
        .get_or_insert_with(HashSet::new)
        .insert(key.to_string())
    {
        eprintln!("profiler: warning: {msg}");
    }
}

/// The perf map of one process, read when first needed and then again,
/// from where it stopped, when it has grown (at most every
/// [`RELOAD_EVERY`]).
#[derive(Debug)]
pub struct Tracked {
    loc: Option<Location>,
    map: PerfMap,
    /// (device, inode) of the file read, and the bytes consumed from it.
    read: Option<((u64, u64), u64)>,
    checked: Option<Instant>,
    told: bool,
}

impl Tracked {
    /// The perf map of `pid` (nothing is opened yet).
    pub fn new(pid: u32) -> Self {
        Self::at(Location::of(pid))
    }

    /// The perf map at `loc` (None: the process is gone, nothing to read).
    pub fn at(loc: Option<Location>) -> Self {
        Tracked {
            loc,
            map: PerfMap::new(),
            read: None,
            checked: None,
            told: false,
        }
    }

    /// Opens and checks the file: None if there is none, or (with one
    /// warning) if it is refused.
    fn open(&self) -> Option<(File, std::fs::Metadata)> {
        let loc = self.loc.as_ref()?;
        match open_checked(&loc.path, &loc.owners) {
            Ok(found) => found,
            Err(why) => {
                warn_once(
                    &loc.shown,
                    &format!(
                        "ignoring {}: {why} (perf maps must be regular files owned by root or the target's user)",
                        loc.shown
                    ),
                );
                None
            }
        }
    }

    /// Checks the file without reading it, so that a refused one is
    /// reported even when the process has no JIT code to name.
    pub fn check(&self) {
        let _ = self.open();
    }

    /// Reads what is new in the file, if it was not checked within
    /// [`RELOAD_EVERY`]. A file that fails the checks is not read (one
    /// warning); what an earlier, valid version held is kept.
    pub fn refresh(&mut self) {
        self.refresh_within(RELOAD_EVERY);
    }

    /// [`Self::refresh`] if not checked within `every`. Returns whether it
    /// checked the file.
    pub fn refresh_within(&mut self, every: Duration) -> bool {
        if self.checked.is_some_and(|t| t.elapsed() < every) {
            return false;
        }
        self.read_new();
        true
    }

    fn read_new(&mut self) {
        self.checked = Some(Instant::now());
        let Some((mut f, md)) = self.open() else {
            return;
        };
        let Some(loc) = &self.loc else { return };
        let id = (md.dev(), md.ino());
        let from = match self.read {
            Some((old, consumed)) if old == id && md.len() >= consumed => consumed,
            _ => {
                self.map = PerfMap::new();
                0
            }
        };
        let upto = md.len().min(MAX_BYTES);
        if upto > from {
            let mut buf = Vec::new();
            let ok = f.seek(SeekFrom::Start(from)).is_ok()
                && f.by_ref().take(upto - from).read_to_end(&mut buf).is_ok();
            if ok {
                let used = self.map.add(&buf) as u64;
                self.read = Some((id, from + used));
            }
        } else if self.read.is_none() {
            self.read = Some((id, 0));
        }
        if !self.told && (self.map.malformed > 0 || self.map.dropped > 0 || md.len() > MAX_BYTES) {
            self.told = true;
            let mut what = Vec::new();
            if self.map.malformed > 0 {
                what.push(format!("{} malformed line(s) skipped", self.map.malformed));
            }
            if self.map.dropped > 0 {
                what.push(format!(
                    "{} entries past {MAX_ENTRIES} dropped",
                    self.map.dropped
                ));
            }
            if md.len() > MAX_BYTES {
                what.push(format!("only its first {} MiB read", MAX_BYTES >> 20));
            }
            warn_once(
                &format!("{} (content)", loc.shown),
                &format!("{}: {}", loc.shown, what.join(", ")),
            );
        }
    }

    /// The name of the JIT function holding `addr`, if the map has one.
    pub fn lookup(&self, addr: u64) -> Option<&str> {
        self.map.lookup(addr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::{
        ffi::CString,
        os::unix::{ffi::OsStrExt, fs::PermissionsExt},
    };

    fn tmp(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("profiler-perfmap-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn me() -> Vec<u32> {
        // SAFETY: getuid cannot fail.
        vec![0, unsafe { libc::getuid() }]
    }

    #[test]
    fn parses_good_lines() {
        let mut m = PerfMap::new();
        let used = m.add(
            b"7f0000001000 20 LazyCompile:*fib /tmp/x.js:3\n\
              0x7f0000002000 0x10 Builtin:Call\r\n\
              \t7f0000003000\t8\t  spaced  name \n",
        );
        assert_eq!(m.len(), 3);
        assert_eq!(m.malformed, 0);
        assert_eq!(
            m.lookup(0x7f0000001000),
            Some("LazyCompile:*fib /tmp/x.js:3")
        );
        assert_eq!(
            m.lookup(0x7f000000101f),
            Some("LazyCompile:*fib /tmp/x.js:3")
        );
        assert_eq!(m.lookup(0x7f0000001020), None);
        assert_eq!(m.lookup(0x7f0000002008), Some("Builtin:Call"));
        assert_eq!(m.lookup(0x7f0000003004), Some("spaced  name "));
        assert_eq!(m.lookup(0x10), None);
        assert!(used > 0);
    }

    #[test]
    fn malformed_and_overflowing_lines_are_skipped_and_counted() {
        let mut m = PerfMap::new();
        m.add(
            b"zzzz 10 bad_start\n\
              1000 qq bad_size\n\
              1000 10\n\
              1000\n\
              ffffffffffffffff 2 overflows\n\
              10000000000000000 1 too_many_digits\n\
              +100 1 plus_sign\n\
              0x 1 empty_hex\n\
              \n\
              2000 10 good\n",
        );
        assert_eq!(m.len(), 1, "{m:?}");
        assert_eq!(m.malformed, 8);
        assert_eq!(m.lookup(0x2001), Some("good"));
        // The end of the address space is reachable without overflow.
        m.add(b"fffffffffffffff0 f top\n");
        assert_eq!(m.lookup(0xfffffffffffffffe), Some("top"));
        assert_eq!(m.lookup(u64::MAX), None);
    }

    #[test]
    fn control_bytes_and_invalid_utf8_are_neutralised() {
        let mut m = PerfMap::new();
        m.add(b"1000 10 evil\x1b[31m\x07;</script>&<b>\xff\r\n");
        let name = m.lookup(0x1000).unwrap();
        assert_eq!(name, "evil?[31m?;</script>&<b>\u{fffd}");
        assert!(!name.chars().any(char::is_control));
        // As it ends up in cpu.folded: still one frame on one line.
        let frame = crate::text::folded_frame(name);
        assert!(!frame.contains(';') && !frame.contains('\n'));
        // Long names are cut.
        let mut long = b"2000 10 ".to_vec();
        long.extend(std::iter::repeat_n(b'x', MAX_NAME * 2));
        long.push(b'\n');
        m.add(&long);
        assert_eq!(m.lookup(0x2000).unwrap().len(), MAX_NAME);
    }

    #[test]
    fn partial_last_line_waits_and_later_entries_win() {
        let mut m = PerfMap::new();
        let used = m.add(b"1000 10 first\n2000 10 unfinish");
        assert_eq!(used, 14);
        assert_eq!(m.lookup(0x2000), None);
        m.add(b"2000 10 finished\n1000 10 moved\n");
        assert_eq!(m.lookup(0x2000), Some("finished"));
        assert_eq!(m.lookup(0x1000), Some("moved"));
        assert_eq!(m.len(), 2);
        // Overlap: the nearest start holding the address wins.
        m.add(b"3000 1000 outer\n3100 10 inner\n");
        assert_eq!(m.lookup(0x3105), Some("inner"));
        assert_eq!(m.lookup(0x3200), Some("outer"));
        // Size 0 holds its start only.
        m.add(b"5000 0 empty\n");
        assert_eq!(m.lookup(0x5000), Some("empty"));
        assert_eq!(m.lookup(0x5001), None);
    }

    #[test]
    fn lookup_in_many_entries() {
        let mut text = String::new();
        for i in 0..10_000u64 {
            text.push_str(&format!("{:x} 10 f{i}\n", 0x10000 + i * 0x20));
        }
        let mut m = PerfMap::new();
        m.add(text.as_bytes());
        assert_eq!(m.len(), 10_000);
        assert_eq!(m.lookup(0x10000 + 1234 * 0x20 + 5), Some("f1234"));
        assert_eq!(m.lookup(0x10000 + 1234 * 0x20 + 0x10), None, "gap");
        assert_eq!(m.lookup(0xffff), None);
    }

    #[test]
    fn regular_file_of_an_allowed_owner_is_read() {
        let d = tmp("ok");
        let p = d.join("perf-1.map");
        std::fs::write(&p, b"1000 10 jitted\n").unwrap();
        let (f, _) = open_checked(&p, &me()).unwrap().unwrap();
        drop(f);
        assert!(open_checked(&d.join("absent.map"), &me())
            .unwrap()
            .is_none());
        let mut t = Tracked::at(Some(Location {
            path: p.clone(),
            shown: p.display().to_string(),
            owners: me(),
        }));
        t.refresh();
        assert_eq!(t.lookup(0x1008), Some("jitted"));
        // Grown: read again from where it stopped (once RELOAD_EVERY passed).
        let mut f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
        std::io::Write::write_all(&mut f, b"2000 10 later\n").unwrap();
        t.refresh();
        assert_eq!(
            t.lookup(0x2000),
            None,
            "not yet: checked less than a second ago"
        );
        // A miss may look again sooner (RELOAD_ON_MISS), not at once.
        t.checked = Some(Instant::now());
        assert!(!t.refresh_within(RELOAD_ON_MISS));
        assert_eq!(t.lookup(0x2000), None);
        std::thread::sleep(RELOAD_ON_MISS);
        assert!(t.refresh_within(RELOAD_ON_MISS));
        assert_eq!(t.lookup(0x2000), Some("later"));
        assert_eq!(t.lookup(0x1000), Some("jitted"));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn fifo_is_refused_without_blocking() {
        let d = tmp("fifo");
        let p = d.join("perf-2.map");
        let c = CString::new(p.as_os_str().as_bytes()).unwrap();
        // SAFETY: mkfifo with a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0);
        let err = open_checked(&p, &me()).unwrap_err();
        assert!(matches!(err, Refusal::NotRegular("a FIFO")), "{err}");
        // Tracked gives up on it and reads nothing.
        let mut t = Tracked::at(Some(Location {
            path: p.clone(),
            shown: p.display().to_string(),
            owners: me(),
        }));
        t.refresh();
        assert!(t.map.is_empty());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn symlink_is_refused() {
        let d = tmp("link");
        let target = d.join("real");
        std::fs::write(&target, b"1000 10 PLANTED_NAME\n").unwrap();
        let p = d.join("perf-3.map");
        std::os::unix::fs::symlink(&target, &p).unwrap();
        let err = open_checked(&p, &me()).unwrap_err();
        assert!(matches!(err, Refusal::Symlink), "{err}");
        assert_eq!(err.to_string(), "it is a symbolic link");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn directory_is_refused() {
        let d = tmp("dir");
        let p = d.join("perf-4.map");
        std::fs::create_dir(&p).unwrap();
        let err = open_checked(&p, &me()).unwrap_err();
        assert!(matches!(err, Refusal::NotRegular("a directory")), "{err}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn file_of_another_user_is_refused() {
        let d = tmp("owner");
        let p = d.join("perf-5.map");
        std::fs::write(&p, b"1000 10 PLANTED_NAME\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            // As root: give it to nobody (65534), the target runs as root.
            std::os::unix::fs::chown(&p, Some(65534), Some(65534)).unwrap();
            let err = open_checked(&p, &[0, 0]).unwrap_err();
            assert!(
                matches!(
                    err,
                    Refusal::Owner {
                        owner: 65534,
                        target: 0
                    }
                ),
                "{err}"
            );
            assert_eq!(
                err.to_string(),
                "it is owned by uid 65534, the target runs as uid 0"
            );
        } else {
            // Not root: our own file, for a target of another user.
            // SAFETY: getuid cannot fail.
            let other = if unsafe { libc::getuid() } == 65534 {
                65533
            } else {
                65534
            };
            let err = open_checked(&p, &[0, other]).unwrap_err();
            assert!(
                matches!(err, Refusal::Owner { target, .. } if target == other),
                "{err}"
            );
        }
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn status_fields() {
        let text = "Name:\tnode\nTgid:\t42\nNStgid:\t42\t7\nUid:\t1000\t1001\t1000\t1000\n";
        assert_eq!(parse_status(text), Some((1000, 1001, Some(7))));
        assert_eq!(parse_status("Uid:\tx\n"), None);
        let loc = Location::of(std::process::id()).unwrap();
        assert_eq!(loc.shown, format!("/tmp/perf-{}.map", std::process::id()));
        assert_eq!(loc.owners[0], 0);
    }
}
