//! Where a function's frame ends: every `ret` in its code, and every direct
//! `jmp` that leaves it for another function's entry (a tail call). Probing
//! those instructions with plain uprobes replaces return probes
//! (uretprobes), which rewrite the return address on the stack: that
//! rewritten address has no unwind entry, so a C++ `throw` or a Rust panic
//! that unwinds through the frame aborts the target, and Go's runtime, which
//! copies goroutine stacks, crashes. A probe on the `ret` leaves the stack
//! alone.
//!
//! At every site found here the function's frame is already torn down: the
//! stack pointer points at the return address, as at entry. The kernel
//! program adds 8 so that the agent pairs it like a uretprobe's (which
//! fires after the return).
//!
//! A probe written into the middle of an instruction would corrupt the
//! target, so the code is decoded (iced-x86) linearly from the symbol's
//! start to its end, and accepted only if every instruction decodes and
//! every branch inside the function lands on an instruction boundary of
//! that decoding. Otherwise the function gets no exit probes at all
//! ([`Exits::Unsafe`]): its calls are counted at entry only.
//!
//! Exits that cannot be probed are not errors: a conditional tail call
//! (`jcc` to another function), an indirect jump, or a jump into another
//! function's body leave the frame without passing a probed site. The
//! agent closes such frames by stack pointer (see `stacks.rs`), marked as
//! unwound, so counts stay exact.
use iced_x86::{Decoder, DecoderOptions, FlowControl};

use super::symbols::Symbol;

/// Why a function's exits could not all be probed (the frame is then
/// closed by stack pointer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unprobed {
    /// A conditional jump to another function (a conditional tail call).
    ConditionalTailCall,
    /// An indirect jump (a jump table, or a tail call through a pointer).
    IndirectJump,
    /// A jump into the middle of another function.
    JumpOut,
}

/// The exit sites of one function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exits {
    /// Probe these file offsets. `tail_calls` of them are direct jumps to
    /// other functions; `unprobed` names a way the frame can end without
    /// passing any of them.
    Sites {
        /// File offsets of the exit instructions.
        offsets: Vec<u64>,
        /// How many of them are tail calls.
        tail_calls: u32,
        /// The tail calls to a function of this binary: (site, the
        /// callee's file offset).
        tails: Vec<(u64, u64)>,
        /// Where to put the entry probe, when not at the first instruction
        /// (see [`Code::exits`]): bytes after the start.
        entry_shift: u32,
        /// A way out that has no probe, if any.
        unprobed: Option<Unprobed>,
    },
    /// The code could not be decoded safely: no exit probes.
    Unsafe(String),
}

/// The functions of one binary, sorted by address, and its bytes: what
/// exit finding needs to tell a tail call from a jump inside a function.
pub struct Code<'a> {
    data: &'a [u8],
    symbols: &'a [Symbol],
    /// Address ranges of the PLT sections: a jump there is a tail call.
    plt: Vec<(u64, u64)>,
    /// The kernel turns a probe on the 5-byte nop into a call (6.18): an
    /// entry there is the cheapest there is, and stays.
    nop5_calls: bool,
}

/// Every byte of `code` (at `addr`) that may start a direct branch, by
/// its encoding alone: `(is an unconditional jmp, target)` for `call`/`jmp`
/// rel32 (`e8`/`e9`), `jmp`/`jcc` rel8 (`eb`, `70`–`7f`) and `jcc` rel32
/// (`0f 80`–`8f`). Not a decoding: bytes inside other instructions match
/// too, so callers confirm a hit or treat it as a maybe.
fn branch_bytes(addr: u64, code: &[u8]) -> impl Iterator<Item = (bool, u64)> + '_ {
    let rel32 = move |at: usize| {
        code.get(at..at + 4)
            .map(|r| i64::from(i32::from_le_bytes([r[0], r[1], r[2], r[3]])))
    };
    (0..code.len()).filter_map(move |i| {
        let (jmp, len, rel) = match code[i] {
            0xe8 => (false, 5, rel32(i + 1)?),
            0xe9 => (true, 5, rel32(i + 1)?),
            0xeb => (true, 2, i64::from(*code.get(i + 1)? as i8)),
            0x70..=0x7f => (false, 2, i64::from(*code.get(i + 1)? as i8)),
            0x0f if (0x80..=0x8f).contains(code.get(i + 1)?) => (false, 6, rel32(i + 2)?),
            _ => return None,
        };
        Some((jmp, (addr + (i + len) as u64).wrapping_add_signed(rel)))
    })
}

