//! Exports to other tools' formats, each self-contained: `pprof`
//! (`profile.pb.gz` for pprof, Pyroscope, Parca, Grafana), `trace` (Chrome
//! Trace Event JSON for Perfetto and chrome://tracing) and `diff`
//! (differential flame graph of two folded files).
pub mod diff;
mod pprof;
pub mod trace;

use self::pprof::{Frame, Sample, ValueType};

/// Builds pprof samples from folded lines (`a;b;c count`), outermost frame
/// first; `_[k]` marks kernel frames and `_[i]` inlined ones. Each line's
/// count becomes `values(count)`.
pub fn pprof_from_folded(lines: &[String], values: impl Fn(i64) -> Vec<i64>) -> Vec<Sample> {
    lines
        .iter()
        .filter_map(|line| {
            let (path, count) = line.rsplit_once(' ')?;
            let count: i64 = count.parse().ok()?;
            let frames = path
                .split(';')
                .map(|f| {
                    if let Some(name) = f.strip_suffix("_[k]") {
                        Frame {
                            name: name.to_string(),
                            kernel: true,
                            ..Frame::default()
                        }
                    } else if let Some(name) = f.strip_suffix("_[i]") {
                        Frame {
                            name: name.to_string(),
                            inlined: true,
                            ..Frame::default()
                        }
                    } else {
                        Frame {
                            name: f.to_string(),
                            ..Frame::default()
                        }
                    }
                })
                .collect();
            Some(Sample {
                frames,
                values: values(count),
                labels: Vec::new(),
            })
        })
        .collect()
}

/// `profile.pb.gz` for a system-wide CPU profile: each process's stacks
/// (`by_pid`: (pid, folded path) -> samples) labelled `cgroup` with the
/// process's cgroup from `cgroups`, where known.
pub fn cpu_pprof_by_cgroup(
    by_pid: &std::collections::BTreeMap<(u32, String), u64>,
    cgroups: &std::collections::BTreeMap<u32, String>,
    hz: u64,
    duration_ns: u64,
    start_unix_ns: i64,
) -> Vec<u8> {
    let period = 1_000_000_000 / hz.max(1) as i64;
    let samples: Vec<Sample> = by_pid
        .iter()
        .flat_map(|((pid, path), n)| {
            let line = format!("{path} {n}");
            let mut s = pprof_from_folded(&[line], |n| vec![n, n * period]);
            if let Some(cg) = cgroups.get(pid) {
                for x in &mut s {
                    x.labels.push(("cgroup".to_string(), cg.clone()));
                }
            }
            s
        })
        .collect();
    let types = [
        ValueType::new("samples", "count"),
        ValueType::new("cpu", "nanoseconds"),
    ];
    pprof::encode(
        &samples,
        &types,
        ValueType::new("cpu", "nanoseconds"),
        period,
        duration_ns as i64,
        start_unix_ns,
    )
}

/// Unix time now, in nanoseconds, minus `ago_ns`: a session's wall start.
pub fn unix_ns_ago(ago_ns: u64) -> i64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64);
    now - ago_ns as i64
}

/// `profile.pb.gz` for a wall-clock trace (`trace.folded` lines, ns).
pub fn wall_pprof(lines: &[String], duration_ns: u64, start_unix_ns: i64) -> Vec<u8> {
    let samples = pprof_from_folded(lines, |ns| vec![ns]);
    let wall = ValueType::new("wall", "nanoseconds");
    pprof::encode(
        &samples,
        std::slice::from_ref(&wall),
        wall.clone(),
        1,
        duration_ns as i64,
        start_unix_ns,
    )
}

/// `profile.pb.gz` for a CPU profile (`cpu.folded` lines, sample counts).
pub fn cpu_pprof(lines: &[String], hz: u64, duration_ns: u64, start_unix_ns: i64) -> Vec<u8> {
    let period = 1_000_000_000 / hz.max(1) as i64;
    let samples = pprof_from_folded(lines, |n| vec![n, n * period]);
    let types = [
        ValueType::new("samples", "count"),
        ValueType::new("cpu", "nanoseconds"),
    ];
    pprof::encode(
        &samples,
        &types,
        ValueType::new("cpu", "nanoseconds"),
        period,
        duration_ns as i64,
        start_unix_ns,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folded_lines_become_samples() {
        let s = pprof_from_folded(
            &[
                "app;main;memcpy_[i];do_sys_[k] 7".to_string(),
                "bad".to_string(),
            ],
            |n| vec![n, 2 * n],
        );
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].values, vec![7, 14]);
        assert_eq!(s[0].frames.len(), 4);
        assert!(s[0].frames[2].inlined && s[0].frames[2].name == "memcpy");
        assert!(s[0].frames[3].kernel && s[0].frames[3].name == "do_sys");
    }
}
