//! Compiles a binary's call-frame information (CFI) into a compact, sorted
//! table of [`UnwindRow`]s that a BPF program can binary-search to unwind
//! user stacks without frame pointers, as the Parca agent, the OpenTelemetry
//! eBPF profiler and lightswitch do.
//!
//! # Why
//!
//! Distributions build without frame pointers, but keep `.eh_frame` (the
//! tables C++ exceptions and Rust panics need). Interpreting DWARF CFI in
//! the kernel is out of the question (the verifier, the instruction
//! budget), so the agent evaluates it once per binary here and hands the
//! kernel the result: for every address range, how to find the canonical
//! frame address (CFA) and the caller's `rbp`. The return address is always
//! at `CFA - 8` on x86-64.
//!
//! # Input
//!
//! `.eh_frame` (parsed with gimli's `EhFrame`, with the section base
//! addresses taken from the ELF), and `.debug_frame` where present: its FDEs
//! fill the ranges `.eh_frame` leaves uncovered (`.eh_frame` wins where both
//! describe a function). A compressed `.debug_frame` (`SHF_COMPRESSED`) is
//! inflated when zlib-compressed; zstd is skipped (counted). FDEs that do
//! not start inside an executable segment (left behind by
//! `--gc-sections`, often at address 0) are dropped.
//!
//! `.gnu_debugdata` (xz-compressed "MiniDebugInfo") is detected but not
//! read: it carries a function symbol table, not CFI (its producers strip
//! `.debug_frame` from it), so there is nothing in it for this table.
//!
//! # Format
//!
//! A `Vec<UnwindRow>` sorted by `pc`, each row covering `[row.pc,
//! next_row.pc)`; `lookup` (in tests) finds the row of an address (the last row
//! whose `pc` is not above it). Consecutive rows with identical rules are
//! merged (the first is kept), also across adjacent FDEs. Rules map as:
//!
//! | CFI | row |
//! | --- | --- |
//! | CFA = `rsp + n` / `rbp + n` | [`cfa::RSP`] / [`cfa::RBP`], `cfa_offset = n` |
//! | CFA = the x86-64 PLT expression (`rsp + 8 + ((rip & 15) >= N) << 3`) | [`cfa::PLT`], `cfa_offset = N` |
//! | return address undefined (or without a rule) | [`cfa::END`] |
//! | `rbp` unchanged, undefined or without a rule | [`rbp::SAME`] |
//! | `rbp` saved at `CFA + n` | [`rbp::AT_CFA`], `rbp_offset = n` |
//! | anything else for `rbp` (or `n` out of `i16`) | [`rbp::UNSUPPORTED`] |
//! | anything else for the CFA or the return address | [`cfa::UNSUPPORTED`], `cfa_offset` = a [`reason`] |
//!
//! **Eight bytes a row.** The rows are computed full-width ([`Row`]: a
//! 64-bit address, each field its own) and then narrowed into the kernel's
//! [`UnwindRow`]: the address as 32 bits from the table's base (its first
//! row's address, [`Table::base`]; a table spans at most 4 GiB, and rows
//! past that are dropped, counted, leaving those addresses to frame
//! pointers), and the kinds with the saved `rbp`'s offset in 8-byte words
//! in one 16-bit field. An `rbp` offset that does not fit (not a multiple
//! of 8, or beyond ±8 KiB; compilers save registers in 8-byte slots near
//! the CFA) becomes [`rbp::UNSUPPORTED`], counted. Half the bytes of a
//! 16-byte row: the rows array holds twice the code in the same memory.
//!
//! **No-CFI marker.** Where an FDE ends and the next one does not start
//! right there (code without CFI, or wider padding), and after the last
//! FDE, the table holds a row of kind [`cfa::UNSUPPORTED`] with
//! `cfa_offset == 0` ([`reason::NO_CFI`]), so that an address in a gap never
//! takes the previous function's rule. A gap that ends at the first 16-byte
//! boundary after an FDE is the padding that aligns the next function
//! (never run: no pc or return address falls in it), and gets no marker;
//! that saves a tenth of the rows of most binaries, a fifth of node's. Unwinders treat it as "no CFI here"
//! (fall back to frame pointers), unlike the other `UNSUPPORTED` rows, whose
//! non-zero `cfa_offset` says why a described rule cannot be followed.
//!
//! **Signal frames.** FDEs of CIEs with the `S` augmentation (glibc's
//! `__restore_rt`, whose CFA is computed from the saved `ucontext`) become
//! `UNSUPPORTED` rows with [`reason::SIGNAL_FRAME`], and are counted.
//!
//! Unwinding a caller frame (not the sampled frame itself) looks up its
//! return address minus one, since a call may be the last instruction of a
//! function.
//!
//! Tables are cached by [`build_id`], or, for binaries without one, by
//! [`FileKey`] (device, inode, modification time).
use std::{collections::HashMap, ops::Range};

use gimli::{
    BaseAddresses, CfaRule, CieOrFde, CommonInformationEntry, DebugFrame, EhFrame, EndianSlice,
    LittleEndian, Operation, Reader, Register, RegisterRule, UnwindContext, UnwindOffset,
    UnwindSection, UnwindTableRow,
};
use object::{Object, ObjectSection, ObjectSegment};
use profiler_common::{cfa, rbp, UnwindRow};

/// One row as computed, before it is narrowed into an [`UnwindRow`]: how
/// to unwind a frame whose pc is at or after `pc` (an ELF virtual address)
/// and before the next row's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Row {
    /// First ELF virtual address the row covers.
    pub pc: u64,
    /// A [`cfa`] constant.
    pub cfa_kind: u8,
    /// A [`rbp`] constant.
    pub rbp_kind: u8,
    /// Offset of the CFA from its base register (or the PLT threshold, or
    /// a [`reason`]).
    pub cfa_offset: i16,
    /// Offset of the saved `rbp` from the CFA (for [`rbp::AT_CFA`]).
    pub rbp_offset: i16,
}

/// Why a [`cfa::UNSUPPORTED`] row cannot be followed: its `cfa_offset`.
pub mod reason {
    /// No CFI covers this address (a gap between FDEs, or past the last).
    pub const NO_CFI: i16 = 0;
    /// The CFA is a DWARF expression other than the PLT one.
    pub const CFA_EXPRESSION: i16 = 1;
    /// The CFA is based on a register other than `rsp` or `rbp`.
    pub const CFA_REGISTER: i16 = 2;
    /// The CFA offset does not fit an `i16`.
    pub const OFFSET_RANGE: i16 = 3;
    /// The return address is not saved at `CFA - 8`.
    pub const RA_RULE: i16 = 4;
    /// A signal trampoline (CIE augmentation `S`).
    pub const SIGNAL_FRAME: i16 = 5;
}

/// A compiled unwind table and how it was made.
#[derive(Clone, Debug, Default)]
pub struct Table {
    /// Rows sorted by `pc`, deduplicated; see the module documentation.
    pub rows: Vec<UnwindRow>,
    /// The ELF virtual address of `pc == 0`: the first row's.
    pub base: u64,
    /// The padding gaps left to the previous function's rule (tests
    /// compare against unwinders that know nothing there).
    #[cfg(test)]
    pub padding: Vec<Range<u64>>,
    /// Counts.
    pub stats: TableStats,
}

