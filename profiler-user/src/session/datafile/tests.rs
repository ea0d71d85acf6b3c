//! The whole file: written by [`DataWriter`], read by [`parse`], whole,
//! cut, damaged, limited, and in the old format.
use std::fs::File;

use super::*;

fn header() -> Header {
    Header {
        pid: 7,
        exe: "/bin/x".into(),
        binaries: vec!["/bin/x".into()],
        funcs: vec![FuncInfo {
            name: "f".into(),
            binary: 0,
            offset: 16,
            dispatch: true,
            exit: "ret".into(),
            cost: crate::tracee::exits::ProbeCost {
                entry_ns: 900,
                exit_ns: 1000,
                inside_ns: 700,
            },
            tail_calls: vec![48],
        }],
        dispatch_rule: "r".into(),
        exit_rule: "x".into(),
        dispatch_fallback: false,
        wait_loop: false,
        watch_tid: 7,
        watch_name: "x".into(),
        session_start_ns: 5,
        start_unix_ns: 9,
        dispatch_hz: 997,
        no_wakers: false,
        exec_ns: None,
        launch: false,
        stages: vec![],
        scenarios: vec![],
        runs: None,
        ready: None,
        startup_threshold_ns: None,
        threshold_ns: 1,
        hang_ns: 2,
        frame_interval_ns: 3,
        full_tree: false,
        trace_events: 4,
        processes: vec![],
        follow: false,
        cost_spread_pct: Some(2.0 / 3.0),
    }
}

fn event(ts: u64, tid: u32, kind: u32, sp: u64) -> Vec<u8> {
    let mut r = ts.to_le_bytes().to_vec();
    r.extend_from_slice(&tid.to_le_bytes());
    r.extend_from_slice(&(kind << profiler_common::FUNC_BITS).to_le_bytes());
    r.extend_from_slice(&sp.to_le_bytes());
    r
}

/// `n` calls of function 0 on thread 7, with the journal's kinds mixed in.
fn entries(n: u64) -> Vec<Entry> {
    let mut v = vec![Entry::Name(7, "main".into())];
    for i in 0..n {
        v.push(Entry::Record(event(100 + i * 50, 7, 0, 0x7000)));
        v.push(Entry::Record(event(120 + i * 50, 7, 1, 0x7008)));
        if i % 1000 == 0 {
            v.push(Entry::Tick(130 + i * 50));
        }
    }
    v.push(Entry::Record(vec![9; 40]));
    v.push(Entry::Reap(true, vec![8, 9]));
    v.push(Entry::Lost(4, 5, 6));
    v
}

fn trailer() -> Trailer {
    Trailer {
        duration_ns: 99,
        stop_reason: "signal".into(),
        complete: true,
        // Floats whose shortest form has 17 digits must come back equal, or
        // a replay's reports differ from the recording's (serde_json's
        // `float_roundtrip`).
        governor: Some(crate::analyze::overhead::GovernorReport {
            max_overhead_pct: 10.0,
            cost: crate::attach::calibrate::HitCost {
                entry_ns: 6143.290000000001,
                entry_push_ns: 1419.9099999999999,
                entry_nop_ns: 1101.7,
                entry_endbr_ns: 0.1 + 0.7,
                entry_nopl_ns: 0.2 + 0.7,
                ret_site_ns: 5999.999999999999,
                uretprobe_ns: 0.1 + 0.2,
                inside_ns: [9100.5, 8900.0, 1200.0, 0.1 + 0.2, 900.0, 400.0],
                inside_spread_pct: 2.0 / 3.0,
            },
            peak_pct: 2.0 / 3.0,
            ..Default::default()
        }),
        cost_drift_pct: Some(-2.0 / 3.0),
        ..Trailer::default()
    }
}

