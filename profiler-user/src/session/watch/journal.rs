//! What `watch` writes, as it happens: a line per stall appended to
//! `stalls.jsonl` (one `write` each, so a line is whole or absent, even
//! after a SIGKILL), `groups.json` rewritten atomically (a temporary file
//! renamed over it), and the full reports of each group's first and worst
//! stalls under `groups/ID/`, and `--profile-every`'s pprof files
//! ([`super::profiles`]), all within `--max-disk`: past it the oldest
//! profiles go first, then the oldest reports, then the oldest rotated
//! `stalls.N.jsonl`; the
//! counts in `groups.json` are never lost. A watcher started again on the
//! same directory appends, and carries on its groups' counts.
use std::{
    collections::{HashMap, VecDeque},
    fs::{self, File},
    io::Write,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use super::files::{append, out_err, subdir, write_new};
use super::profiles::Profiles;
use crate::{
    analyze::dispatch::retain::Durations,
    output::watch::{
        report_svg, report_text, Escalation, GroupEntry, GroupsFile, StallLine, StallReport,
    },
    text::fmt_ns,
    Result,
};

/// The lines' file.
pub const STALLS: &str = "stalls.jsonl";
/// The groups' summary.
pub const GROUPS: &str = "groups.json";
/// Most groups kept apart; the stalls of later keys are counted in
/// [`OTHER`].
const MAX_GROUPS: usize = 1_000;
/// The group of stalls past [`MAX_GROUPS`].
const OTHER: &str = "other";
/// `groups.json` is rewritten at most this often (and at the end).
const GROUPS_EVERY: Duration = Duration::from_secs(1);
/// The processes a group remembers.
const MAX_PIDS: usize = 16;

/// Limits and choices of the journal.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// `--max-disk`.
    pub max_disk: u64,
    /// `--max-reports-per-hour`, per group.
    pub per_hour: u32,
    /// `--worst`: reports kept per group besides its first.
    pub worst: usize,
}

/// A full report on disk.
#[derive(Debug, Clone)]
struct Kept {
    group: String,
    /// The path of its files without the extension, relative to the
    /// directory (`groups/ID/NAME`).
    base: String,
    bytes: u64,
    duration_ns: u64,
    first: bool,
}

#[derive(Debug, Default)]
struct Group {
    entry: GroupEntry,
    durations: Durations,
    /// When its last reports were told, for the hourly limit.
    told: VecDeque<Instant>,
}

/// The output directory of a watch.
pub struct Journal {
    dir: PathBuf,
    limits: Limits,
    stalls: File,
    /// Bytes in `stalls.jsonl` now.
    stalls_bytes: u64,
    /// Rotated `stalls.N.jsonl`, oldest first, with their sizes.
    segments: VecDeque<(u32, u64)>,
    groups: HashMap<String, Group>,
    file: GroupsFile,
    /// Reports on disk, oldest first.
    reports: VecDeque<Kept>,
    /// Bytes of everything it wrote that is still on disk.
    usage: u64,
    /// `--profile-every`'s pprof files, deleted first past the cap.
    profiles: Profiles,
    dirty: bool,
    /// An escalation changed since the last write: written with the next
    /// change of the counts, or at the end (it never spends the once a
    /// second a stall's count is written in at once).
    escalated: bool,
    last_groups: Instant,
}