/// Counts about a compiled table. Row counts are of the final rows.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TableStats {
    /// `.eh_frame` is present (and was read).
    pub has_eh_frame: bool,
    /// `.eh_frame_hdr` is present (not needed to build the table).
    pub has_eh_frame_hdr: bool,
    /// `.debug_frame` is present.
    pub has_debug_frame: bool,
    /// `.gnu_debugdata` (MiniDebugInfo) is present; not read (no CFI in it).
    pub has_gnu_debugdata: bool,
    /// FDEs in the table, from `.eh_frame`.
    pub fdes_eh_frame: usize,
    /// FDEs in the table, from `.debug_frame` (ranges `.eh_frame` lacks).
    pub fdes_debug_frame: usize,
    /// FDEs dropped: empty, or not starting in an executable segment.
    pub fdes_outside_text: usize,
    /// FDEs dropped because an earlier one (or `.eh_frame`'s) covers them.
    pub fdes_overlapping: usize,
    /// FDEs of signal trampolines (CIE augmentation `S`).
    pub fdes_signal: usize,
    /// CIEs, FDEs or CFI programs gimli could not parse (skipped; an error
    /// in a section's entry list stops reading that section).
    pub parse_errors: usize,
    /// A compressed `.debug_frame` in a format not read (zstd).
    pub debug_frame_unreadable: bool,
    /// Rows gimli produced, before merging.
    pub cfi_rows: usize,
    /// Rows in the table.
    pub rows: usize,
    /// [`cfa::RSP`] rows.
    pub rows_rsp: usize,
    /// [`cfa::RBP`] rows.
    pub rows_rbp: usize,
    /// [`cfa::PLT`] rows.
    pub rows_plt: usize,
    /// [`cfa::END`] rows.
    pub rows_end: usize,
    /// No-CFI markers ([`cfa::UNSUPPORTED`], [`reason::NO_CFI`]).
    pub rows_no_cfi: usize,
    /// Unsupported rows: [`reason::CFA_EXPRESSION`].
    pub unsupported_cfa_expression: usize,
    /// Unsupported rows: [`reason::CFA_REGISTER`].
    pub unsupported_cfa_register: usize,
    /// Unsupported rows: [`reason::OFFSET_RANGE`].
    pub unsupported_offset_range: usize,
    /// Unsupported rows: [`reason::RA_RULE`].
    pub unsupported_ra_rule: usize,
    /// Unsupported rows: [`reason::SIGNAL_FRAME`].
    pub unsupported_signal_frame: usize,
    /// Rows whose `rbp` is saved relative to the CFA ([`rbp::AT_CFA`]).
    pub rows_rbp_at_cfa: usize,
    /// Rows whose `rbp` rule is [`rbp::UNSUPPORTED`].
    pub rows_rbp_unsupported: usize,
    /// Of those, rows whose `rbp` offset an [`UnwindRow`] cannot hold.
    pub rows_rbp_narrowed: usize,
    /// Gaps between FDEs that only pad to the next function's 16-byte
    /// alignment: no marker (see "No-CFI marker" in the module docs).
    pub padding_gaps: usize,
    /// Rows dropped because they lie 4 GiB or more past the first.
    pub rows_past_4gib: usize,
}

impl TableStats {
    /// FDEs in the table.
    pub fn fdes(&self) -> usize {
        self.fdes_eh_frame + self.fdes_debug_frame
    }

    /// Rows of kind [`cfa::UNSUPPORTED`] that describe a rule the unwinder
    /// cannot follow (the no-CFI markers excluded).
    pub fn unsupported(&self) -> usize {
        self.unsupported_cfa_expression
            + self.unsupported_cfa_register
            + self.unsupported_offset_range
            + self.unsupported_ra_rule
            + self.unsupported_signal_frame
    }

    fn count(&mut self, rows: &[Row]) {
        self.rows = rows.len();
        for r in rows {
            match (r.cfa_kind, r.cfa_offset) {
                (cfa::RSP, _) => self.rows_rsp += 1,
                (cfa::RBP, _) => self.rows_rbp += 1,
                (cfa::PLT, _) => self.rows_plt += 1,
                (cfa::END, _) => self.rows_end += 1,
                (_, reason::NO_CFI) => self.rows_no_cfi += 1,
                (_, reason::CFA_EXPRESSION) => self.unsupported_cfa_expression += 1,
                (_, reason::CFA_REGISTER) => self.unsupported_cfa_register += 1,
                (_, reason::OFFSET_RANGE) => self.unsupported_offset_range += 1,
                (_, reason::RA_RULE) => self.unsupported_ra_rule += 1,
                (_, _) => self.unsupported_signal_frame += 1,
            }
            match r.rbp_kind {
                rbp::AT_CFA => self.rows_rbp_at_cfa += 1,
                rbp::UNSUPPORTED => self.rows_rbp_unsupported += 1,
                _ => {}
            }
        }
    }
}

/// Compiles the unwind table of an x86-64 ELF image (the file's bytes).
/// Errors only when the bytes are not a 64-bit little-endian x86-64 ELF; a
/// binary without CFI gives an empty table. `elf` is the bytes, or an
/// [`object::ReadCache`] over the file: then only the headers and the CFI
/// sections are read, not the whole file (`unwind/tables.rs`).
pub fn build<'a, R: object::ReadRef<'a>>(elf: R) -> Result<Table, String> {
    let file = object::File::parse(elf).map_err(|e| format!("not an ELF file: {e}"))?;
    if file.format() != object::BinaryFormat::Elf
        || file.architecture() != object::Architecture::X86_64
        || !file.is_little_endian()
        || !file.is_64()
    {
        return Err(format!(
            "not an x86-64 ELF file ({:?}, {:?})",
            file.format(),
            file.architecture()
        ));
    }
    let address = |name: &str| file.section_by_name(name).map(|s| s.address());
    let eh_frame = file
        .section_by_name(".eh_frame")
        .and_then(|s| Some((s.data().ok()?, s.address())))
        .filter(|(data, _)| !data.is_empty());
    let mut stats = TableStats {
        has_eh_frame_hdr: file.section_by_name(".eh_frame_hdr").is_some(),
        has_gnu_debugdata: file.section_by_name(".gnu_debugdata").is_some(),
        ..TableStats::default()
    };
    let debug_frame = match file.section_by_name(".debug_frame") {
        Some(s) => match section_bytes(&s) {
            Some(d) => (!d.is_empty()).then_some(d),
            None => {
                stats.debug_frame_unreadable = true;
                None
            }
        },
        None => None,
    };
    let cfi = Cfi {
        eh_frame,
        debug_frame: debug_frame.as_deref(),
        text: address(".text").unwrap_or(0),
        got: address(".got").unwrap_or(0),
        exec: exec_segments(&file),
    };
    Ok(compile(&cfi, stats))
}

/// Compiles the table of bare CFI sections: `.eh_frame` with its address,
/// `.debug_frame`, with no section addresses and every FDE kept (for the
/// fuzz target that mutates real sections, `crate::fuzzing`).
pub fn build_from_sections(eh_frame: Option<(&[u8], u64)>, debug_frame: Option<&[u8]>) -> Table {
    let cfi = Cfi {
        eh_frame,
        debug_frame,
        text: 0,
        got: 0,
        exec: Vec::new(),
    };
    compile(&cfi, TableStats::default())
}

/// The address ranges of the executable `PT_LOAD` segments.
fn exec_segments<'a, R: object::ReadRef<'a>>(file: &object::File<'a, R>) -> Vec<Range<u64>> {
    file.segments()
        .filter(|s| match s.flags() {
            object::SegmentFlags::Elf { p_flags } => p_flags & object::elf::PF_X != 0,
            _ => false,
        })
        // A segment's end as the file says: saturated, since a corrupt
        // file may put it past the address space.
        .map(|s| s.address()..s.address().saturating_add(s.size()))
        .collect()
}

