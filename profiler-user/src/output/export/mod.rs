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
    cpu_encode(&samples, period, duration_ns, start_unix_ns)
}

/// A named stack of a `watch --profile-every` window: its frames
/// (outermost first), its labels (`pid`, `comm`, …, `stalled`), its
/// samples and the CPU time they stand for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelledStack {
    /// Frame names, outermost first (never empty).
    pub frames: Vec<String>,
    /// (key, value) string labels.
    pub labels: Vec<(String, String)>,
    /// Samples.
    pub samples: i64,
    /// CPU nanoseconds: each sample weighs the periods it stands for.
    pub cpu_ns: i64,
}

/// `PID-TIME.pb.gz` of a `watch --profile-every` window: values
/// `samples`/`count` and `cpu`/`nanoseconds`, each stack with its labels.
pub fn labelled_cpu_pprof(
    stacks: &[LabelledStack],
    period_ns: u64,
    duration_ns: u64,
    start_unix_ns: i64,
) -> Vec<u8> {
    let samples: Vec<Sample> = stacks
        .iter()
        .map(|s| Sample {
            frames: s
                .frames
                .iter()
                .map(|name| Frame {
                    name: name.clone(),
                    ..Frame::default()
                })
                .collect(),
            values: vec![s.samples, s.cpu_ns],
            labels: s.labels.clone(),
        })
        .collect();
    cpu_encode(&samples, period_ns as i64, duration_ns, start_unix_ns)
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
    cpu_encode(&samples, period, duration_ns, start_unix_ns)
}

/// A CPU profile's bytes: values `samples`/`count` and `cpu`/`nanoseconds`
/// (every CPU profile here has both, in that order).
fn cpu_encode(samples: &[Sample], period: i64, duration_ns: u64, start_unix_ns: i64) -> Vec<u8> {
    let types = [
        ValueType::new("samples", "count"),
        ValueType::new("cpu", "nanoseconds"),
    ];
    pprof::encode(
        samples,
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

    #[test]
    fn a_window_keeps_its_labels_and_both_values() {
        use prost::Message;
        use std::io::Read;
        let stack = |stalled: &str, n: i64| LabelledStack {
            frames: vec!["main".into(), "handle".into()],
            labels: vec![
                ("pid".into(), "42".into()),
                ("stalled".into(), stalled.into()),
            ],
            samples: n,
            cpu_ns: n * 1_003_009,
        };
        let gz = labelled_cpu_pprof(
            &[stack("true", 3), stack("false", 2), stack("true", 4)],
            1_003_009,
            60_000_000_000,
            1_700_000_000_000_000_000,
        );
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(gz.as_slice())
            .read_to_end(&mut raw)
            .unwrap();
        let p = pprof::proto::Profile::decode(raw.as_slice()).unwrap();
        let s = |i: i64| p.string_table[i as usize].as_str();
        let mut got: Vec<(String, Vec<i64>)> = p
            .sample
            .iter()
            .map(|x| {
                let labels: Vec<String> = x
                    .label
                    .iter()
                    .map(|l| format!("{}={}", s(l.key), s(l.str)))
                    .collect();
                (labels.join(","), x.value.clone())
            })
            .collect();
        got.sort();
        assert_eq!(
            got,
            [
                ("pid=42,stalled=false".to_string(), vec![2, 2_006_018]),
                ("pid=42,stalled=true".to_string(), vec![7, 7_021_063]),
            ]
        );
        assert_eq!(p.period, 1_003_009);
        assert_eq!(p.duration_nanos, 60_000_000_000);
    }
}
