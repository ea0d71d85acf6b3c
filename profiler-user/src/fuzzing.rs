//! Entry points for the fuzz targets in `fuzz/` (`cargo xtask fuzz`), one
//! per parser of untrusted input. Not an API: each takes arbitrary bytes,
//! runs one parser (and what consumes its result), and checks the
//! invariants the rest of the agent relies on. Any input may be refused,
//! but none may panic, hang or allocate without bound.
//!
//! Kept small on purpose: the stages stay `pub(crate)`, and a fuzz target
//! is one call into this module.
use profiler_common::{decode, read, CommEvent, GoEvent, RecordKind, StackEvent};

use crate::{
    analyze::{dispatch, dispatch::Dispatcher, stacks::Stacks},
    session::{datafile, sinks::Sinks},
    symbolize::{perfmap::PerfMap, Symbolizer},
    unwind::cfi,
};

/// Most functions a fuzzed pipeline is built with.
const MAX_FUNCS: usize = 4096;
/// The thread the fuzzed pipeline's dispatcher watches.
pub const WATCHED_TID: u32 = 1000;

/// The ring-record decoder and every consumer of its records.
///
/// Input: a first byte, the number of probed functions (function 0 is the
/// dispatch function), then items `[tag u8][len u16 LE][len bytes]`: tag 1
/// a hang check (`u64` time), 2 threads found exited (`u32`s), 3 a thread
/// name (`u32` tid, then the name), anything else one ring record. Each
/// record is decoded with [`decode`] and [`read`] as the collector does,
/// then fed to the shadow stacks and the dispatcher, which are finished.
pub fn ring_record(data: &[u8]) {
    let Some((&nfuncs, mut rest)) = data.split_first() else {
        return;
    };
    let mut entries = Vec::new();
    while let [tag, a, b, tail @ ..] = rest {
        let len = usize::from(u16::from_le_bytes([*a, *b])).min(tail.len());
        let (payload, next) = tail.split_at(len);
        rest = next;
        let u32s = |p: &[u8]| {
            p.chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
                .collect::<Vec<_>>()
        };
        entries.push(match tag {
            1 => datafile::Entry::Tick(
                payload
                    .get(..8)
                    .map_or(0, |b| u64::from_le_bytes(b.try_into().expect("8 bytes"))),
            ),
            2 => datafile::Entry::Reap(payload.len() % 2 == 0, u32s(payload)),
            3 if payload.len() >= 4 => datafile::Entry::Name(
                u32s(&payload[..4])[0],
                String::from_utf8_lossy(&payload[4..]).into_owned(),
            ),
            _ => {
                check_record(payload);
                datafile::Entry::Record(payload.to_vec())
            }
        });
    }
    replay(usize::from(nfuncs), &entries, Vec::new());
}

/// What the decoder promises: a kind only with a whole header, and each
/// kind's record read only when long enough.
fn check_record(rec: &[u8]) {
    let Some((kind, ev)) = decode(rec) else {
        return;
    };
    assert!(rec.len() >= size_of::<profiler_common::Event>());
    assert_eq!(RecordKind::of(ev.kind()), Some(kind));
    let whole = match kind {
        RecordKind::Comm => read::<CommEvent>(rec).is_some(),
        RecordKind::GoEntry | RecordKind::GoExit => read::<GoEvent>(rec).is_some(),
        RecordKind::SchedOut | RecordKind::Sample => read::<StackEvent>(rec).is_some(),
        _ => true,
    };
    let need = match kind {
        RecordKind::Comm => size_of::<CommEvent>(),
        RecordKind::GoEntry | RecordKind::GoExit => size_of::<GoEvent>(),
        RecordKind::SchedOut | RecordKind::Sample => size_of::<StackEvent>(),
        _ => 0,
    };
    assert_eq!(whole, rec.len() >= need);
}

/// Feeds `entries` through the pipeline `report` builds (without its
/// output files) for `nfuncs` probed functions, with a symbolizer that
/// answers only from `symbols` (as `report`'s; nothing of this machine is
/// read), then finishes it.
fn replay(nfuncs: usize, entries: &[datafile::Entry], symbols: Vec<(u32, u64, Vec<String>)>) {
    let nfuncs = nfuncs.min(MAX_FUNCS);
    let names: Vec<String> = (0..nfuncs).map(|i| format!("f{i}")).collect();
    let cfg = dispatch::Config {
        tid: WATCHED_TID,
        thread_name: "main".into(),
        rule: "fuzz".into(),
        threshold_ns: 1_000_000,
        hang_ns: 100_000_000,
        frame_interval_ns: 16_666_667,
        full_tree: false,
        sample_period_ns: 1_000_000,
        wakers: true,
        wait_loop: false,
        preset: false,
    };
    let mut dispatcher = Dispatcher::new(cfg, 0, names, (0..nfuncs).map(|i| i == 0).collect(), 0);
    dispatcher.set_symbolizer(Symbolizer::offline(0, symbols));
    let mut sinks = Sinks::new(0, Stacks::new(nfuncs), Some(dispatcher), None);
    for e in entries {
        sinks.replay(e);
    }
    sinks.stacks.finish();
    let _ = sinks.stacks.unwound_frames() + sinks.stacks.unfinished_frames();
    if let Some(d) = &sinks.dispatch {
        let _ = d.sorted_groups();
    }
}