/// Largest compressed CFI section inflated (glibc's `.debug_frame` is
/// under 1 MiB): a few bytes of zlib can claim, and inflate to, gigabytes.
const MAX_INFLATED: u64 = 256 << 20;

/// A section's bytes, inflated if it is zlib-compressed; `None` if it is
/// compressed otherwise, or inflates to other than the size its header
/// says (at most [`MAX_INFLATED`]).
fn section_bytes<'a, R: object::ReadRef<'a>>(
    s: &object::Section<'a, '_, R>,
) -> Option<std::borrow::Cow<'a, [u8]>> {
    let c = s.compressed_data().ok()?;
    match c.format {
        object::CompressionFormat::None => Some(c.data.into()),
        object::CompressionFormat::Zlib => inflate(c.data, c.uncompressed_size).map(Into::into),
        _ => None,
    }
}

/// Inflates a zlib stream that should hold `size` bytes: `None` if it
/// holds another number, is corrupt, or `size` is over [`MAX_INFLATED`].
fn inflate(data: &[u8], size: u64) -> Option<Vec<u8>> {
    use std::io::Read;
    if size > MAX_INFLATED {
        return None;
    }
    let mut out = Vec::new();
    flate2::read::ZlibDecoder::new(data)
        .take(size + 1)
        .read_to_end(&mut out)
        .ok()?;
    (out.len() as u64 == size).then_some(out)
}

/// The GNU build-id of an ELF image (bytes, or a [`object::ReadCache`]
/// over the file: then only its headers and notes are read), if it has one.
pub fn build_id<'a, R: object::ReadRef<'a>>(elf: R) -> Option<Vec<u8>> {
    let file = object::File::parse(elf).ok()?;
    file.build_id().ok().flatten().map(<[u8]>::to_vec)
}

pub use crate::tracee::process::FileKey;

/// How a compiled table is cached: by build-id when the binary has one,
/// else by file identity.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum CacheKey {
    /// The GNU build-id.
    BuildId(Vec<u8>),
    /// Device, inode and modification time.
    File(FileKey),
}

impl CacheKey {
    /// The cache key of `elf`, read from a file with metadata `meta`.
    pub fn new<'a, R: object::ReadRef<'a>>(elf: R, meta: &std::fs::Metadata) -> Self {
        match build_id(elf) {
            Some(id) if !id.is_empty() => CacheKey::BuildId(id),
            _ => CacheKey::File(FileKey::new(meta)),
        }
    }
}

/// The row of the table that covers `pc`: the last one whose `pc` is not
/// above it. `None` below the first row.
#[cfg(test)]
pub fn lookup(rows: &[Row], pc: u64) -> Option<&Row> {
    let i = rows.partition_point(|r| r.pc <= pc);
    i.checked_sub(1).map(|i| &rows[i])
}

/// The CFI sections of a binary and the addresses their pointers need.
struct Cfi<'a> {
    /// `.eh_frame` and its address.
    eh_frame: Option<(&'a [u8], u64)>,
    /// `.debug_frame` (addresses in it are absolute).
    debug_frame: Option<&'a [u8]>,
    /// `.text`'s address (`DW_EH_PE_textrel`).
    text: u64,
    /// `.got`'s address (`DW_EH_PE_datarel`).
    got: u64,
    /// Executable segments; FDEs starting elsewhere are dropped. Empty:
    /// keep every non-empty FDE.
    exec: Vec<Range<u64>>,
}

/// One FDE's rows, in [`Collector::rows`].
struct Fde {
    start: u64,
    end: u64,
    from_debug_frame: bool,
    rows: Range<usize>,
}

#[derive(Default)]
struct Collector {
    fdes: Vec<Fde>,
    rows: Vec<Row>,
}

fn compile(cfi: &Cfi, mut stats: TableStats) -> Table {
    let mut c = Collector::default();
    if let Some((data, address)) = cfi.eh_frame {
        stats.has_eh_frame = true;
        let mut section = EhFrame::new(data, LittleEndian);
        section.set_address_size(8);
        let bases = BaseAddresses::default()
            .set_eh_frame(address)
            .set_text(cfi.text)
            .set_got(cfi.got);
        c.read(&section, &bases, false, cfi, &mut stats);
    }
    let eh_fdes = c.fdes.len();
    if let Some(data) = cfi.debug_frame {
        stats.has_debug_frame = true;
        let mut section = DebugFrame::new(data, LittleEndian);
        section.set_address_size(8);
        c.read(&section, &BaseAddresses::default(), true, cfi, &mut stats);
    }
    let Collector { mut fdes, rows } = c;

    // `.eh_frame` first; `.debug_frame` only where `.eh_frame` has nothing.
    fdes[..eh_fdes].sort_unstable_by_key(|f| (f.start, f.end));
    if fdes.len() > eh_fdes {
        // What `.eh_frame` covers, as sorted disjoint ranges.
        let mut covered: Vec<Range<u64>> = Vec::new();
        for f in &fdes[..eh_fdes] {
            match covered.last_mut() {
                Some(last) if f.start <= last.end => last.end = last.end.max(f.end),
                _ => covered.push(f.start..f.end),
            }
        }
        let overlaps_eh = |f: &Fde| {
            let i = covered.partition_point(|c| c.start < f.end);
            i > 0 && covered[i - 1].end > f.start
        };
        let debug = fdes.split_off(eh_fdes);
        let read = debug.len();
        fdes.extend(debug.into_iter().filter(|f| !overlaps_eh(f)));
        stats.fdes_overlapping += read - (fdes.len() - eh_fdes);
        fdes.sort_unstable_by_key(|f| (f.start, f.end));
    }

    let mut out: Vec<Row> = Vec::with_capacity(rows.len() + fdes.len());
    #[cfg(test)]
    let mut padding = Vec::new();
    let mut covered_to: Option<u64> = None;
    for f in &fdes {
        if let Some(end) = covered_to {
            if f.start < end {
                stats.fdes_overlapping += 1;
                continue;
            }
            // Up to the next 16-byte boundary: the padding that aligns
            // the next function, never run, so the previous rule may
            // cover it. Any other gap may hold code without CFI.
            if f.start > end && f.start == end.next_multiple_of(16) {
                stats.padding_gaps += 1;
                #[cfg(test)]
                padding.push(end..f.start);
            } else if f.start > end {
                push(&mut out, 0, no_cfi(end));
            }
        }
        for r in &rows[f.rows.clone()] {
            push(&mut out, 0, *r);
        }
        covered_to = Some(f.end);
        if f.from_debug_frame {
            stats.fdes_debug_frame += 1;
        } else {
            stats.fdes_eh_frame += 1;
        }
    }
    if let Some(end) = covered_to {
        push(&mut out, 0, no_cfi(end));
    }
    let table = narrow(out, stats);
    #[cfg(test)]
    let table = Table { padding, ..table };
    table
}

/// The table of `rows` (sorted, merged) in [`UnwindRow`]s; see "Eight
/// bytes a row" in the module documentation.
fn narrow(mut rows: Vec<Row>, mut stats: TableStats) -> Table {
    let base = rows.first().map_or(0, |r| r.pc);
    let within = rows.partition_point(|r| r.pc - base <= u64::from(u32::MAX));
    stats.rows_past_4gib = rows.len() - within;
    rows.truncate(within);
    let mut out = Vec::with_capacity(rows.len());
    for r in &mut rows {
        let pc = (r.pc - base) as u32;
        let narrowed = UnwindRow::new(pc, r.cfa_kind, r.cfa_offset, r.rbp_kind, r.rbp_offset)
            .unwrap_or_else(|| {
                stats.rows_rbp_narrowed += 1;
                (r.rbp_kind, r.rbp_offset) = (rbp::UNSUPPORTED, 0);
                UnwindRow::new(pc, r.cfa_kind, r.cfa_offset, rbp::UNSUPPORTED, 0)
                    .expect("a zero offset fits")
            });
        out.push(narrowed);
    }
    stats.count(&rows);
    Table {
        rows: out,
        base,
        stats,
        #[cfg(test)]
        padding: Vec::new(),
    }
}

