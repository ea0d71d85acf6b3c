//! Tests of the journal and the profiles together.
use std::fs;

use super::journal::{Journal, Limits, GROUPS};

#[test]
fn the_journal_deletes_the_oldest_profiles_first_and_counts_them() {
    let d = std::env::temp_dir().join(format!("profiler-profiles-cap-{}", std::process::id()));
    let _ = fs::remove_dir_all(&d);
    let limits = Limits {
        max_disk: 256 * 1024,
        per_hour: 20,
        worst: 3,
    };
    let mut j = Journal::open(&d, limits).unwrap();
    let t = 1_764_644_100_000_000_000;
    let gz = vec![0u8; 20 * 1024];
    let paths: Vec<String> = (0..30)
        .map(|i| j.profile(42, t + i * 1_000_000_000, &gz).unwrap())
        .collect();
    j.flush_groups(true).unwrap();
    let g: crate::output::watch::GroupsFile =
        serde_json::from_slice(&fs::read(d.join(GROUPS)).unwrap()).unwrap();
    let left: Vec<bool> = paths.iter().map(|p| d.join(p).exists()).collect();
    let kept = left.iter().filter(|&&x| x).count() as u64;
    // 20 KiB each under 256 KiB less the 64-KiB reserve: 9 stay.
    assert_eq!(kept, 9, "{left:?}");
    assert_eq!((g.profiles_written, g.profiles_deleted), (30, 30 - kept));
    // The newest stay.
    assert!(left[21..].iter().all(|&x| x) && !left[20]);
    fs::remove_dir_all(&d).unwrap();
}