/// How far into a function its entry probe may move (see [`Code::exits`]).
const MAX_ENTRY_SHIFT: u64 = 24;

/// True for an instruction the kernel's uprobes emulate rather than
/// single-step, and that may carry a function's entry probe: a `push` of
/// a register, a relative `call`. (Jumps are emulated too, but a jump may
/// be a return site's tail call.)
fn is_emulated(insn: &iced_x86::Instruction) -> bool {
    matches!(
        insn.code(),
        iced_x86::Code::Push_r64 | iced_x86::Code::Call_rel32_64
    )
}

/// True for a nop (`nop`, or the multi-byte `nopw`/`nopl` compilers pad
/// with before a loop's head): recent kernels emulate the multi-byte ones
/// too (the calibration measures whether this one does), older ones
/// single-step them, which costs no more than the first instruction would.
fn is_nop(insn: &iced_x86::Instruction) -> bool {
    insn.mnemonic() == iced_x86::Mnemonic::Nop
}

/// True when `insn` writes the stack pointer as a register operand.
fn writes_rsp(insn: &iced_x86::Instruction) -> bool {
    (0..insn.op_count()).any(|i| {
        insn.op_kind(i) == iced_x86::OpKind::Register
            && insn.op_register(i).full_register() == iced_x86::Register::RSP
    })
}

/// Largest function decoded (bigger ones are nearly always data or
/// generated tables; their exits are left to the stack-pointer rule).
const MAX_FUNC_BYTES: u64 = 1 << 20;

impl<'a> Code<'a> {
    /// `data` is the whole ELF file; `symbols` its functions sorted by
    /// address (as `super::symbols::read_functions` returns them).
    pub fn new(data: &'a [u8], symbols: &'a [Symbol]) -> Self {
        use object::{Object, ObjectSection};
        let plt = object::File::parse(data)
            .map(|file| {
                file.sections()
                    .filter(|s| s.name().is_ok_and(|n| n.starts_with(".plt")))
                    .map(|s| (s.address(), s.address() + s.size()))
                    .collect()
            })
            .unwrap_or_default();
        Code {
            data,
            symbols,
            plt,
            nop5_calls: false,
        }
    }

    /// The same, knowing that the kernel turns a probe on the 5-byte nop
    /// into a call (`linux::NOP5_CALLS`): an entry on one stays there.
    pub fn with_nop5_calls(self, nop5_calls: bool) -> Self {
        Code { nop5_calls, ..self }
    }

    /// True when `addr` is a function's first instruction or a PLT stub.
    fn is_entry(&self, addr: u64) -> bool {
        self.starting_at(addr).is_some() || self.plt.iter().any(|&(s, e)| addr >= s && addr < e)
    }