#[cfg(test)]
impl Table {
    /// The rows as computed (what the narrow rows hold, widened back).
    pub fn full_rows(&self) -> Vec<Row> {
        self.rows
            .iter()
            .map(|r| Row {
                pc: self.base + u64::from(r.pc),
                cfa_kind: r.cfa_kind(),
                rbp_kind: r.rbp_kind(),
                cfa_offset: r.cfa_offset,
                rbp_offset: r.rbp_offset(),
            })
            .collect()
    }
}

fn no_cfi(pc: u64) -> Row {
    row(pc, cfa::UNSUPPORTED, reason::NO_CFI, rbp::SAME, 0)
}

fn row(pc: u64, cfa_kind: u8, cfa_offset: i16, rbp_kind: u8, rbp_offset: i16) -> Row {
    Row {
        pc,
        cfa_kind,
        rbp_kind,
        cfa_offset,
        rbp_offset,
    }
}

fn same_rule(a: &Row, b: &Row) -> bool {
    (a.cfa_kind, a.cfa_offset, a.rbp_kind, a.rbp_offset)
        == (b.cfa_kind, b.cfa_offset, b.rbp_kind, b.rbp_offset)
}

/// Appends `r` to `rows`, whose entries from `first` on are sorted: a row
/// at the same address as the last one replaces it (it covered nothing),
/// and a row with the same rule as the one before is dropped.
fn push(rows: &mut Vec<Row>, first: usize, r: Row) {
    if rows.len() > first && rows[rows.len() - 1].pc == r.pc {
        rows.pop();
    }
    if rows.len() > first && same_rule(&rows[rows.len() - 1], &r) {
        return;
    }
    rows.push(r);
}

impl Collector {
    /// Reads every FDE of `section` into `self`.
    fn read<'a, S>(
        &mut self,
        section: &S,
        bases: &BaseAddresses,
        from_debug_frame: bool,
        cfi: &Cfi,
        stats: &mut TableStats,
    ) where
        S: UnwindSection<EndianSlice<'a, LittleEndian>>,
    {
        type R<'a> = EndianSlice<'a, LittleEndian>;
        let mut ctx: UnwindContext<usize> = UnwindContext::new();
        let mut cies: HashMap<usize, CommonInformationEntry<R<'a>>> = HashMap::new();
        let mut entries = section.entries(bases);
        loop {
            let partial = match entries.next() {
                Ok(None) => break,
                Ok(Some(CieOrFde::Cie(_))) => continue,
                Ok(Some(CieOrFde::Fde(partial))) => partial,
                Err(_) => {
                    stats.parse_errors += 1;
                    break;
                }
            };
            let fde = partial.parse(|section, bases, offset| {
                let key = UnwindOffset::into(offset);
                if let Some(cie) = cies.get(&key) {
                    return Ok(cie.clone());
                }
                let cie = section.cie_from_offset(bases, offset)?;
                cies.insert(key, cie.clone());
                Ok(cie)
            });
            let Ok(fde) = fde else {
                stats.parse_errors += 1;
                continue;
            };
            let (start, end) = (fde.initial_address(), fde.end_address());
            let in_text =
                cfi.exec.is_empty() || cfi.exec.iter().any(|r| r.contains(&start) && end <= r.end);
            if start >= end || !in_text {
                stats.fdes_outside_text += 1;
                continue;
            }
            let signal = fde.is_signal_trampoline();
            if signal {
                stats.fdes_signal += 1;
            }
            let encoding = fde.cie().encoding();
            let first = self.rows.len();
            let Ok(mut table) = fde.rows(section, bases, &mut ctx) else {
                stats.parse_errors += 1;
                continue;
            };
            let mut ok = true;
            loop {
                match table.next_row() {
                    Ok(Some(r)) => {
                        if r.start_address() >= r.end_address() || r.start_address() >= end {
                            continue;
                        }
                        stats.cfi_rows += 1;
                        let converted = if signal {
                            row(
                                r.start_address(),
                                cfa::UNSUPPORTED,
                                reason::SIGNAL_FRAME,
                                rbp::SAME,
                                0,
                            )
                        } else {
                            convert(section, r, encoding)
                        };
                        push(&mut self.rows, first, converted);
                    }
                    Ok(None) => break,
                    Err(_) => {
                        ok = false;
                        break;
                    }
                }
            }
            if !ok || self.rows.len() == first {
                stats.parse_errors += usize::from(!ok);
                self.rows.truncate(first);
                continue;
            }
            self.fdes.push(Fde {
                start,
                end,
                from_debug_frame,
                rows: first..self.rows.len(),
            });
        }
    }
}

const RBP: Register = Register(6);
const RSP: Register = Register(7);
const RA: Register = Register(16);

/// One CFI row as a [`Row`].
fn convert<'a, S>(section: &S, r: &UnwindTableRow<usize>, encoding: gimli::Encoding) -> Row
where
    S: UnwindSection<EndianSlice<'a, LittleEndian>>,
{
    let pc = r.start_address();
    let unsupported = |why| row(pc, cfa::UNSUPPORTED, why, rbp::SAME, 0);
    match r.register(RA) {
        None | Some(RegisterRule::Undefined) => return row(pc, cfa::END, 0, rbp::SAME, 0),
        Some(RegisterRule::Offset(-8)) => {}
        Some(_) => return unsupported(reason::RA_RULE),
    }
    let (cfa_kind, cfa_offset) = match r.cfa() {
        CfaRule::RegisterAndOffset { register, offset } => {
            let kind = match *register {
                RSP => cfa::RSP,
                RBP => cfa::RBP,
                _ => return unsupported(reason::CFA_REGISTER),
            };
            match i16::try_from(*offset) {
                Ok(o) => (kind, o),
                Err(_) => return unsupported(reason::OFFSET_RANGE),
            }
        }
        CfaRule::Expression(e) => {
            match e.get(section).ok().and_then(|e| plt_threshold(e, encoding)) {
                Some(n) => (cfa::PLT, n),
                None => return unsupported(reason::CFA_EXPRESSION),
            }
        }
    };
    let (rbp_kind, rbp_offset) = match r.register(RBP) {
        None | Some(RegisterRule::Undefined) | Some(RegisterRule::SameValue) => (rbp::SAME, 0),
        Some(RegisterRule::Offset(n)) => match i16::try_from(n) {
            Ok(n) => (rbp::AT_CFA, n),
            Err(_) => (rbp::UNSUPPORTED, 0),
        },
        Some(_) => (rbp::UNSUPPORTED, 0),
    };
    row(pc, cfa_kind, cfa_offset, rbp_kind, rbp_offset)
}

