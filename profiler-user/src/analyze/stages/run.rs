//! What a scenario's runs hold: the occurrences [`super::tracker`] fills
//! in and [`super::derive`] reads. The tracker calls the derivation, which
//! takes these types from here rather than from the tracker.
use super::Interval;

/// A stage occurrence opened in the current run.
#[derive(Debug, Clone, Copy)]
pub(super) struct Open {
    pub(super) tid: u32,
    pub(super) start_ns: u64,
    pub(super) occ: u32,
    pub(super) seq: u32,
}

/// A completed stage occurrence within a run.
#[derive(Debug, Clone, Copy)]
pub(super) struct Occ {
    pub(super) stage: usize,
    pub(super) occ: u32,
    /// Open order within the run; the root is 0.
    pub(super) seq: u32,
    pub(super) iv: Interval,
}

/// A run in progress, and once complete, its record.
#[derive(Debug)]
pub(super) struct ActiveRun {
    pub(super) start_ns: u64,
    pub(super) tid: u32,
    pub(super) open: Vec<Option<Open>>,
    /// Occurrences opened per stage.
    pub(super) counts: Vec<u32>,
    /// Completed occurrences, the root's last.
    pub(super) occs: Vec<Occ>,
    /// (stage, occurrence) still open when the root ended.
    pub(super) abandoned: Vec<(usize, u32)>,
    pub(super) seq: u32,
}