/// The perf map parser: the whole input, then what it left (an unfinished
/// last line, completed), then lookups.
pub fn perf_map(data: &[u8]) {
    let mut map = PerfMap::new();
    let used = map.add(data);
    assert!(used <= data.len());
    assert!(used == 0 || data[used - 1] == b'\n');
    let mut rest = data[used..].to_vec();
    rest.push(b'\n');
    map.add(&rest);
    let probes = data
        .chunks(8)
        .take(64)
        .map(|c| c.iter().fold(0u64, |a, &b| (a << 8) | u64::from(b)));
    for addr in probes.chain([0, 1, u64::MAX, 0x7f00_0000_0000]) {
        if let Some(name) = map.lookup(addr) {
            assert!(!name.chars().any(char::is_control), "{name:?}");
            assert!(name.len() <= crate::symbolize::perfmap::MAX_NAME);
        }
    }
}

/// The CFI table builder over a whole ELF image.
pub fn unwind_table(data: &[u8]) {
    let _ = cfi::build_id(data);
    if let Ok(table) = cfi::build(data) {
        check_rows(&table.rows);
    }
}

/// The CFI table builder over one CFI section: the first byte's low bit
/// says `.eh_frame` (0) or `.debug_frame` (1); the rest is its contents.
/// Seeded with real sections, this reaches the FDE and CFA-program
/// decoding that a whole mutated ELF seldom gets to.
pub fn cfi_section(data: &[u8]) {
    let Some((&which, section)) = data.split_first() else {
        return;
    };
    let table = if which & 1 == 0 {
        cfi::build_from_sections(Some((section, 0x1000)), None)
    } else {
        cfi::build_from_sections(None, Some(section))
    };
    check_rows(&table.rows);
}

/// The table's promise to the kernel's binary search: sorted, one row
/// per address.
fn check_rows(rows: &[profiler_common::UnwindRow]) {
    assert!(rows.windows(2).all(|w| w[0].pc < w[1].pc), "rows unsorted");
}

/// The `profile.data` reader (`datafile::parse`, what `profiler report`
/// calls on the file's bytes), and the replay of what it read. A damaged
/// or cut-short recording must say so in one line naming where.
pub fn profile_data(data: &[u8]) {
    match datafile::parse(data) {
        Ok(d) => {
            if let Some(damage) = &d.damage {
                let line = damage.message();
                assert!(!line.contains('\n'), "{line:?}");
            }
            assert!(d.version < 3 || d.has_trailer || d.damage.is_some());
            replay(d.header.funcs.len(), &d.entries, d.trailer.symbols);
        }
        Err(line) => assert!(!line.contains('\n'), "{line:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every entry point on empty, short and arbitrary inputs, and on real
    /// ones (this test binary's ELF and its `.eh_frame`): the fuzz
    /// targets' harnesses run and check their invariants in plain
    /// `cargo test` too.
    #[test]
    fn entry_points_run_on_real_and_garbage_inputs() {
        let elf = std::fs::read("/proc/self/exe").unwrap();
        let noise: Vec<u8> = (0..4096u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let mut eh = vec![0u8];
        {
            use object::{Object, ObjectSection};
            let file = object::File::parse(&*elf).unwrap();
            let s = file.section_by_name(".eh_frame").unwrap();
            eh.extend_from_slice(s.data().unwrap());
        }
        let perf = b"7f0000001000 40 jit_fn\n0x7f0000002000 0x10 other\x07name\nbad\n7f00 1 tail";
        let mut record = vec![3u8, 0, 24, 0];
        record.extend_from_slice(&[0u8; 24]);
        for input in [&[][..], &[0], &noise, &eh, perf, &record, &elf[..64]] {
            ring_record(input);
            perf_map(input);
            cfi_section(input);
            profile_data(input);
        }
        // A found crash: an out-of-range function index inside an open
        // dispatch reached the tree's names.
        let mut crash = vec![2u8];
        let (entry, exit) = (profiler_common::KIND_ENTRY, profiler_common::KIND_EXIT);
        for (ts, word, sp) in [
            (10u64, profiler_common::Event::pack(entry, 0), 0x7000u64),
            (20, profiler_common::Event::pack(entry, 16_187_391), 0x6000),
            (5_000_000, profiler_common::Event::pack(exit, 0), 0x7008),
        ] {
            let mut rec = ts.to_le_bytes().to_vec();
            rec.extend_from_slice(&WATCHED_TID.to_le_bytes());
            rec.extend_from_slice(&word.to_le_bytes());
            rec.extend_from_slice(&sp.to_le_bytes());
            crash.extend_from_slice(&[0, rec.len() as u8, 0]);
            crash.extend_from_slice(&rec);
        }
        ring_record(&crash);
        // Another: a node of ~2^61 ns overflowed the key node's 30% rule.
        ring_record(include_bytes!(
            "../../fuzz/regressions/ring_record-key-node-overflow"
        ));
        // And: a percentage of such a duration overflowed in the verdict.
        ring_record(include_bytes!(
            "../../fuzz/regressions/ring_record-pct-overflow"
        ));
        // And a function's summed durations.
        ring_record(include_bytes!(
            "../../fuzz/regressions/ring_record-sum-overflow"
        ));
        // And the on-CPU / blocked split.
        ring_record(include_bytes!(
            "../../fuzz/regressions/ring_record-split-overflow"
        ));
        unwind_table(&elf);
        unwind_table(&noise);
        cfi_section(&eh);
    }
}