/// `N` if `expr` is the CFA expression GNU ld emits for lazy-binding PLT
/// entries: `DW_OP_breg7 (rsp) 8; DW_OP_breg16 (rip) 0; DW_OP_lit15;
/// DW_OP_and; DW_OP_lit<N>; DW_OP_ge; DW_OP_lit3; DW_OP_shl; DW_OP_plus`,
/// i.e. `rsp + 8 + (((rip & 15) >= N) << 3)`.
fn plt_threshold<R: Reader>(expr: gimli::Expression<R>, encoding: gimli::Encoding) -> Option<i16> {
    let mut ops = expr.operations(encoding);
    let mut next = || ops.next().ok().flatten();
    let constant = |op: Option<Operation<R>>| match op {
        Some(Operation::UnsignedConstant { value }) => Some(value),
        _ => None,
    };
    let breg = |op: Option<Operation<R>>| match op {
        Some(Operation::RegisterOffset {
            register,
            offset,
            base_type,
        }) if gimli::ReaderOffset::into_u64(base_type.0) == 0 => Some((register, offset)),
        _ => None,
    };
    if breg(next())? != (RSP, 8) || breg(next())? != (RA, 0) || constant(next())? != 15 {
        return None;
    }
    if !matches!(next()?, Operation::And) {
        return None;
    }
    let n = constant(next())?;
    if n > 15 || !matches!(next()?, Operation::Ge) || constant(next())? != 3 {
        return None;
    }
    if !matches!(next()?, Operation::Shl) || !matches!(next()?, Operation::Plus) {
        return None;
    }
    if next().is_some() {
        return None;
    }
    Some(n as i16)
}