    /// The function that starts exactly at `addr`.
    fn starting_at(&self, addr: u64) -> Option<&'a Symbol> {
        self.symbols
            .binary_search_by_key(&addr, |s| s.addr)
            .ok()
            .map(|i| &self.symbols[i])
    }

    /// The function whose body holds `addr`.
    fn containing(&self, addr: u64) -> Option<&'a Symbol> {
        let i = self.symbols.partition_point(|s| s.addr <= addr);
        let s = &self.symbols[i.checked_sub(1)?];
        (addr < s.addr + s.size.max(1)).then_some(s)
    }

    /// The bytes of `sym` in the file.
    fn bytes(&self, sym: &Symbol) -> Option<&'a [u8]> {
        let start = usize::try_from(sym.offset).ok()?;
        let end = start.checked_add(usize::try_from(sym.size).ok()?)?;
        self.data.get(start..end)
    }

    /// Finds the exit sites of `func`.
    pub fn exits(&self, func: &Symbol) -> Exits {
        if func.size == 0 {
            return Exits::Unsafe("its symbol has no size".into());
        }
        if func.size > MAX_FUNC_BYTES {
            return Exits::Unsafe(format!("it is larger than {MAX_FUNC_BYTES} bytes"));
        }
        // The function's own body, then any `NAME.cold` parts it jumps to
        // (gcc's hot/cold splitting: still this function's frame).
        let mut regions: Vec<&Symbol> = vec![func];
        let mut boundaries: Vec<u64> = Vec::new();
        let mut targets: Vec<u64> = Vec::new();
        let mut offsets = Vec::new();
        let mut tail_calls = 0;
        let mut tails = Vec::new();
        let mut unprobed = None;
        // The entry: the kernel single-steps most first instructions out of
        // line (about 10x the cost of one it emulates: a `push` of a
        // register, or a relative `call`). Where the first is stepped and
        // an emulated one follows in straight-line code that leaves the
        // stack pointer alone, every call passes that one with the stack
        // as it was at entry: the entry (and a return uprobe) go there,
        // unless a branch lands between the two (checked below).
        let mut prologue = true;
        let mut entry_shift = 0u32;
        // A nop on the way, should no emulated instruction follow.
        let mut nop_shift = 0u32;
        let mut next = 0;
        while let Some(&region) = regions.get(next) {
            next += 1;
            let Some(bytes) = self.bytes(region) else {
                return Exits::Unsafe(format!("{} lies outside the file", region.name));
            };
            let mut decoder = Decoder::with_ip(64, bytes, region.addr, DecoderOptions::NONE);
            for insn in &mut decoder {
                if insn.is_invalid() {
                    return Exits::Unsafe(format!(
                        "undecodable instruction at {}+{:#x}",
                        region.name,
                        insn.ip() - region.addr
                    ));
                }
                boundaries.push(insn.ip());
                if prologue && next == 1 {
                    let at = insn.ip() - func.addr;
                    let nop5 = bytes.starts_with(&[0x0f, 0x1f, 0x44, 0x00, 0x00]);
                    if at == 0 && self.nop5_calls && nop5 {
                        // Cheaper than any hit the kernel emulates.
                        prologue = false;
                    } else if is_emulated(&insn) {
                        entry_shift = at as u32;
                        prologue = false;
                    } else if at > 0 && at < MAX_ENTRY_SHIFT && is_nop(&insn) {
                        if nop_shift == 0 {
                            nop_shift = at as u32;
                        }
                    } else if at >= MAX_ENTRY_SHIFT
                        || insn.flow_control() != FlowControl::Next
                        || insn.stack_pointer_increment() != 0
                        || writes_rsp(&insn)
                    {
                        prologue = false;
                    }
                }
                let site = region.offset + (insn.ip() - region.addr);
                let inside = |t: u64| regions.iter().any(|r| t >= r.addr && t < r.addr + r.size);
                match insn.flow_control() {
                    FlowControl::Return => offsets.push(site),
                    FlowControl::UnconditionalBranch | FlowControl::ConditionalBranch => {
                        let target = insn.near_branch_target();
                        let conditional = insn.flow_control() == FlowControl::ConditionalBranch;
                        if inside(target) {
                            targets.push(target);
                        } else if let Some(cold) = self.cold_part(func, target) {
                            regions.push(cold);
                            targets.push(target);
                        } else if self.is_entry(target) {
                            if conditional {
                                unprobed = Some(Unprobed::ConditionalTailCall);
                            } else {
                                offsets.push(site);
                                tail_calls += 1;
                                if let Some(callee) = self.starting_at(target) {
                                    tails.push((site, callee.offset));
                                }
                            }
                        } else if !conditional || self.containing(target).is_some() {
                            unprobed = Some(Unprobed::JumpOut);
                        }
                    }
                    FlowControl::IndirectBranch => {
                        unprobed.get_or_insert(Unprobed::IndirectJump);
                    }
                    _ => {}
                }
            }
        }
        boundaries.sort_unstable();
        if let Some(bad) = targets
            .iter()
            .find(|t| boundaries.binary_search(t).is_err())
        {
            return Exits::Unsafe(format!(
                "a branch lands inside an instruction at {bad:#x} (code mixed with data?)"
            ));
        }
        offsets.sort_unstable();
        offsets.dedup();
        tails.sort_unstable();
        tails.dedup();
        // A branch into the instructions before the emulated one, or to it,
        // would skip the entry or pass it twice. Without a `push` or
        // `call`, a nop on the way will do.
        let lands_by = |shift: u32| {
            let shifted = func.addr + u64::from(shift);
            targets.iter().any(|&t| t > func.addr && t <= shifted)
        };
        if entry_shift == 0 || lands_by(entry_shift) {
            entry_shift = match nop_shift > 0 && !lands_by(nop_shift) {
                true => nop_shift,
                false => 0,
            };
        }
        Exits::Sites {
            offsets,
            tail_calls,
            tails,
            unprobed,
            entry_shift,
        }
    }

    /// The functions whose code tail-calls one of `callees` (function
    /// addresses) with a direct `jmp`: the callers a sampled stack cannot
    /// show, the jump having taken their frame off it. Candidates come from
    /// [`branch_bytes`]; each is confirmed by decoding the function.
    pub fn tail_callers(&self, callees: &std::collections::HashSet<u64>) -> Vec<&'a Symbol> {
        let offsets: std::collections::HashSet<u64> = callees
            .iter()
            .filter_map(|&a| self.starting_at(a).map(|s| s.offset))
            .collect();
        self.symbols
            .iter()
            .filter(|sym| sym.size <= MAX_FUNC_BYTES && !callees.contains(&sym.addr))
            .filter(|sym| {
                self.bytes(sym).is_some_and(|b| {
                    branch_bytes(sym.addr, b).any(|(jmp, t)| jmp && callees.contains(&t))
                })
            })
            .filter(|sym| match self.exits(sym) {
                Exits::Sites { tails, .. } => tails.iter().any(|(_, c)| offsets.contains(c)),
                Exits::Unsafe(_) => false,
            })
            .collect()
    }

    /// Of `ranges` (a function's start, the end of the range, a tag), the
    /// tags of those that a direct branch of another function lands in,
    /// after the start and up to the end ([`branch_bytes`]: a false hit
    /// only keeps an entry where it was).
    pub fn jumped_into(&self, mut ranges: Vec<(u64, u64, usize)>) -> Vec<usize> {
        if ranges.is_empty() {
            return Vec::new();
        }
        ranges.sort_unstable();
        let mut hit = vec![false; ranges.len()];
        for sym in self.symbols.iter().filter(|s| s.size <= MAX_FUNC_BYTES) {
            let Some(b) = self.bytes(sym) else { continue };
            for (_, t) in branch_bytes(sym.addr, b) {
                let at = ranges.partition_point(|&(start, _, _)| start < t);
                if let Some(k) = at.checked_sub(1) {
                    let (start, end, _) = ranges[k];
                    if t > start && t <= end && sym.addr != start {
                        hit[k] = true;
                    }
                }
            }
        }
        ranges
            .iter()
            .zip(hit)
            .filter(|(_, h)| *h)
            .map(|(r, _)| r.2)
            .collect()
    }

    /// The `.cold` part of `func` that holds `target`, if any.
    fn cold_part(&self, func: &Symbol, target: u64) -> Option<&'a Symbol> {
        let part = self.containing(target)?;
        let rest = part.raw.strip_prefix(func.raw.as_str())?;
        (rest.starts_with(".cold") && part.size > 0).then_some(part)
    }
}