/// A group's stable id: the FNV-1a hash of its key, in hex. The same key
/// gives the same id in every process and every run.
pub fn group_id(key: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

impl Journal {
    /// Opens (or creates) `dir`: what a watcher left there is carried on.
    pub fn open(dir: &Path, limits: Limits) -> Result<Self> {
        let out = crate::output::OutDir::prepare(dir, &[STALLS, GROUPS])?;
        let dir = out.path().to_path_buf();
        let path = dir.join(STALLS);
        let mut stalls = append(&path)?;
        let mut stalls_bytes = fs::metadata(&path).map_or(0, |m| m.len());
        // A line cut short (the disk was full) is ended, so the next one
        // starts a line of its own.
        if stalls_bytes > 0 && !ends_with_newline(&path) {
            stalls.write_all(b"\n").map_err(|e| out_err(&path, e))?;
            stalls_bytes += 1;
        }
        let mut segments: Vec<(u32, u64)> = fs::read_dir(&dir)
            .map_err(|e| out_err(&dir, e))?
            .filter_map(|e| {
                let e = e.ok()?;
                let name = e.file_name().into_string().ok()?;
                let n = name
                    .strip_prefix("stalls.")?
                    .strip_suffix(".jsonl")?
                    .parse()
                    .ok()?;
                Some((n, e.metadata().ok()?.len()))
            })
            .collect();
        segments.sort_unstable();
        let file: GroupsFile = fs::read(dir.join(GROUPS))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        let mut groups = HashMap::new();
        let mut reports = Vec::new();
        let mut usage = stalls_bytes + segments.iter().map(|s| s.1).sum::<u64>();
        for e in &file.groups {
            for base in &e.reports {
                let bytes = ["json", "txt", "svg"]
                    .iter()
                    .filter_map(|x| fs::metadata(dir.join(format!("{base}.{x}"))).ok())
                    .map(|m| m.len())
                    .sum();
                usage += bytes;
                reports.push(Kept {
                    group: e.group.clone(),
                    base: base.clone(),
                    bytes,
                    duration_ns: 0,
                    first: false,
                });
            }
            groups.insert(
                e.group.clone(),
                Group {
                    entry: GroupEntry {
                        p50_ns: 0,
                        p95_ns: 0,
                        percentiles_of: 0,
                        ..e.clone()
                    },
                    ..Group::default()
                },
            );
        }
        let profiles = Profiles::open(&dir);
        usage += profiles.bytes();
        // Oldest first, by the file's age.
        reports.sort_by_key(|k| {
            fs::metadata(dir.join(format!("{}.json", k.base)))
                .and_then(|m| m.modified())
                .ok()
        });
        Ok(Journal {
            dir,
            limits,
            stalls,
            stalls_bytes,
            segments: segments.into(),
            groups,
            file: GroupsFile {
                groups: Vec::new(),
                ..file
            },
            reports: reports.into(),
            usage,
            profiles,
            dirty: true,
            escalated: false,
            last_groups: Instant::now() - GROUPS_EVERY,
        })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// SIGHUP (log rotation): `stalls.jsonl` opened again, a new file if
    /// it was moved away.
    pub fn reopen(&mut self) -> Result<()> {
        let path = self.dir.join(STALLS);
        self.stalls = append(&path)?;
        self.stalls_bytes = fs::metadata(&path).map_or(0, |m| m.len());
        Ok(())
    }

    /// A process is watched from now on.
    pub fn watching(&mut self) {
        self.file.processes_watched += 1;
        self.dirty = true;
    }

    /// A stall: counted in its group, its line appended, a report written
    /// if it is its group's first or among its worst, the disk cap kept.
    /// Returns the line as written.
    pub fn stall(&mut self, mut report: StallReport) -> Result<StallLine> {
        let now = Instant::now();
        let gid = self.group_of(&report.line.key);
        let limits = self.limits;
        let g = self.groups.get_mut(&gid).expect("group_of made it");
        g.told
            .retain(|t| now.duration_since(*t) < Duration::from_secs(3600));
        let limited = g.told.len() >= limits.per_hour as usize;
        let line = &mut report.line;
        line.group = gid.clone();
        let e = &mut g.entry;
        e.count += 1;
        e.total_ns = e.total_ns.saturating_add(line.duration_ns);
        if line.duration_ns >= e.max_ns {
            e.verdict = line.verdict.clone();
        }
        e.max_ns = e.max_ns.max(line.duration_ns);
        g.durations.add(line.duration_ns);
        e.p50_ns = g.durations.quantile_ns(0.50);
        e.p95_ns = g.durations.p95_ns();
        e.percentiles_of = g.durations.count();
        if e.first_seen.is_empty() {
            e.first_seen = line.time.clone();
        }
        e.last_seen = line.time.clone();
        e.pids.retain(|&p| p != line.pid);
        e.pids.push(line.pid);
        if e.pids.len() > MAX_PIDS {
            e.pids.remove(0);
        }
        let first = e.count == 1;
        self.file.stalls += 1;
        self.dirty = true;
        if limited {
            e.rate_limited += 1;
            line.rate_limited = true;
            line.call_tree = None;
        } else {
            g.told.push_back(now);
        }
        let worth = !limited && (first || self.among_worst(&gid, report.line.duration_ns));
        if worth {
            let base = format!(
                "groups/{gid}/{}-pid{}-{}",
                report.line.time.replace([':', '.'], "").replace('-', ""),
                report.line.pid,
                report.line.index
            );
            report.line.report = Some(format!("{base}.txt"));
            self.write_report(&gid, &base, &report, first)?;
        }
        let line = report.line;
        self.append_line(&line)?;
        if !limited {
            eprintln!(
                "profiler: PID {}: stall {} [{}] {}",
                line.pid,
                fmt_ns(line.duration_ns),
                line.key,
                line.verdict
            );
        }
        self.keep_cap()?;
        Ok(line)
    }

    /// A hang, told while it runs (`"hang": true`).
    pub fn hang(&mut self, mut line: StallLine) -> Result<()> {
        line.group = self.group_of(&line.key);
        self.file.hangs += 1;
        self.dirty = true;
        eprintln!(
            "profiler: HANG: PID {} thread {} running for {} and not finished: {}",
            line.pid,
            line.tid,
            fmt_ns(line.duration_ns),
            line.verdict
        );
        self.append_line(&line)?;
        self.keep_cap()
    }

    /// An iteration that was not the program's stall (stopped, suspended).
    pub fn excluded(&mut self, reason: &str) {
        match self.file.excluded.iter_mut().find(|(r, _)| r == reason) {
            Some((_, n)) => *n += 1,
            None => self.file.excluded.push((reason.to_string(), 1)),
        }
        self.dirty = true;
    }

    /// SIGUSR1's snapshot of a process's flight recorder: `snapshots/`.
    pub fn snapshot(
        &mut self,
        pid: u32,
        comm: &str,
        samples: usize,
        keep_ns: u64,
        folded: &[String],
    ) -> Result<PathBuf> {
        let dir = subdir(&self.dir, "snapshots")?;
        let stamp =
            crate::clock::rfc3339(crate::clock::unix_of_monotonic(crate::clock::monotonic_ns()))
                .replace([':', '.', '-'], "");
        let base = format!("snapshots/{stamp}-pid{pid}");
        let mut text = format!(
            "the flight recorder of PID {pid} ({comm}): {samples} samples of its watched thread in the last {}\n",
            fmt_ns(keep_ns)
        );
        let mut sorted: Vec<&String> = folded.iter().collect();
        sorted.sort_by_key(|l| {
            std::cmp::Reverse(l.rsplit_once(' ').and_then(|(_, n)| n.parse::<u64>().ok()))
        });
        for l in sorted {
            text.push_str(l);
            text.push('\n');
        }
        let mut bytes = text.len() as u64;
        write_new(&self.dir.join(format!("{base}.txt")), text.as_bytes())?;
        if !folded.is_empty() {
            let title = format!("PID {pid} ({comm}): the last {}", fmt_ns(keep_ns));
            if let Ok(svg) = crate::output::report::flame::svg(folded, &title) {
                bytes += svg.len() as u64;
                write_new(&self.dir.join(format!("{base}.svg")), &svg)?;
            }
        }
        self.usage += bytes;
        self.reports.push_back(Kept {
            group: String::new(),
            base,
            bytes,
            duration_ns: 0,
            first: false,
        });
        self.keep_cap()?;
        Ok(dir)
    }

    /// A window's pprof of process `pid` (`--profile-every`), begun at
    /// `unix_ns`: `profiles/PID-TIME.pb.gz`, within the cap. Returns its
    /// path, relative to the directory.
    pub fn profile(&mut self, pid: u32, unix_ns: u64, gz: &[u8]) -> Result<String> {
        let (rel, bytes) = self.profiles.write(&self.dir, pid, unix_ns, gz)?;
        self.usage += bytes;
        self.file.profiles_written += 1;
        self.dirty = true;
        self.keep_cap()?;
        Ok(rel)
    }

    /// Rewrites `groups.json` if it changed, at most once a second
    /// (`now`: at once).
    pub fn flush_groups(&mut self, now: bool) -> Result<()> {
        if !(self.dirty || (now && self.escalated))
            || (!now && self.last_groups.elapsed() < GROUPS_EVERY)
        {
            return Ok(());
        }
        self.dirty = false;
        self.escalated = false;
        self.last_groups = Instant::now();
        let mut groups: Vec<GroupEntry> = self.groups.values().map(|g| g.entry.clone()).collect();
        groups.sort_by(|a, b| b.total_ns.cmp(&a.total_ns).then(a.group.cmp(&b.group)));
        let doc = GroupsFile {
            groups,
            ..self.file.clone()
        };
        let mut json = serde_json::to_string_pretty(&doc).expect("plain data serializes");
        json.push('\n');
        let tmp = self.dir.join(format!(".{GROUPS}.tmp"));
        write_new(&tmp, json.as_bytes())?;
        let path = self.dir.join(GROUPS);
        fs::rename(&tmp, &path).map_err(|e| out_err(&path, e))
    }

    /// Group `key`'s escalation changed (`--trace-stalls`): kept in its
    /// entry of `groups.json`.
    pub fn escalation(&mut self, key: &str, e: Escalation) {
        let gid = self.group_of(key);
        if let Some(g) = self.groups.get_mut(&gid) {
            g.entry.escalation = Some(e);
            self.escalated = true;
        }
    }

    /// The group of `key`, made if new (past [`MAX_GROUPS`]: [`OTHER`]).
    fn group_of(&mut self, key: &str) -> String {
        let mut gid = group_id(key);
        if !self.groups.contains_key(&gid) && self.groups.len() >= MAX_GROUPS {
            gid = OTHER.to_string();
        }
        self.groups.entry(gid.clone()).or_insert_with(|| Group {
            entry: GroupEntry {
                group: gid.clone(),
                key: match gid == OTHER {
                    true => format!("(stalls of keys past the first {MAX_GROUPS})"),
                    false => key.to_string(),
                },
                ..GroupEntry::default()
            },
            ..Group::default()
        });
        gid
    }

    /// True when a stall of `duration_ns` belongs among group `gid`'s
    /// worst reports.
    fn among_worst(&self, gid: &str, duration_ns: u64) -> bool {
        let worst: Vec<u64> = self
            .reports
            .iter()
            .filter(|k| k.group == gid && !k.first)
            .map(|k| k.duration_ns)
            .collect();
        worst.len() < self.limits.worst || worst.iter().any(|&d| d < duration_ns)
    }

    /// Writes a report's files, and lets go of the group's report that it
    /// pushed out of the worst.
    fn write_report(&mut self, gid: &str, base: &str, r: &StallReport, first: bool) -> Result<()> {
        subdir(&self.dir, &format!("groups/{gid}"))?;
        let mut json = serde_json::to_string_pretty(r).expect("plain data serializes");
        json.push('\n');
        let text = report_text(r);
        let mut bytes = (json.len() + text.len()) as u64;
        write_new(&self.dir.join(format!("{base}.json")), json.as_bytes())?;
        write_new(&self.dir.join(format!("{base}.txt")), text.as_bytes())?;
        if let Some(svg) = report_svg(r) {
            bytes += svg.len() as u64;
            write_new(&self.dir.join(format!("{base}.svg")), &svg)?;
        }
        self.usage += bytes;
        self.reports.push_back(Kept {
            group: gid.to_string(),
            base: base.to_string(),
            bytes,
            duration_ns: r.line.duration_ns,
            first,
        });
        if let Some(g) = self.groups.get_mut(gid) {
            g.entry.reports.push(base.to_string());
        }
        let worst: Vec<usize> = (0..self.reports.len())
            .filter(|&i| self.reports[i].group == gid && !self.reports[i].first)
            .collect();
        if worst.len() > self.limits.worst {
            let shortest = worst
                .into_iter()
                .min_by_key(|&i| self.reports[i].duration_ns)
                .expect("more than none");
            self.delete_report(shortest);
        }
        Ok(())
    }

    fn delete_report(&mut self, at: usize) {
        let Some(k) = self.reports.remove(at) else {
            return;
        };
        for x in ["json", "txt", "svg"] {
            let _ = fs::remove_file(self.dir.join(format!("{}.{x}", k.base)));
        }
        self.usage = self.usage.saturating_sub(k.bytes);
        if let Some(g) = self.groups.get_mut(&k.group) {
            g.entry.reports.retain(|b| *b != k.base);
        }
        self.dirty = true;
    }

    /// Appends a line in one write: whole, or not at all.
    fn append_line(&mut self, line: &StallLine) -> Result<()> {
        let mut text = serde_json::to_string(line).expect("plain data serializes");
        text.push('\n');
        let path = self.dir.join(STALLS);
        self.stalls
            .write_all(text.as_bytes())
            .map_err(|e| out_err(&path, e))?;
        self.stalls_bytes += text.len() as u64;
        self.usage += text.len() as u64;
        Ok(())
    }

    /// Within `--max-disk`: `stalls.jsonl` rotated past a quarter of it;
    /// then the oldest profiles deleted, then the oldest reports, then the
    /// oldest rotated lines.
    fn keep_cap(&mut self) -> Result<()> {
        let cap = self.limits.max_disk;
        if self.stalls_bytes > cap / 4 {
            let n = self.segments.back().map_or(1, |s| s.0 + 1);
            let from = self.dir.join(STALLS);
            let to = self.dir.join(format!("stalls.{n}.jsonl"));
            fs::rename(&from, &to).map_err(|e| out_err(&to, e))?;
            self.segments.push_back((n, self.stalls_bytes));
            self.stalls = append(&from)?;
            self.stalls_bytes = 0;
            eprintln!(
                "profiler: {} rotated to {} ({} of --max-disk {})",
                from.display(),
                to.display(),
                crate::text::fmt_bytes(self.segments.back().map_or(0, |s| s.1)),
                crate::text::fmt_bytes(cap)
            );
        }
        let reserve = 64 * 1024;
        while self.usage + reserve > cap {
            if let Some((bytes, was_there)) = self.profiles.delete_oldest(&self.dir) {
                self.usage = self.usage.saturating_sub(bytes);
                self.file.profiles_deleted += u64::from(was_there);
                self.dirty = true;
                continue;
            }
            if !self.reports.is_empty() {
                self.delete_report(0);
                self.file.reports_deleted += 1;
                continue;
            }
            let Some((n, bytes)) = self.segments.pop_front() else {
                break;
            };
            let path = self.dir.join(format!("stalls.{n}.jsonl"));
            let lines = fs::read(&path).map_or(0, |b| b.iter().filter(|&&c| c == b'\n').count());
            let _ = fs::remove_file(&path);
            self.file.lines_deleted += lines as u64;
            self.usage = self.usage.saturating_sub(bytes);
            self.dirty = true;
        }
        Ok(())
    }
}

/// True when the file at `path` ends with a newline.
fn ends_with_newline(path: &Path) -> bool {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = File::open(path) else {
        return true;
    };
    let mut last = [0u8];
    f.seek(SeekFrom::End(-1)).is_err() || (f.read_exact(&mut last).is_ok() && last[0] == b'\n')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::watch::Node;

    fn tmp(name: &str) -> PathBuf {
        let p =
            std::env::temp_dir().join(format!("profiler-journal-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&p);
        p
    }

    fn report(key: &str, duration_ns: u64, index: u64) -> StallReport {
        StallReport {
            line: StallLine {
                pid: 42,
                tid: 42,
                comm: "app".into(),
                exe: "/usr/bin/app".into(),
                index,
                start_ns: index * 1_000_000_000,
                time: format!("2026-12-01T00:00:{:02}.000000Z", index % 60),
                duration_ns,
                on_cpu_ns: duration_ns,
                blocked_ns: 0,
                runnable_ns: 0,
                key: key.into(),
                group: String::new(),
                verdict: format!("on-CPU in {key}"),
                waker: None,
                source: None,
                tree: "sampled".into(),
                escalation: None,
                probe_ns: 0,
                samples: 10,
                hang: false,
                uncertain: None,
                rate_limited: false,
                report: None,
                call_tree: Some(Node {
                    name: key.into(),
                    calls: 10,
                    total_ns: duration_ns,
                    self_ns: duration_ns,
                    kind: "sampled".into(),
                    children: Vec::new(),
                }),
            },
            folded: vec![format!("{key} {duration_ns}")],
            before: vec!["main;idle 3".into()],
            keep_ns: 5_000_000_000,
            blocking_stacks: Vec::new(),
            wakers: Vec::new(),
        }
    }

    fn limits(max_disk: u64) -> Limits {
        Limits {
            max_disk,
            per_hour: 1_000,
            worst: 2,
        }
    }

    #[test]
    fn every_stall_is_a_line_and_counted_within_the_disk_cap() {
        let d = tmp("cap");
        let mut j = Journal::open(&d, limits(256 * 1024)).unwrap();
        for i in 0..400 {
            let key = format!("key{}", i % 7);
            j.stall(report(&key, 100_000_000 + i * 1_000, i)).unwrap();
        }
        j.flush_groups(true).unwrap();
        let g: GroupsFile = serde_json::from_slice(&fs::read(d.join(GROUPS)).unwrap()).unwrap();
        assert_eq!(g.stalls, 400);
        assert_eq!(g.groups.iter().map(|e| e.count).sum::<u64>(), 400);
        let total: u64 = walk(&d);
        assert!(total <= 256 * 1024, "{total} bytes on disk");
        // Every line on disk parses, and the lines' count plus the deleted
        // ones is every stall.
        let mut lines = 0;
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "jsonl") {
                for l in fs::read_to_string(&p).unwrap().lines() {
                    let _: StallLine = serde_json::from_str(l).unwrap();
                    lines += 1;
                }
            }
        }
        assert_eq!(lines + g.lines_deleted, 400);
        fs::remove_dir_all(&d).unwrap();
    }

    fn walk(d: &Path) -> u64 {
        fs::read_dir(d)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                match e.file_type().unwrap().is_dir() {
                    true => walk(&e.path()),
                    false => e.metadata().unwrap().len(),
                }
            })
            .sum()
    }

    #[test]
    fn a_group_keeps_its_first_and_its_worst_reports() {
        let d = tmp("worst");
        let mut j = Journal::open(&d, limits(100 << 20)).unwrap();
        for (i, ms) in [150u64, 120, 400, 130, 300, 500].into_iter().enumerate() {
            j.stall(report("k", ms * 1_000_000, i as u64)).unwrap();
        }
        j.flush_groups(true).unwrap();
        let g: GroupsFile = serde_json::from_slice(&fs::read(d.join(GROUPS)).unwrap()).unwrap();
        let e = &g.groups[0];
        assert_eq!(e.count, 6);
        assert_eq!(e.max_ns, 500_000_000);
        assert_eq!(e.group, group_id("k"));
        // The first (150 ms), and the worst two: 500 and 400 ms.
        assert_eq!(e.reports.len(), 3, "{:?}", e.reports);
        for r in &e.reports {
            assert!(d.join(format!("{r}.txt")).is_file());
        }
        let kept: Vec<u64> = e
            .reports
            .iter()
            .map(|r| {
                let rep: StallReport =
                    serde_json::from_slice(&fs::read(d.join(format!("{r}.json"))).unwrap())
                        .unwrap();
                rep.line.duration_ns / 1_000_000
            })
            .collect();
        assert!(
            kept.contains(&150) && kept.contains(&500) && kept.contains(&400),
            "{kept:?}"
        );
        // Started again on the same directory: the counts carry on, the
        // lines append.
        drop(j);
        let mut j = Journal::open(&d, limits(100 << 20)).unwrap();
        j.stall(report("k", 110_000_000, 9)).unwrap();
        j.flush_groups(true).unwrap();
        let g: GroupsFile = serde_json::from_slice(&fs::read(d.join(GROUPS)).unwrap()).unwrap();
        assert_eq!(g.groups[0].count, 7);
        assert_eq!(g.stalls, 7);
        assert_eq!(
            fs::read_to_string(d.join(STALLS)).unwrap().lines().count(),
            7
        );
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn past_the_hourly_limit_a_stall_is_a_line_without_a_tree() {
        let d = tmp("limit");
        let mut j = Journal::open(
            &d,
            Limits {
                per_hour: 2,
                ..limits(100 << 20)
            },
        )
        .unwrap();
        let lines: Vec<StallLine> = (0..5)
            .map(|i| j.stall(report("k", 200_000_000, i)).unwrap())
            .collect();
        assert_eq!(lines.iter().filter(|l| l.rate_limited).count(), 3);
        assert!(lines[4].call_tree.is_none() && lines[0].call_tree.is_some());
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_cut_line_is_ended_before_the_next() {
        let d = tmp("cut");
        fs::create_dir_all(&d).unwrap();
        fs::write(d.join(STALLS), b"{\"pid\":1").unwrap();
        let mut j = Journal::open(&d, limits(100 << 20)).unwrap();
        j.stall(report("k", 200_000_000, 1)).unwrap();
        let text = fs::read_to_string(d.join(STALLS)).unwrap();
        let last = text.lines().last().unwrap();
        let _: StallLine = serde_json::from_str(last).unwrap();
        fs::remove_dir_all(&d).unwrap();
    }
}