#[cfg(test)]
mod tests {
    use super::*;
    use framehop::{
        x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64},
        ExplicitModuleSectionInfo, FrameAddress, Module, Unwinder,
    };
    use gimli::write::{
        self, Address, CallFrameInstruction as I, CommonInformationEntry as Cie, EndianVec,
        FrameDescriptionEntry as FdeW, FrameTable,
    };

    const LIBC: &str = "/lib/x86_64-linux-gnu/libc.so.6";

    fn r(pc: u64, cfa_kind: u8, cfa_offset: i16, rbp_kind: u8, rbp_offset: i16) -> Row {
        row(pc, cfa_kind, cfa_offset, rbp_kind, rbp_offset)
    }

    #[test]
    fn lookup_takes_the_last_row_at_or_below() {
        let rows = [
            r(0x10, cfa::RSP, 8, rbp::SAME, 0),
            r(0x20, cfa::RSP, 16, rbp::SAME, 0),
            no_cfi(0x30),
        ];
        assert_eq!(lookup(&rows, 0x0f), None);
        assert_eq!(lookup(&rows, 0x10), Some(&rows[0]));
        assert_eq!(lookup(&rows, 0x1f), Some(&rows[0]));
        assert_eq!(lookup(&rows, 0x20), Some(&rows[1]));
        assert_eq!(lookup(&rows, 0x1000), Some(&rows[2]));
        assert_eq!(lookup(&[], 5), None);
    }

    fn cie(version: u8, signal: bool) -> Cie {
        let encoding = gimli::Encoding {
            format: gimli::Format::Dwarf32,
            version: version.into(),
            address_size: 8,
        };
        let mut cie = Cie::new(encoding, 1, -8, RA);
        cie.signal_trampoline = signal;
        cie.add_instruction(I::Cfa(RSP, 8));
        cie.add_instruction(I::Offset(RA, -8));
        cie
    }

    fn fde(start: u64, len: u32, instructions: Vec<(u32, I)>) -> FdeW {
        let mut f = FdeW::new(Address::Constant(start), len);
        for (offset, i) in instructions {
            f.add_instruction(offset, i);
        }
        f
    }

    /// `DW_OP_breg7 8; DW_OP_breg16 0; DW_OP_lit15; DW_OP_and; DW_OP_lit11;
    /// DW_OP_ge; DW_OP_lit3; DW_OP_shl; DW_OP_plus`, as GNU ld emits it.
    const PLT_EXPR: [u8; 11] = [0x77, 8, 0x80, 0, 0x3f, 0x1a, 0x3b, 0x2a, 0x33, 0x24, 0x22];

    /// Every rule kind, merging, gaps, a signal frame, an FDE outside the
    /// text, and `.debug_frame` filling a range `.eh_frame` lacks.
    #[test]
    fn synthetic_cfi_compiles_to_the_expected_rows() {
        let mut eh = FrameTable::default();
        let c = eh.add_cie(cie(1, false));
        let signal = eh.add_cie(cie(1, true));
        // push rbp; mov rsp, rbp; …; pop rbp; ret, with a no-op rule change.
        eh.add_fde(
            c,
            fde(
                0x1000,
                0x20,
                vec![
                    (1, I::CfaOffset(16)),
                    (1, I::Offset(RBP, -16)),
                    (4, I::CfaRegister(RBP)),
                    (8, I::SameValue(Register(3))),
                    (0x1e, I::Cfa(RSP, 8)),
                    (0x1e, I::Restore(RBP)),
                ],
            ),
        );
        // Adjacent, starting with the same rule as the end of the previous.
        eh.add_fde(c, fde(0x1020, 0x10, vec![(2, I::CfaOffset(32))]));
        // After a gap: a PLT.
        eh.add_fde(
            c,
            fde(
                0x1040,
                0x20,
                vec![
                    (0, I::CfaOffset(16)),
                    (
                        6,
                        I::CfaExpression(write::Expression::raw(PLT_EXPR.to_vec())),
                    ),
                ],
            ),
        );
        // The outermost frame.
        eh.add_fde(c, fde(0x1100, 0x10, vec![(0, I::Undefined(RA))]));
        // Rules that cannot be followed.
        let mut other_expr = PLT_EXPR.to_vec();
        other_expr[1] = 16;
        eh.add_fde(
            c,
            fde(
                0x1200,
                0x20,
                vec![
                    (4, I::CfaOffset(40000)),
                    (8, I::Cfa(Register(10), 0)),
                    (12, I::CfaExpression(write::Expression::raw(other_expr))),
                    (16, I::Cfa(RSP, 16)),
                    (16, I::Offset(RA, -16)),
                    (20, I::Offset(RA, -8)),
                    (20, I::Offset(RBP, 70000)),
                    (24, I::ValOffset(RBP, 8)),
                ],
            ),
        );
        eh.add_fde(signal, fde(0x1300, 0x10, vec![]));
        // Outside the executable segment: dropped.
        eh.add_fde(c, fde(0, 0x10, vec![]));
        let mut eh_frame = write::EhFrame(EndianVec::new(LittleEndian));
        eh.write_eh_frame(&mut eh_frame).unwrap();

        let mut debug = FrameTable::default();
        let c = debug.add_cie(cie(4, false));
        // Covered by `.eh_frame`: dropped.
        debug.add_fde(c, fde(0x1000, 0x20, vec![(1, I::CfaOffset(64))]));
        // Not covered: kept.
        debug.add_fde(c, fde(0x1400, 0x10, vec![(1, I::CfaOffset(24))]));
        let mut debug_frame = write::DebugFrame(EndianVec::new(LittleEndian));
        debug.write_debug_frame(&mut debug_frame).unwrap();

        let eh_frame = eh_frame.0.into_vec();
        let debug_frame = debug_frame.0.into_vec();
        let table = compile(
            &Cfi {
                eh_frame: Some((&eh_frame, 0x8000)),
                debug_frame: Some(&debug_frame),
                text: 0x1000,
                got: 0x9000,
                exec: vec![Range {
                    start: 0x1000,
                    end: 0x2000,
                }],
            },
            TableStats::default(),
        );
        let u = cfa::UNSUPPORTED;
        let expected = [
            r(0x1000, cfa::RSP, 8, rbp::SAME, 0),
            r(0x1001, cfa::RSP, 16, rbp::AT_CFA, -16),
            r(0x1004, cfa::RBP, 16, rbp::AT_CFA, -16),
            r(0x101e, cfa::RSP, 8, rbp::SAME, 0),
            r(0x1022, cfa::RSP, 32, rbp::SAME, 0),
            no_cfi(0x1030),
            r(0x1040, cfa::RSP, 16, rbp::SAME, 0),
            r(0x1046, cfa::PLT, 11, rbp::SAME, 0),
            no_cfi(0x1060),
            r(0x1100, cfa::END, 0, rbp::SAME, 0),
            no_cfi(0x1110),
            r(0x1200, cfa::RSP, 8, rbp::SAME, 0),
            r(0x1204, u, reason::OFFSET_RANGE, rbp::SAME, 0),
            r(0x1208, u, reason::CFA_REGISTER, rbp::SAME, 0),
            r(0x120c, u, reason::CFA_EXPRESSION, rbp::SAME, 0),
            r(0x1210, u, reason::RA_RULE, rbp::SAME, 0),
            r(0x1214, cfa::RSP, 16, rbp::UNSUPPORTED, 0),
            no_cfi(0x1220),
            r(0x1300, u, reason::SIGNAL_FRAME, rbp::SAME, 0),
            no_cfi(0x1310),
            r(0x1400, cfa::RSP, 8, rbp::SAME, 0),
            r(0x1401, cfa::RSP, 24, rbp::SAME, 0),
            no_cfi(0x1410),
        ];
        assert_eq!(table.full_rows(), expected);
        assert_eq!(table.base, 0x1000);
        let s = &table.stats;
        assert_eq!((s.fdes_eh_frame, s.fdes_debug_frame), (6, 1));
        assert_eq!((s.fdes_outside_text, s.fdes_overlapping), (1, 1));
        assert_eq!((s.fdes_signal, s.parse_errors), (1, 0));
        assert_eq!(s.rows, expected.len());
        assert_eq!(
            (s.rows_rsp, s.rows_rbp, s.rows_plt, s.rows_end),
            (9, 1, 1, 1)
        );
        assert_eq!(s.rows_no_cfi, 6);
        assert_eq!(s.unsupported(), 5);
        assert_eq!((s.rows_rbp_at_cfa, s.rows_rbp_unsupported), (2, 1));
        assert!(s.has_eh_frame && s.has_debug_frame);
        for (pc, want) in [
            (0x1003, 1),
            (0x1020, 3),
            (0x1035, 5),
            (0x1059, 7),
            (0x5000, 22),
        ] {
            assert_eq!(
                lookup(&table.full_rows(), pc),
                Some(&expected[want]),
                "{pc:#x}"
            );
        }
    }

    /// A gap up to the next 16-byte boundary is padding (no marker);
    /// longer gaps, or gaps after an aligned end, keep theirs. An `rbp`
    /// offset an 8-byte row cannot hold (past 8 KiB; CFI factors offsets
    /// by 8 on x86-64, so they are multiples of 8) leaves `rbp` unknown,
    /// counted.
    #[test]
    fn padding_gets_no_marker_and_narrow_rows_say_what_they_dropped() {
        let mut eh = FrameTable::default();
        let c = eh.add_cie(cie(1, false));
        eh.add_fde(c, fde(0x1000, 0x13, vec![(1, I::CfaOffset(16))]));
        eh.add_fde(c, fde(0x1020, 0x10, vec![(1, I::Offset(RBP, -8200))]));
        eh.add_fde(c, fde(0x1040, 0x05, vec![(1, I::Offset(RBP, -16))]));
        eh.add_fde(c, fde(0x1060, 0x10, vec![]));
        let mut eh_frame = write::EhFrame(EndianVec::new(LittleEndian));
        eh.write_eh_frame(&mut eh_frame).unwrap();
        let eh_frame = eh_frame.0.into_vec();
        let table = build_from_sections(Some((&eh_frame, 0x8000)), None);
        let expected = vec![
            r(0x1000, cfa::RSP, 8, rbp::SAME, 0),
            r(0x1001, cfa::RSP, 16, rbp::SAME, 0),
            // 0x1013..0x1020 pads 0x1020: the row above covers it.
            r(0x1020, cfa::RSP, 8, rbp::SAME, 0),
            r(0x1021, cfa::RSP, 8, rbp::UNSUPPORTED, 0),
            // Ends aligned: 0x1030..0x1040 is not padding.
            no_cfi(0x1030),
            r(0x1040, cfa::RSP, 8, rbp::SAME, 0),
            r(0x1041, cfa::RSP, 8, rbp::AT_CFA, -16),
            // 0x1045..0x1060 goes past the next boundary.
            no_cfi(0x1045),
            r(0x1060, cfa::RSP, 8, rbp::SAME, 0),
            no_cfi(0x1070),
        ];
        assert_eq!(table.full_rows(), expected);
        assert_eq!(table.base, 0x1000);
        assert_eq!(table.rows[2].pc, 0x20);
        assert_eq!(table.padding, vec![0x1013..0x1020]);
        let s = &table.stats;
        assert_eq!((s.padding_gaps, s.rows_no_cfi), (1, 3));
        assert_eq!((s.rows_rbp_narrowed, s.rows_rbp_unsupported), (1, 1));
        assert_eq!(s.rows_past_4gib, 0);
    }

    #[test]
    fn plt_threshold_accepts_only_the_plt_expression() {
        let enc = gimli::Encoding {
            format: gimli::Format::Dwarf32,
            version: 1,
            address_size: 8,
        };
        let parse =
            |b: &[u8]| plt_threshold(gimli::Expression(EndianSlice::new(b, LittleEndian)), enc);
        assert_eq!(parse(&PLT_EXPR), Some(11));
        let mut ten = PLT_EXPR;
        ten[6] = 0x3a;
        assert_eq!(parse(&ten), Some(10));
        assert_eq!(parse(&PLT_EXPR[..10]), None);
        assert_eq!(parse(&[&PLT_EXPR[..], &[0x22]].concat()), None);
        let mut rbp_based = PLT_EXPR;
        rbp_based[0] = 0x76;
        assert_eq!(parse(&rbp_based), None);
        assert_eq!(parse(&[0x77, 0xa0, 0x01, 0x06]), None);
    }

    #[test]
    fn inflate_is_bounded_by_the_claimed_size() {
        use std::io::Write;
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
        z.write_all(&vec![0u8; 1 << 20]).unwrap();
        let bomb = z.finish().unwrap();
        // 1 MiB in about a kilobyte: read as claimed, refused when the
        // header lies either way or claims too much.
        assert_eq!(inflate(&bomb, 1 << 20).map(|v| v.len()), Some(1 << 20));
        assert_eq!(inflate(&bomb, 100), None);
        assert_eq!(inflate(&bomb, 2 << 20), None);
        assert_eq!(inflate(&bomb, MAX_INFLATED + 1), None);
        assert_eq!(inflate(b"not zlib", 8), None);
    }

    #[test]
    fn build_rejects_what_is_not_an_x86_64_elf() {
        assert!(build(&b"not an elf"[..]).is_err());
        assert!(build(&[][..]).is_err());
    }

    #[test]
    fn build_id_and_file_key() {
        let Ok(libc) = std::fs::read(LIBC) else {
            return;
        };
        let id = build_id(&libc[..]).expect("libc has a build-id");
        assert_eq!(id.len(), 20);
        let meta = std::fs::metadata(LIBC).unwrap();
        assert_eq!(CacheKey::new(&libc[..], &meta), CacheKey::BuildId(id));
        let key = FileKey::new(&meta);
        assert_eq!(key, FileKey::new(&std::fs::metadata(LIBC).unwrap()));
        assert!(key.ino != 0 && key.mtime_ns > 0);
        assert_eq!(build_id(&b"junk"[..]), None);
    }

    /// Read through `object::ReadCache` (only the headers, notes and CFI
    /// sections, as the agent reads binaries), a table and a key are the
    /// same as from the whole file's bytes.
    #[test]
    fn partial_reads_give_the_same_table() {
        let Ok(libc) = std::fs::read(LIBC) else {
            return;
        };
        let meta = std::fs::metadata(LIBC).unwrap();
        let cache = object::ReadCache::new(std::fs::File::open(LIBC).unwrap());
        assert_eq!(
            CacheKey::new(&cache, &meta),
            CacheKey::new(&libc[..], &meta)
        );
        let (a, b) = (build(&cache).unwrap(), build(&libc[..]).unwrap());
        assert!(a.rows.len() > 1000);
        assert!(a.rows == b.rows, "tables differ");
    }

    /// A framehop unwinder with one module: `elf` loaded at its link-time
    /// addresses.
    fn framehop_for(elf: &[u8]) -> UnwinderX86_64<Vec<u8>> {
        let file = object::File::parse(elf).unwrap();
        let section = |name: &str| {
            let s = file.section_by_name(name)?;
            let data = section_bytes(&s)?.into_owned();
            Some((s.address()..s.address() + s.size(), data))
        };
        let eh_frame = section(".eh_frame");
        let eh_frame_hdr = section(".eh_frame_hdr");
        let debug_frame = if eh_frame.is_none() {
            section(".debug_frame")
        } else {
            None
        };
        let text = section(".text");
        let exec = exec_segments(&file);
        let lo = exec.iter().map(|r| r.start).min().unwrap();
        let hi = exec.iter().map(|r| r.end).max().unwrap();
        let info = ExplicitModuleSectionInfo {
            base_svma: 0,
            text_svma: text.as_ref().map(|t| t.0.clone()),
            text: text.map(|t| t.1),
            got_svma: file
                .section_by_name(".got")
                // A segment's end as the file says: saturated, since a corrupt
        // file may put it past the address space.
        .map(|s| s.address()..s.address().saturating_add(s.size())),
            eh_frame_svma: eh_frame.as_ref().map(|t| t.0.clone()),
            eh_frame: eh_frame.map(|t| t.1),
            eh_frame_hdr_svma: eh_frame_hdr.as_ref().map(|t| t.0.clone()),
            eh_frame_hdr: eh_frame_hdr.map(|t| t.1),
            debug_frame: debug_frame.map(|t| t.1),
            ..Default::default()
        };
        let mut u = UnwinderX86_64::new();
        u.add_module(Module::new("test".into(), lo..hi, 0, info));
        u
    }

    /// A fake stack: every word holds a value derived from its address, so
    /// reading the wrong slot shows.
    fn memory(addr: u64) -> u64 {
        (addr ^ 0x5555_5555).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1
    }

    const SP: u64 = 0x7fff_0000_1000;
    const BP: u64 = 0x7fff_0000_8000;

    /// The caller's (return address, CFA, rbp) by the row, `None` for the
    /// outermost frame; rbp is `None` when the row cannot restore it.
    fn unwind_with(row: &Row, pc: u64) -> Option<(u64, u64, Option<u64>)> {
        let cfa = match row.cfa_kind {
            cfa::RSP => SP.wrapping_add_signed(row.cfa_offset.into()),
            cfa::RBP => BP.wrapping_add_signed(row.cfa_offset.into()),
            cfa::PLT => {
                SP + 8
                    + if (pc & 15) as i16 >= row.cfa_offset {
                        8
                    } else {
                        0
                    }
            }
            cfa::END => return None,
            k => panic!("kind {k}"),
        };
        let bp = match row.rbp_kind {
            rbp::SAME => Some(BP),
            rbp::AT_CFA => Some(memory(cfa.wrapping_add_signed(row.rbp_offset.into()))),
            _ => None,
        };
        Some((memory(cfa - 8), cfa, bp))
    }

    #[derive(Debug, Default)]
    struct Agreement {
        checked: usize,
        agreed: usize,
        skipped_unsupported: usize,
        skipped_no_cfi: usize,
        skipped_padding: usize,
        disagreements: Vec<String>,
    }

    /// Unwinds one frame at many pcs of `elf` with its table and with
    /// framehop, and compares.
    /// Pcs in `skip` (padding, never run) are not compared.
    fn cross_check(elf: &[u8], rows: &[Row], skip: &[Range<u64>]) -> Agreement {
        let unwinder = framehop_for(elf);
        let mut cache = CacheX86_64::new();
        let (lo, hi) = (rows[0].pc, rows[rows.len() - 1].pc);
        let mut pcs: Vec<u64> = (0..5000u64)
            .map(|k| lo + (hi - lo) / 5000 * k + (k * 7919) % 61)
            .collect();
        // Both ends of (a sample of) the rows.
        let step = (rows.len() / 10000).max(1);
        for w in rows.windows(2).step_by(step) {
            pcs.push(w[0].pc);
            pcs.push(w[1].pc - 1);
        }
        let mut a = Agreement::default();
        for pc in pcs {
            let i = skip.partition_point(|g| g.end <= pc);
            if skip.get(i).is_some_and(|g| g.contains(&pc)) {
                a.skipped_padding += 1;
                continue;
            }
            let Some(row) = lookup(rows, pc) else {
                continue;
            };
            if row.cfa_kind == cfa::UNSUPPORTED {
                if row.cfa_offset == reason::NO_CFI {
                    a.skipped_no_cfi += 1;
                } else {
                    a.skipped_unsupported += 1;
                }
                continue;
            }
            a.checked += 1;
            let ours = unwind_with(row, pc);
            let mut regs = UnwindRegsX86_64::new(pc, SP, BP);
            let mut read = |addr: u64| Ok(memory(addr));
            let theirs = unwinder.unwind_frame(
                FrameAddress::from_instruction_pointer(pc),
                &mut regs,
                &mut cache,
                &mut read,
            );
            let agree = match (ours, &theirs) {
                (None, Ok(None)) => true,
                (Some((ra, cfa, bp)), Ok(Some(theirs_ra))) => {
                    ra == *theirs_ra && cfa == regs.sp() && bp.is_none_or(|bp| bp == regs.bp())
                }
                _ => false,
            };
            if agree {
                a.agreed += 1;
            } else if a.disagreements.len() < 20 {
                a.disagreements.push(format!(
                    "pc {pc:#x}: row {row:?} gives {ours:x?}, framehop {theirs:x?} (sp {:#x}, bp {:#x})",
                    regs.sp(),
                    regs.bp()
                ));
            }
        }
        a
    }

    fn check_binary(path: &str) {
        let elf = std::fs::read(path).unwrap();
        let table = build(&elf[..]).unwrap();
        let a = cross_check(&elf, &table.full_rows(), &table.padding);
        println!("{path}: {:?}", table.stats);
        println!(
            "{path}: checked {}, agreed {} ({:.3}%), unsupported {}, no CFI {}",
            a.checked,
            a.agreed,
            100.0 * a.agreed as f64 / a.checked as f64,
            a.skipped_unsupported,
            a.skipped_no_cfi
        );
        for d in &a.disagreements {
            println!("  {d}");
        }
        assert!(a.checked > 1000, "{a:?}");
        assert!(a.agreed * 1000 >= a.checked * 999, "{a:?}");
    }

    #[test]
    fn agrees_with_framehop_on_this_test_binary() {
        check_binary(&std::env::current_exe().unwrap().to_string_lossy());
    }

    /// A C program of many functions built with `.debug_frame` and no
    /// `.eh_frame` (needs `cc` and `objcopy`; skipped without them).
    fn debug_frame_only_binary(dir: &std::path::Path, compress: bool) -> Option<Vec<u8>> {
        use std::process::Command;
        // `noipa` keeps gcc from seeing through the calls, so frames stay.
        let mut c = String::from(
            "volatile int sink;\n\
             __attribute__((noipa)) int leaf(int x) { return x * 3; }\n\
             __attribute__((noipa)) void use(char *p, int x) { p[x] = 1; sink = p[x]; }\n",
        );
        for k in 0..120 {
            let body = match k % 3 {
                0 => format!(
                    "char b[{}]; use(b, x & 7); return leaf(x) + b[1];",
                    16 + k * 24
                ),
                1 => "char *p = __builtin_alloca(x + 16); use(p, x); return leaf(x) + p[1];".into(),
                _ => "int s = 0; for (int i = 0; i < x; i++) s += leaf(i) ^ sink; return s;".into(),
            };
            c += &format!("__attribute__((noinline)) int f{k}(int x) {{ {body} }}\n");
        }
        c += "int main(int argc, char **argv) { int s = 0;\n";
        for k in 0..120 {
            c += &format!("s += f{k}(argc);\n");
        }
        c += "return s; }\n";
        let src = dir.join("many.c");
        let exe = dir.join("many");
        std::fs::write(&src, c).ok()?;
        let ok = Command::new("cc")
            .args([
                "-O2",
                "-g",
                "-fno-asynchronous-unwind-tables",
                "-fno-unwind-tables",
            ])
            .arg("-o")
            .arg(&exe)
            .arg(&src)
            .status()
            .ok()?
            .success();
        if !ok {
            return None;
        }
        let mut strip = Command::new("objcopy");
        strip.args([
            "--remove-section=.eh_frame",
            "--remove-section=.eh_frame_hdr",
        ]);
        if compress {
            strip.arg("--compress-debug-sections=zlib");
        }
        if !strip.arg(&exe).status().ok()?.success() {
            return None;
        }
        std::fs::read(&exe).ok()
    }

    #[test]
    fn debug_frame_alone_agrees_with_framehop() {
        let dir = std::env::temp_dir().join(format!("unwind-table-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let plain = debug_frame_only_binary(&dir, false);
        let compressed = debug_frame_only_binary(&dir, true);
        std::fs::remove_dir_all(&dir).ok();
        let (Some(plain), Some(compressed)) = (plain, compressed) else {
            eprintln!("no cc or objcopy: skipped");
            return;
        };
        let table = build(&plain[..]).unwrap();
        let s = &table.stats;
        assert!(!s.has_eh_frame && s.has_debug_frame, "{s:?}");
        assert!(s.fdes_debug_frame >= 120 && s.fdes_eh_frame == 0, "{s:?}");
        assert!(s.rows_rbp > 0, "{s:?}");
        let a = cross_check(&plain, &table.full_rows(), &table.padding);
        println!("debug_frame: {s:?}\n{a:?}");
        assert!(
            a.checked > 500 && a.agreed * 1000 >= a.checked * 999,
            "{a:?}"
        );
        let unpacked = build(&compressed[..]).unwrap();
        assert_eq!(unpacked.rows, table.rows);
    }

    /// The cross-check notices a wrong table.
    #[test]
    fn cross_check_catches_a_wrong_table() {
        let elf = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let table = build(&elf[..]).unwrap();
        let mut rows = table.full_rows();
        for r in &mut rows {
            match r.rbp_kind {
                rbp::AT_CFA => r.rbp_offset -= 8,
                _ if r.cfa_kind == cfa::RSP => r.cfa_offset += 8,
                _ => {}
            }
        }
        let a = cross_check(&elf, &rows, &table.padding);
        assert!(a.checked > 1000 && a.agreed * 10 < a.checked, "{a:?}");
    }

    #[test]
    fn agrees_with_framehop_on_libc() {
        if !std::path::Path::new(LIBC).exists() {
            return;
        }
        check_binary(LIBC);
        let table = build(&std::fs::read(LIBC).unwrap()[..]).unwrap();
        let s = &table.stats;
        assert!(s.unsupported() * 100 < s.rows, "{s:?}");
        assert!(s.rows_plt > 0 || !s.has_eh_frame, "{s:?}");
        assert!(table.rows.windows(2).all(|w| w[0].pc < w[1].pc));
    }

    /// Build times for large binaries: `cargo test --release -p
    /// profiler-user --lib unwind::cfi -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn build_times() {
        let mut paths = vec![
            LIBC.to_string(),
            "/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0".to_string(),
            "/usr/bin/python3.11".to_string(),
        ];
        // A big one: a Rust toolchain's compiler driver, or LLVM.
        for dir in ["/root/.rustup/toolchains", "/usr/lib/x86_64-linux-gnu"] {
            let Ok(entries) = std::fs::read_dir(dir) else {
                continue;
            };
            for e in entries.flatten() {
                let lib = e.path().join("lib");
                for f in std::fs::read_dir(&lib).into_iter().flatten().flatten() {
                    let name = f.file_name().to_string_lossy().into_owned();
                    if name.starts_with("librustc_driver-") && paths.len() < 4 {
                        paths.push(f.path().to_string_lossy().into_owned());
                    }
                }
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with("libLLVM-") && name.contains(".so") {
                    paths.push(e.path().to_string_lossy().into_owned());
                }
            }
        }
        paths.push("/usr/bin/node".to_string());
        let mut seen = std::collections::HashSet::new();
        for path in paths {
            let Ok(elf) = std::fs::read(&path) else {
                continue;
            };
            if !seen.insert(std::fs::canonicalize(&path).unwrap()) {
                continue;
            }
            let mut times = Vec::new();
            let mut table = Table::default();
            for _ in 0..3 {
                let t = std::time::Instant::now();
                table = build(&elf[..]).unwrap();
                times.push(t.elapsed().as_secs_f64() * 1e3);
            }
            let s = &table.stats;
            println!(
                "{path}: {:.1} MB, built in {:.1} ms (first; best of 3 {:.1} ms): {} FDEs, \
                 {} rows ({} KiB; {} CFI rows), {} no-CFI markers, {} unsupported, {} PLT, \
                 {} signal FDEs",
                elf.len() as f64 / 1e6,
                times[0],
                times.iter().cloned().fold(f64::MAX, f64::min),
                s.fdes(),
                s.rows,
                s.rows * size_of::<UnwindRow>() / 1024,
                s.cfi_rows,
                s.rows_no_cfi,
                s.unsupported(),
                s.rows_plt,
                s.fdes_signal
            );
            let full = table.full_rows();
            let unsupported = full
                .iter()
                .filter(|r| r.cfa_kind == cfa::UNSUPPORTED && r.cfa_offset != reason::NO_CFI);
            for r in unsupported.take(10) {
                println!("  unsupported at {:#x}: reason {}", r.pc, r.cfa_offset);
            }
            let a = cross_check(&elf, &table.full_rows(), &table.padding);
            println!(
                "  framehop agrees at {} of {} pcs ({:.3}%); skipped: {} unsupported, {} no CFI",
                a.agreed,
                a.checked,
                100.0 * a.agreed as f64 / a.checked as f64,
                a.skipped_unsupported,
                a.skipped_no_cfi
            );
            for d in a.disagreements.iter().take(5) {
                println!("  {d}");
            }
        }
    }
}