/// What one probed function's probe hits add to the durations measured
/// (from the calibration at attach, `attach/calibrate.rs`): the durations
/// reported are corrected by it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ProbeCost {
    /// Its entry hit, all of it, in ns (inside its caller's duration).
    pub entry_ns: u32,
    /// Its exit hit, all of it.
    pub exit_ns: u32,
    /// The part of its own two hits inside its own measured duration.
    pub inside_ns: u32,
}

impl ProbeCost {
    /// Both hits: what one call adds to its callers' durations.
    pub fn hits_ns(&self) -> u64 {
        u64::from(self.entry_ns) + u64::from(self.exit_ns)
    }

    /// What to take out of a call measured at `measured_ns` whose traced
    /// calls inside hit probes for `inner_ns`: those, and its own share,
    /// never more than it measured.
    pub fn removed(&self, measured_ns: u64, inner_ns: u64) -> u64 {
        (inner_ns + u64::from(self.inside_ns)).min(measured_ns)
    }
}

/// How one function's returns are observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExitProbe {
    /// Uprobes on these return sites (file offsets).
    Sites(Vec<u64>),
    /// A return uprobe on the function.
    Uretprobe,
    /// No exit probe: calls are counted at entry, with no duration. The
    /// string says why.
    EntryOnly(String),
}

impl ExitProbe {
    /// Short name, for the reports and `profile.data`: `ret`, `uretprobe`
    /// or `entry`.
    pub fn kind(&self) -> &'static str {
        match self {
            ExitProbe::Sites(_) => "ret",
            ExitProbe::Uretprobe => "uretprobe",
            ExitProbe::EntryOnly(_) => "entry",
        }
    }

    /// Probes this function takes, its entry's included.
    pub fn probes(&self) -> usize {
        match self {
            ExitProbe::Sites(sites) => 1 + sites.len(),
            ExitProbe::Uretprobe => 2,
            ExitProbe::EntryOnly(_) => 1,
        }
    }

    /// The probe of a [`ExitProbe::kind`] (replay: without sites).
    pub fn from_kind(kind: &str) -> Self {
        match kind {
            "ret" => ExitProbe::Sites(Vec::new()),
            "entry" => ExitProbe::EntryOnly(String::new()),
            _ => ExitProbe::Uretprobe,
        }
    }
}