fn write(entries: &[Entry], limit: u64, seal_every: Option<usize>) -> (Vec<u8>, Written) {
    let path = std::env::temp_dir().join(format!(
        "profiler-data-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let mut w = DataWriter::create(File::create(&path).unwrap(), &header(), limit).unwrap();
    for (i, e) in entries.iter().enumerate() {
        match e {
            Entry::Record(r) => w.record(r),
            Entry::Tick(t) => w.tick(*t),
            Entry::Reap(now, t) => w.reap(*now, t),
            Entry::Name(t, n) => w.name(*t, n),
            Entry::Lost(a, b, c) => w.lost(*a, *b, *c),
        }
        if seal_every.is_some_and(|n| i % n == n - 1) {
            w.seal();
        }
    }
    let done = w.finish(&trailer()).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    (bytes, done)
}

#[test]
fn round_trip_with_totals() {
    let e = entries(3000);
    let (bytes, done) = write(&e, 1 << 30, Some(2000));
    let d = parse(&bytes).unwrap();
    assert_eq!(d.version, super::VERSION);
    assert_eq!(d.header, header());
    assert_eq!(d.entries, e);
    assert!(d.has_trailer && d.damage.is_none() && d.trailing.is_none());
    let totals = d.trailer.totals.clone().unwrap();
    assert_eq!(totals, done.totals);
    assert_eq!((totals.records, totals.events), (6001, 6000));
    assert!(totals.blocks >= 5, "{totals:?}");
    assert_eq!(done.bytes, bytes.len() as u64);
    let old = legacy::write(&header(), &e, &trailer());
    // The format-2 figure counts the header and entries, not the trailer.
    let trailer_frame = 5 + serde_json::to_vec(&trailer()).unwrap().len();
    assert_eq!(totals.format2_bytes as usize, old.len() - trailer_frame);
    assert!(
        bytes.len() * 4 < old.len(),
        "{} vs {}",
        bytes.len(),
        old.len()
    );
    let mut t = trailer();
    t.totals = Some(totals);
    assert_eq!(d.trailer, t);
}

#[test]
fn old_formats_still_read() {
    let mut e = entries(10);
    let mut old = legacy::write(&header(), &e, &trailer());
    e.retain(|e| !matches!(e, Entry::Lost(..)));
    let d = parse(&old).unwrap();
    assert_eq!((d.version, &d.entries, d.damage), (2, &e, None));
    old[8] = 1;
    assert_eq!(parse(&old).unwrap().version, 1);
    old.truncate(old.len() - 3);
    assert!(parse(&old)
        .unwrap_err()
        .contains("corrupt or truncated at byte"));
}

#[test]
fn refusals_are_one_line() {
    let (mut bytes, _) = write(&entries(10), 1 << 30, None);
    let err = |b: &[u8]| parse(b).unwrap_err();
    assert!(err(b"hello world, not it").contains("not a profile.data"));
    bytes[8] = 99;
    assert!(err(&bytes).contains("newer profiler"));
    bytes[8] = 3;
    bytes[20] ^= 1;
    assert!(err(&bytes).contains("header block at byte 12 is damaged"));
    assert!(err(&bytes[..20]).contains("ends inside its header block"));
}

#[test]
fn cut_anywhere_reads_every_whole_block() {
    let e = entries(3000);
    let (bytes, _) = write(&e, 1 << 30, Some(1000));
    // Block boundaries, from a clean read.
    let mut ends = vec![];
    let mut at = 12;
    while at < bytes.len() {
        at += block::open(&bytes[at..]).unwrap().len;
        ends.push(at);
    }
    let (header_end, trailer_start) = (ends[0], ends[ends.len() - 2]);
    for cut in (header_end..bytes.len()).step_by(37) {
        let d = parse(&bytes[..cut]).unwrap();
        assert!(!d.has_trailer);
        let whole = ends.iter().rev().find(|e| **e <= cut).copied().unwrap();
        let want = if whole < cut {
            Damage::CutShort {
                at: whole as u64,
                unread: (cut - whole) as u64,
            }
        } else {
            Damage::CutShort {
                at: cut as u64,
                unread: 0,
            }
        };
        assert_eq!(d.damage, Some(want), "cut at {cut}");
        assert!(d.damage.unwrap().message().contains("cut short"));
        assert!(d.entries.len() <= e.len());
        assert_eq!(d.entries[..], e[..d.entries.len()], "a prefix");
        if cut >= trailer_start {
            assert_eq!(d.entries.len(), e.len());
            // The journaled loss counters stand in for the trailer's.
            assert_eq!(
                (
                    d.trailer.lost_events,
                    d.trailer.lost_sched,
                    d.trailer.lost_comm
                ),
                (4, 5, 6)
            );
        }
        assert_eq!(d.trailer.stop_reason, "recording cut short");
    }
}

#[test]
fn damage_is_named_never_read_through() {
    let e = entries(3000);
    let (bytes, _) = write(&e, 1 << 30, Some(1000));
    let header_end = 12 + block::open(&bytes[12..]).unwrap().len;
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..300 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let at = header_end + (seed as usize % (bytes.len() - header_end));
        let mut d = bytes.clone();
        d[at] ^= 1 << (seed >> 61);
        let got = parse(&d).unwrap();
        match &got.damage {
            Some(Damage::Corrupt { at: block_at, .. }) => {
                assert!(
                    *block_at as usize <= at,
                    "damage at {at} named at {block_at}"
                )
            }
            other => panic!("flip at {at}: {other:?}"),
        }
        assert_eq!(got.entries[..], e[..got.entries.len()], "a prefix");
    }
    // Bytes after the trailer are ignored, and said to be.
    let mut d = bytes.clone();
    d.extend_from_slice(b"junk");
    let got = parse(&d).unwrap();
    assert_eq!(
        (got.damage, got.trailing),
        (None, Some((bytes.len() as u64, 4)))
    );
}

#[test]
fn data_limit_keeps_a_prefix_and_says_so() {
    // Timestamps that do not compress away.
    let mut ts = 0u64;
    let e: Vec<Entry> = (0..30_000u64)
        .map(|i| {
            ts += (i * 2_654_435_761) % 1000;
            Entry::Record(event(ts, 7, (i % 2) as u32, 0x7000))
        })
        .collect();
    let (bytes, done) = write(&e, 16_384, Some(1000));
    assert!(bytes.len() < 17_000, "{}", bytes.len());
    assert!(done.cut > 0);
    let d = parse(&bytes).unwrap();
    assert!(d.has_trailer && !d.trailer.complete);
    assert_eq!(d.damage, Some(Damage::DataLimit { entries: done.cut }));
    assert!(!d.entries.is_empty());
    assert_eq!(d.entries.len() as u64 + done.cut, e.len() as u64);
    assert_eq!(d.entries[..], e[..d.entries.len()]);
}