/// What runs in a binary, as far as returns are concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runtime {
    /// Go: goroutine stacks are copied when they grow, so a rewritten
    /// return address crashes the program.
    Go,
    /// C++ exceptions or Rust panics: their unwinder walks every frame and
    /// aborts at a return address it has no unwind entry for.
    Unwinding,
    /// Neither.
    Plain,
}

/// Tells what runs in the ELF file `data`.
pub fn runtime_of(data: &[u8]) -> Runtime {
    use object::{Object, ObjectSymbol};
    let Ok(file) = object::File::parse(data) else {
        return Runtime::Plain;
    };
    if file.section_by_name(".go.buildinfo").is_some()
        || file.symbols().any(|s| s.name() == Ok("runtime.main"))
    {
        return Runtime::Go;
    }
    // What unwinds through frames: C++ exceptions, Rust panics, and
    // glibc's forced unwinding of a cancelled or exiting thread.
    const UNWINDERS: &[&str] = &[
        "__cxa_throw",
        "__gxx_personality_v0",
        "_Unwind_RaiseException",
        "_Unwind_Resume",
        "_Unwind_ForcedUnwind",
        "rust_eh_personality",
        "pthread_cancel",
        "pthread_exit",
    ];
    let unwinds = file.section_by_name(".gcc_except_table").is_some()
        || file.symbols().chain(file.dynamic_symbols()).any(|s| {
            s.name()
                .is_ok_and(|n| UNWINDERS.contains(&n.split('@').next().unwrap_or(n)))
        });
    if unwinds {
        Runtime::Unwinding
    } else {
        Runtime::Plain
    }
}

/// How returns are observed in one binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Return sites; entry only where they cannot be found safely.
    Ret,
    /// Return uprobes.
    Uretprobe,
}

/// How one function's returns are observed, as [`plan`] chose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The exit probes.
    pub exit: ExitProbe,
    /// A way out no exit probe sees, with return sites.
    pub unprobed: Option<Unprobed>,
    /// Its tail calls to functions of the same binary, among its return
    /// sites: (site, the callee's file offset).
    pub tails: Vec<(u64, u64)>,
    /// Where its entry probe goes: bytes after its start (0: the start).
    pub entry_shift: u32,
}

/// Chooses how each of `funcs` (functions of one binary whose file is
/// `data`, all functions `symbols`) has its returns observed, by `policy`;
/// `nop5_calls`: the kernel turns a probe on the 5-byte nop into a call.
pub fn plan<'s>(
    data: &[u8],
    symbols: &[Symbol],
    funcs: impl Iterator<Item = &'s Symbol>,
    policy: Policy,
    nop5_calls: bool,
) -> Vec<Plan> {
    let funcs: Vec<&Symbol> = funcs.collect();
    let code = Code::new(data, symbols).with_nop5_calls(nop5_calls);
    let mut plans = plan_each(&code, &funcs, policy);
    // An entry moved past the first instruction must not be where another
    // function's code jumps in (hand-written assembly shares bodies so):
    // such a jump would pass it without an entry.
    let moved: Vec<(u64, u64, usize)> = funcs
        .iter()
        .zip(&plans)
        .enumerate()
        .filter(|(_, (_, p))| p.entry_shift > 0)
        .map(|(i, (f, p))| (f.addr, f.addr + u64::from(p.entry_shift), i))
        .collect();
    for i in code.jumped_into(moved) {
        plans[i].entry_shift = 0;
    }
    plans
}

fn plan_each(code: &Code, funcs: &[&Symbol], policy: Policy) -> Vec<Plan> {
    let plain = |exit| Plan {
        exit,
        unprobed: None,
        tails: Vec::new(),
        entry_shift: 0,
    };
    funcs
        .iter()
        .map(|&f| {
            if policy == Policy::Uretprobe {
                // The callee of a tail call returns through the replaced
                // address, so both exits fire then; the tail calls are
                // still needed to tell the callee's entry, at the caller's
                // own level, from a frame proving the caller gone.
                let (tails, entry_shift) = match code.exits(f) {
                    Exits::Sites {
                        tails, entry_shift, ..
                    } => (tails, entry_shift),
                    Exits::Unsafe(_) => (Vec::new(), 0),
                };
                return Plan {
                    tails,
                    entry_shift,
                    ..plain(ExitProbe::Uretprobe)
                };
            }
            match code.exits(f) {
                Exits::Sites {
                    offsets,
                    unprobed,
                    tails,
                    entry_shift,
                    ..
                } if !offsets.is_empty() => Plan {
                    exit: ExitProbe::Sites(offsets),
                    unprobed,
                    tails,
                    entry_shift,
                },
                Exits::Sites { .. } => {
                    plain(ExitProbe::EntryOnly("no return instruction found".into()))
                }
                Exits::Unsafe(why) => plain(ExitProbe::EntryOnly(why)),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sym(name: &str, addr: u64, size: u64) -> Symbol {
        Symbol {
            name: name.into(),
            raw: name.into(),
            addr,
            offset: addr,
            size,
        }
    }

    /// A file whose bytes at `addr` are `code`.
    fn file(parts: &[(u64, &[u8])]) -> Vec<u8> {
        let mut data = vec![0xcc; 0x400];
        for (addr, code) in parts {
            data[*addr as usize..*addr as usize + code.len()].copy_from_slice(code);
        }
        data
    }

    #[test]
    fn finds_every_ret() {
        // f: test edi,edi; je +3; mov eax,1; ret; xor eax,eax; ret
        let f: &[u8] = &[
            0x85, 0xff, 0x74, 0x06, 0xb8, 0x01, 0, 0, 0, 0xc3, 0x31, 0xc0, 0xc3,
        ];
        let data = file(&[(0x100, f)]);
        let syms = [sym("f", 0x100, f.len() as u64)];
        let exits = Code::new(&data, &syms).exits(&syms[0]);
        assert_eq!(
            exits,
            Exits::Sites {
                offsets: vec![0x109, 0x10c],
                tail_calls: 0,
                tails: vec![],
                entry_shift: 0,
                unprobed: None
            }
        );
    }

    #[test]
    fn tail_call_is_an_exit_and_cold_part_is_followed() {
        // f: test edi,edi; jne f.cold (0x200); jmp g (0x180)
        // f.cold: ret
        // g: ret
        let f: &[u8] = &[
            0x85, 0xff, // test
            0x0f, 0x85, 0xf8, 0x00, 0x00, 0x00, // jne 0x200
            0xe9, 0x73, 0x00, 0x00, 0x00, // jmp 0x180
        ];
        let data = file(&[(0x100, f), (0x180, &[0xc3]), (0x200, &[0xc3])]);
        let syms = [
            sym("f", 0x100, f.len() as u64),
            sym("g", 0x180, 1),
            sym("f.cold", 0x200, 1),
        ];
        let exits = Code::new(&data, &syms).exits(&syms[0]);
        assert_eq!(
            exits,
            Exits::Sites {
                offsets: vec![0x108, 0x200],
                tail_calls: 1,
                tails: vec![(0x108, 0x180)],
                entry_shift: 0,
                unprobed: None
            }
        );
    }

    /// The entry shift `exits` finds for code `f` at 0x100 (a function
    /// `g` at 0x180 to call).
    fn shift_of(f: &[u8]) -> u32 {
        let data = file(&[(0x100, f), (0x180, &[0xc3])]);
        let syms = [sym("f", 0x100, f.len() as u64), sym("g", 0x180, 1)];
        match Code::new(&data, &syms).exits(&syms[0]) {
            Exits::Sites { entry_shift, .. } => entry_shift,
            e => panic!("{e:?}"),
        }
    }

    #[test]
    fn the_entry_moves_onto_an_emulated_instruction_in_straight_line_code() {
        // mov rdx,rdi; call g (0x180); ret: the call, 3 bytes in.
        assert_eq!(
            shift_of(&[0x48, 0x89, 0xfa, 0xe8, 0x78, 0x00, 0x00, 0x00, 0xc3]),
            3
        );
        // xor eax,eax; mov rbx,rdi; push rbx; pop rbx; ret: the push.
        assert_eq!(
            shift_of(&[0x31, 0xc0, 0x48, 0x89, 0xfb, 0x53, 0x5b, 0xc3]),
            5
        );
        // endbr64; push rbp; mov rbp,rsp; pop rbp; ret (-fcf-protection,
        // Ubuntu's and Fedora's default): the push, past the endbr64 that
        // most kernels single-step.
        assert_eq!(
            shift_of(&[0xf3, 0x0f, 0x1e, 0xfa, 0x55, 0x48, 0x89, 0xe5, 0x5d, 0xc3]),
            4
        );
        // mov r8,rdi; xor esi,esi; nopl 0(rax); loop: inc rsi; cmp rsi,rdi;
        // jne loop; ret: no push or call, so the nop padding before the
        // loop's head (a cost_caller's shape).
        assert_eq!(
            shift_of(&[
                0x49, 0x89, 0xf8, 0x31, 0xf6, 0x0f, 0x1f, 0x40, 0x00, 0x48, 0xff, 0xc6, 0x48, 0x39,
                0xfe, 0x75, 0xf8, 0xc3
            ]),
            5
        );
        // mov; nop; push rbx; pop rbx; ret: the push, past the nop.
        assert_eq!(shift_of(&[0x48, 0x89, 0xfa, 0x90, 0x53, 0x5b, 0xc3]), 4);
        // xor eax,eax; nop; jmp back to the nop: a branch lands on it, stays.
        assert_eq!(shift_of(&[0x31, 0xc0, 0x90, 0xeb, 0xfd]), 0);
        // nop5; mov rdx,rdi; call g: the call, where the kernel steps the
        // nop (before 6.18); where it turns it into a call, the nop.
        let f: &[u8] = &[
            0x0f, 0x1f, 0x44, 0x00, 0x00, 0x48, 0x89, 0xfa, 0xe8, 0x73, 0x00, 0x00, 0x00, 0xc3,
        ];
        assert_eq!(shift_of(f), 8);
        let data = file(&[(0x100, f), (0x180, &[0xc3])]);
        let syms = [sym("f", 0x100, f.len() as u64), sym("g", 0x180, 1)];
        match Code::new(&data, &syms)
            .with_nop5_calls(true)
            .exits(&syms[0])
        {
            Exits::Sites { entry_shift, .. } => assert_eq!(entry_shift, 0),
            e => panic!("{e:?}"),
        }
        // push rbx first: already emulated, stays.
        assert_eq!(shift_of(&[0x53, 0x5b, 0xc3]), 0);
        // sub rsp,8 first: the stack pointer moved, stays.
        assert_eq!(
            shift_of(&[0x48, 0x83, 0xec, 0x08, 0x53, 0x5b, 0x48, 0x83, 0xc4, 0x08, 0xc3]),
            0
        );
        // test edi,edi; je +1; push rbx; pop rbx; ret: a branch first, stays.
        assert_eq!(shift_of(&[0x85, 0xff, 0x74, 0x01, 0x53, 0x5b, 0xc3]), 0);
        // xor eax,eax; push rbx; pop rbx; jmp back to the push: a branch
        // lands on it (its entry would fire twice), stays.
        assert_eq!(shift_of(&[0x31, 0xc0, 0x53, 0x5b, 0xeb, 0xfc]), 0);
    }

    #[test]
    fn an_entry_another_function_jumps_into_stays_at_the_start() {
        // f: mov rdx,rdi; push rbx; pop rbx; ret (its entry would move onto
        // the push, 3 bytes in); h: jmp f+3 (into f's body); g: xor; push;
        // pop; ret (moves, nobody jumps in).
        let f: &[u8] = &[0x48, 0x89, 0xfa, 0x53, 0x5b, 0xc3];
        let h: &[u8] = &[0xe9, 0xbe, 0xff, 0xff, 0xff];
        let g: &[u8] = &[0x31, 0xc0, 0x53, 0x5b, 0xc3];
        let data = file(&[(0x100, f), (0x140, h), (0x180, g)]);
        let syms = [sym("f", 0x100, 6), sym("h", 0x140, 5), sym("g", 0x180, 5)];
        let plans = plan(
            &data,
            &syms,
            [&syms[0], &syms[2]].into_iter(),
            Policy::Ret,
            false,
        );
        assert_eq!((plans[0].entry_shift, plans[1].entry_shift), (0, 2));
        // Without the jump in, f's moves.
        let plans = plan(
            &data,
            &syms[..1],
            [&syms[0]].into_iter(),
            Policy::Ret,
            false,
        );
        assert_eq!(plans[0].entry_shift, 3);
    }

    #[test]
    fn tail_callers_are_found_by_their_jumps() {
        // f: jmp g (e9); h: call g; ret; k: xor eax,eax; jmp g (eb), at
        // 0x17c, two bytes before g; g: ret.
        let f: &[u8] = &[0xe9, 0x7b, 0x00, 0x00, 0x00];
        let h: &[u8] = &[0xe8, 0x3b, 0x00, 0x00, 0x00, 0xc3];
        let k: &[u8] = &[0x31, 0xc0, 0xeb, 0x00];
        let data = file(&[(0x100, f), (0x140, h), (0x17c, k), (0x180, &[0xc3])]);
        let syms = [
            sym("f", 0x100, 5),
            sym("h", 0x140, 6),
            sym("k", 0x17c, 4),
            sym("g", 0x180, 1),
        ];
        let callees = std::collections::HashSet::from([0x180]);
        let callers: Vec<&str> = Code::new(&data, &syms)
            .tail_callers(&callees)
            .iter()
            .map(|s| s.name.as_str())
            .collect();
        assert_eq!(callers, ["f", "k"]);
    }

    #[test]
    fn conditional_tail_call_and_indirect_jump_are_unprobed() {
        // f: je g; ret
        let f: &[u8] = &[0x0f, 0x84, 0x7a, 0x00, 0x00, 0x00, 0xc3];
        // h: jmp rax
        let h: &[u8] = &[0xff, 0xe0];
        let data = file(&[(0x100, f), (0x180, &[0xc3]), (0x1c0, h)]);
        let syms = [
            sym("f", 0x100, f.len() as u64),
            sym("g", 0x180, 1),
            sym("h", 0x1c0, 2),
        ];
        let code = Code::new(&data, &syms);
        assert_eq!(
            code.exits(&syms[0]),
            Exits::Sites {
                offsets: vec![0x106],
                tail_calls: 0,
                tails: vec![],
                entry_shift: 0,
                unprobed: Some(Unprobed::ConditionalTailCall)
            }
        );
        assert_eq!(
            code.exits(&syms[2]),
            Exits::Sites {
                offsets: vec![],
                tail_calls: 0,
                tails: vec![],
                entry_shift: 0,
                unprobed: Some(Unprobed::IndirectJump)
            }
        );
    }

    #[test]
    fn policies_pick_sites_or_return_uprobes() {
        // f: ret at +5 after a 5-byte nop; g: push rbp; pop rbp; ret
        let f: &[u8] = &[0x0f, 0x1f, 0x44, 0x00, 0x00, 0xc3];
        let g: &[u8] = &[0x55, 0x5d, 0xc3];
        let data = file(&[(0x100, f), (0x180, g)]);
        let syms = [sym("f", 0x100, 6), sym("g", 0x180, 3)];
        let plans = |policy| -> Vec<ExitProbe> {
            plan(&data, &syms, syms.iter(), policy, false)
                .into_iter()
                .map(|p| p.exit)
                .collect()
        };
        assert_eq!(
            plans(Policy::Ret),
            vec![ExitProbe::Sites(vec![0x105]), ExitProbe::Sites(vec![0x182])]
        );
        assert_eq!(
            plans(Policy::Uretprobe),
            vec![ExitProbe::Uretprobe, ExitProbe::Uretprobe]
        );
    }

    #[test]
    fn branch_into_an_instruction_is_unsafe() {
        // f: jmp +1 (into the middle of the mov); mov eax, 0xc3c3c3c3; ret
        let f: &[u8] = &[0xeb, 0x01, 0xb8, 0xc3, 0xc3, 0xc3, 0xc3, 0xc3];
        let data = file(&[(0x100, f)]);
        let syms = [sym("f", 0x100, f.len() as u64)];
        let exits = Code::new(&data, &syms).exits(&syms[0]);
        assert!(
            matches!(&exits, Exits::Unsafe(why) if why.contains("inside an instruction")),
            "{exits:?}"
        );
    }

    #[test]
    fn no_size_or_bytes_outside_the_file_is_unsafe() {
        let data = file(&[]);
        let syms = [sym("f", 0x100, 0), sym("g", 0x3f0, 0x100)];
        let code = Code::new(&data, &syms);
        assert!(matches!(code.exits(&syms[0]), Exits::Unsafe(_)));
        assert!(matches!(code.exits(&syms[1]), Exits::Unsafe(_)));
    }

    #[test]
    fn own_binary_functions_decode() {
        let data = std::fs::read("/proc/self/exe").unwrap();
        let syms =
            super::super::symbols::read_functions(std::path::Path::new("/proc/self/exe")).unwrap();
        let code = Code::new(&data, &syms);
        let mut with_sites = 0;
        for s in syms.iter().filter(|s| s.size > 0) {
            if let Exits::Sites { offsets, .. } = code.exits(s) {
                with_sites += usize::from(!offsets.is_empty());
            }
        }
        assert!(
            with_sites * 10 >= syms.len() * 8,
            "{with_sites} of {}",
            syms.len()
        );
    }
}
