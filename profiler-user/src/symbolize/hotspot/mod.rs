//! HotSpot frames (the JVM): finds the processes that run it (a mapped
//! `libjvm.so` exporting `gHotSpotVMStructs`), tells the kernel where
//! their code heaps are and how their frames look (`HS_PROCS`), and names
//! the frames it found (`java:pkg.Class.method (File.java:line)`) from
//! each `Method*`, read through `/proc/PID/mem`.
//!
//! Every offset and size comes from the JVM's own tables
//! (`gHotSpotVMStructs`, `gHotSpotVMTypes`, `gHotSpotVMIntConstants`,
//! laid out as the `gHotSpotVMStructEntry*Offset` symbols say), read
//! from the live process (their strings are relocated at load). What the
//! tables do not describe is taken from HotSpot's sources: the
//! interpreter's frame slots below its frame pointer (x86-64, JDK 9 and
//! later: the method at `last_sp - 1`, the bytecode pointer 5 slots
//! further), and the line-number table's encoding. A JVM whose tables
//! lack a field, or give it another type, gets one line on stderr and
//! keeps its native frames.
//!
//! An interpreted frame carries its method and bytecode index: its name
//! has the line. A compiled frame carries its `nmethod` and pc offset:
//! the `PcDesc` at that pc gives its scopes (the methods inlined there,
//! each with its bytecode index), named outermost first, the inlined ones
//! suffixed `_[i]`; without one, the compiled method alone, without a
//! line. A method is read when the kernel first stores a stack holding
//! it (a notice in `PY_NEWS`, shared with Python and V8) and kept. An
//! `nmethod` freed and another compiled at the same address after its
//! notice is named as the first.
use std::{
    collections::{HashMap, HashSet},
    fs::File,
    sync::Mutex,
};

use aya::maps::{HashMap as BpfHash, MapData};
use profiler_common::hotspot::{
    self as common, HsProc, BLOB_WINDOW, LEAF, LOW_MAX, MAX_HEAPS, OFFSET_MAX,
};

use super::proc_mem::Mem;

mod threads;
pub use threads::thread_names;

/// Prefix of a Java frame's name.
pub const PREFIX: &str = "java:";

/// Set in `Meta::pool_source_file` when the index is the class's.
const SOURCE_IN_KLASS: u32 = 1 << 31;

/// What the namer reads, from the JVM's tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Meta {
    kernel: HsProc,
    /// Excluded bytes of its UNSIGNED5 streams: 1 from JDK 21, else 0.
    unsigned5_x: u8,
    /// `CodeBlob::_name`.
    blob_name: u32,
    const_constants: u32,
    const_flags: u32,
    const_code_size: u32,
    const_name_index: u32,
    has_line_table: u16,
    pool_holder: u32,
    /// Where a class's source file's name index is: at this offset in its
    /// constant pool (JDK 12 and later), or in its `InstanceKlass`
    /// ([`SOURCE_IN_KLASS`] set; JDK 11).
    pool_source_file: u32,
    pool_length: u32,
    pool_size: u32,
    klass_name: u32,
    klass_constants: u32,
    symbol_length: u32,
    symbol_body: u32,
    compiled_method: u32,
    compiled_scopes_data: u32,
    nmethod_metadata: u32,
    nmethod_scopes_pcs: u32,
    nmethod_dependencies: u32,
    pc_desc_size: u32,
    pc_desc_pc: u32,
    pc_desc_scope: u32,
}

/// One field of `gHotSpotVMStructs`: static (its address) or not (its
/// offset), and its type.
struct Field {
    is_static: bool,
    offset: u64,
    address: u64,
    ty: String,
}

/// The JVM's tables, as read from its memory.
struct Tables {
    fields: HashMap<(String, String), Field>,
    sizes: HashMap<String, u64>,
    ints: HashMap<String, i64>,
}

/// A NUL-terminated string of at most 255 bytes.
fn cstr(mem: &Mem, addr: u64) -> Option<String> {
    if addr == 0 {
        return None;
    }
    let mut out = Vec::new();
    let mut at = addr;
    while out.len() < 256 {
        // Up to the next 64-byte boundary, so a read never crosses into
        // an unmapped page past the string.
        let n = 64 - (at % 64) as usize;
        let chunk = mem.bytes(at, n)?;
        if let Some(end) = chunk.iter().position(|&b| b == 0) {
            out.extend_from_slice(&chunk[..end]);
            return String::from_utf8(out).ok();
        }
        out.extend_from_slice(&chunk);
        at += n as u64;
    }
    None
}

/// The entries of one of the tables: `arr` each `stride` bytes, until
/// the one whose first name is null.
fn entries(mem: &Mem, arr: u64, stride: u64, mut each: impl FnMut(&[u8]) -> bool) -> Option<()> {
    if arr == 0 || stride == 0 || stride > 256 {
        return None;
    }
    for i in 0..20_000u64 {
        let e = mem.bytes(arr + i * stride, stride as usize)?;
        if !each(&e) {
            return Some(());
        }
    }
    None
}

fn word(e: &[u8], at: u64) -> Option<u64> {
    let b = e.get(at as usize..at as usize + 8)?;
    Some(u64::from_ne_bytes(b.try_into().ok()?))
}

/// Reads the tables through `mem`, with `sym(name)` the address of an
/// exported symbol.
fn read_tables(mem: &Mem, sym: &dyn Fn(&str) -> Option<u64>) -> Result<Tables, String> {
    let g = |name: &str| -> Result<u64, String> {
        let at = sym(name).ok_or_else(|| format!("no {name}"))?;
        mem.u64(at).ok_or_else(|| format!("{name} unreadable"))
    };
    let mut t = Tables {
        fields: HashMap::new(),
        sizes: HashMap::new(),
        ints: HashMap::new(),
    };
    let (tn, fname, ts, st, off, addr) = (
        g("gHotSpotVMStructEntryTypeNameOffset")?,
        g("gHotSpotVMStructEntryFieldNameOffset")?,
        g("gHotSpotVMStructEntryTypeStringOffset")?,
        g("gHotSpotVMStructEntryIsStaticOffset")?,
        g("gHotSpotVMStructEntryOffsetOffset")?,
        g("gHotSpotVMStructEntryAddressOffset")?,
    );
    let stride = g("gHotSpotVMStructEntryArrayStride")?;
    entries(mem, g("gHotSpotVMStructs")?, stride, |e| {
        let Some(type_name) = word(e, tn).and_then(|a| cstr(mem, a)) else {
            return false;
        };
        let (Some(field), Some(is_static), Some(offset), Some(address)) = (
            word(e, fname).and_then(|a| cstr(mem, a)),
            e.get(st as usize..st as usize + 4),
            word(e, off),
            word(e, addr),
        ) else {
            return true;
        };
        let ty = word(e, ts).and_then(|a| cstr(mem, a)).unwrap_or_default();
        let is_static = is_static != [0, 0, 0, 0];
        t.fields.insert(
            (type_name, field),
            Field {
                is_static,
                offset,
                address,
                ty,
            },
        );
        true
    })
    .ok_or("gHotSpotVMStructs unreadable")?;
    let (tn, size) = (
        g("gHotSpotVMTypeEntryTypeNameOffset")?,
        g("gHotSpotVMTypeEntrySizeOffset")?,
    );
    entries(
        mem,
        g("gHotSpotVMTypes")?,
        g("gHotSpotVMTypeEntryArrayStride")?,
        |e| {
            let Some(name) = word(e, tn).and_then(|a| cstr(mem, a)) else {
                return false;
            };
            if let Some(s) = word(e, size) {
                t.sizes.insert(name, s);
            }
            true
        },
    )
    .ok_or("gHotSpotVMTypes unreadable")?;
    let (name, value) = (
        g("gHotSpotVMIntConstantEntryNameOffset")?,
        g("gHotSpotVMIntConstantEntryValueOffset")?,
    );
    entries(
        mem,
        g("gHotSpotVMIntConstants")?,
        g("gHotSpotVMIntConstantEntryArrayStride")?,
        |e| {
            let Some(n) = word(e, name).and_then(|a| cstr(mem, a)) else {
                return false;
            };
            if let Some(b) = e.get(value as usize..value as usize + 4) {
                let v = i32::from_ne_bytes([b[0], b[1], b[2], b[3]]);
                t.ints.insert(n, i64::from(v));
            }
            true
        },
    )
    .ok_or("gHotSpotVMIntConstants unreadable")?;
    Ok(t)
}

impl Tables {
    /// A field's offset, checked to be of type `ty` ("" for any).
    fn off(&self, class: &str, field: &str, ty: &str) -> Result<u32, String> {
        let f = self
            .fields
            .get(&(class.to_string(), field.to_string()))
            .ok_or_else(|| format!("no {class}::{field}"))?;
        if f.is_static || (!ty.is_empty() && f.ty != ty) {
            return Err(format!("{class}::{field} is {}", f.ty));
        }
        u32::try_from(f.offset)
            .ok()
            .filter(|&o| o < 4096)
            .ok_or_else(|| format!("{class}::{field} at {}", f.offset))
    }

    /// A static field's address.
    fn address(&self, class: &str, field: &str) -> Result<u64, String> {
        match self.fields.get(&(class.to_string(), field.to_string())) {
            Some(f) if f.is_static && f.address != 0 => Ok(f.address),
            _ => Err(format!("no static {class}::{field}")),
        }
    }

    fn size(&self, ty: &str) -> Result<u32, String> {
        let s = *self.sizes.get(ty).ok_or_else(|| format!("no type {ty}"))?;
        u32::try_from(s)
            .ok()
            .filter(|&s| s > 0 && s < 4096)
            .ok_or_else(|| format!("sizeof({ty}) = {s}"))
    }

    fn int(&self, name: &str) -> Result<i64, String> {
        self.ints
            .get(name)
            .copied()
            .ok_or_else(|| format!("no {name}"))
    }
}

/// The JVM's layout, or why it does not match. `Ok(None)`: its code
/// heaps are not set up yet (read again when its mappings change).
fn read_meta(mem: &Mem, t: &Tables) -> Result<Option<Meta>, String> {
    let major = mem
        .u32(t.address("Abstract_VM_Version", "_vm_major_version")?)
        .ok_or("the version is unreadable")?;
    // The interpreter's frame layout below (its mirror slot) is JDK 9's
    // and later; it is checked on 11, 17 and 21.
    if !(9..=40).contains(&major) {
        return Err(format!("JDK {major}"));
    }
    let sender_sp = t.int("frame::interpreter_frame_sender_sp_offset")?;
    let last_sp = t.int("frame::interpreter_frame_last_sp_offset")?;
    if sender_sp != -1 || last_sp != -2 {
        return Err(format!(
            "interpreter frame slots {sender_sp}, {last_sp}, not -1, -2"
        ));
    }
    // The lowest of these, the bytecode pointer's (64 bytes below the
    // frame pointer), is FP_WINDOW: the kernel reads them in one read.
    let method_slot = last_sp - 1;
    let bcp_slot = method_slot - 5;
    // JDK 21 moved a method's flags into ConstMethodFlags (a u4 whose
    // low half holds this one).
    let has_line_table = t
        .int("ConstMethod::_has_linenumber_table")
        .or_else(|_| t.int("ConstMethodFlags::_misc_has_linenumber_table"))?;
    let has_line_table = u16::try_from(has_line_table).map_err(|_| "line-table flag")?;
    let vs_low_boundary = t.off("VirtualSpace", "_low_boundary", "char*")?;
    let vs_high_boundary = t.off("VirtualSpace", "_high_boundary", "char*")?;
    let vs_low = t.off("VirtualSpace", "_low", "char*")?;
    let heap_memory = t.off("CodeHeap", "_memory", "VirtualSpace")?;
    let heap_segmap = t.off("CodeHeap", "_segmap", "VirtualSpace")?;
    let heap_shift = t.off("CodeHeap", "_log2_segment_size", "int")?;
    // GenericGrowableArray before JDK 16.
    let array_len = t
        .off("GrowableArrayBase", "_len", "int")
        .or_else(|_| t.off("GenericGrowableArray", "_len", "int"))?;
    let array_data = t.off("GrowableArray<int>", "_data", "int*")?;
    // The kernel reads a blob's frame size and frame-complete offset in
    // one read of BLOB_WINDOW bytes, with its code start where that lies
    // close enough too (JDK 9-20); else apart (JDK 21 put it near the
    // blob's start).
    let frame_size = t.off("CodeBlob", "_frame_size", "int")?;
    let frame_complete = t.off("CodeBlob", "_frame_complete_offset", "int")?;
    let code_begin = t.off("CodeBlob", "_code_begin", "address")?;
    let sizes_at = frame_size.min(frame_complete) & !7;
    let sizes_end = (frame_size + 4).max(frame_complete + 4);
    if sizes_end - sizes_at > BLOB_WINDOW {
        return Err(format!(
            "CodeBlob's frame size and frame-complete offset at {frame_size} and {frame_complete}"
        ));
    }
    let with_code = sizes_at.min(code_begin & !7);
    let (blob_window, code_at) = if sizes_end.max(code_begin + 8) - with_code <= BLOB_WINDOW {
        (with_code, code_begin - with_code)
    } else {
        (sizes_at, common::CODE_APART | code_begin)
    };
    let mut kernel = HsProc {
        heap_block: t.size("HeapBlock")?,
        blob_window,
        blob_frame_size: frame_size - blob_window,
        blob_frame_complete: frame_complete - blob_window,
        blob_code_begin: code_at,
        method_const: t.off("Method", "_constMethod", "ConstMethod*")?,
        const_method_size: t.size("ConstMethod")?,
        fp_sender_sp: (-sender_sp * 8) as u32,
        fp_method: (-method_slot * 8) as u32,
        fp_bcp: (-bcp_slot * 8) as u32,
        ..HsProc::default()
    };
    let meta = Meta {
        kernel,
        unsigned5_x: u8::from(major >= 21),
        blob_name: t.off("CodeBlob", "_name", "const char*")?,
        const_constants: t.off("ConstMethod", "_constants", "ConstantPool*")?,
        const_flags: t
            .off("ConstMethod", "_flags", "u2")
            .or_else(|_| t.off("ConstMethod", "_flags._flags", "u4"))?,
        const_code_size: t.off("ConstMethod", "_code_size", "u2")?,
        const_name_index: t.off("ConstMethod", "_name_index", "u2")?,
        has_line_table,
        pool_holder: t.off("ConstantPool", "_pool_holder", "InstanceKlass*")?,
        pool_source_file: t
            .off("ConstantPool", "_source_file_name_index", "u2")
            .or_else(|_| {
                t.off("InstanceKlass", "_source_file_name_index", "u2")
                    .map(|o| o | SOURCE_IN_KLASS)
            })?,
        pool_length: t.off("ConstantPool", "_length", "int")?,
        pool_size: t.size("ConstantPool")?,
        klass_name: t.off("Klass", "_name", "Symbol*")?,
        klass_constants: t.off("InstanceKlass", "_constants", "ConstantPool*")?,
        symbol_length: t
            .off("Symbol", "_length", "u2")
            .or_else(|_| t.off("Symbol", "_length", "unsigned short"))?,
        symbol_body: t.off("Symbol", "_body", "")?,
        compiled_method: t.off("CompiledMethod", "_method", "Method*")?,
        compiled_scopes_data: t.off("CompiledMethod", "_scopes_data_begin", "address")?,
        nmethod_metadata: t.off("nmethod", "_metadata_offset", "int")?,
        nmethod_scopes_pcs: t.off("nmethod", "_scopes_pcs_offset", "int")?,
        nmethod_dependencies: t.off("nmethod", "_dependencies_offset", "int")?,
        pc_desc_size: t.size("PcDesc")?,
        pc_desc_pc: t.off("PcDesc", "_pc_offset", "int")?,
        pc_desc_scope: t.off("PcDesc", "_scope_decode_offset", "int")?,
    };
    // The interpreter's code: AbstractInterpreter::_code, a StubQueue*
    // whose buffer holds every codelet. Set up with the code heaps.
    let queue = mem
        .u64(t.address("AbstractInterpreter", "_code")?)
        .ok_or("AbstractInterpreter::_code unreadable")?;
    if queue == 0 {
        return Ok(None);
    }
    let buffer = mem
        .u64(queue + u64::from(t.off("StubQueue", "_stub_buffer", "address")?))
        .ok_or("the interpreter's code unreadable")?;
    let limit = mem
        .u32(queue + u64::from(t.off("StubQueue", "_buffer_limit", "int")?))
        .ok_or("the interpreter's code unreadable")?;
    if buffer == 0 || limit == 0 || limit > 1 << 26 {
        return Err(format!(
            "the interpreter's code at {buffer:#x}, {limit} bytes"
        ));
    }
    kernel.interp_lo = buffer;
    kernel.interp_hi = buffer + u64::from(limit);
    // The code heaps: CodeCache::_heaps, a GrowableArray<CodeHeap*>*.
    let heaps = mem
        .u64(t.address("CodeCache", "_heaps")?)
        .ok_or("CodeCache::_heaps unreadable")?;
    if heaps == 0 {
        return Ok(None);
    }
    let n = mem
        .u32(heaps + u64::from(array_len))
        .ok_or("the code heaps unreadable")?;
    let data = mem
        .u64(heaps + u64::from(array_data))
        .ok_or("the code heaps unreadable")?;
    if n == 0 {
        return Ok(None);
    }
    if n as usize > MAX_HEAPS {
        return Err(format!("{n} code heaps"));
    }
    for i in 0..n as usize {
        let heap = mem
            .u64(data + 8 * i as u64)
            .ok_or("a code heap unreadable")?;
        let vs = heap + u64::from(heap_memory);
        let read = |a: u64| mem.u64(a).ok_or("a code heap unreadable");
        kernel.heap_lo[i] = read(vs + u64::from(vs_low_boundary))?;
        kernel.heap_hi[i] = read(vs + u64::from(vs_high_boundary))?;
        kernel.segmap[i] = read(heap + u64::from(heap_segmap) + u64::from(vs_low))?;
        let shift = mem
            .u32(heap + u64::from(heap_shift))
            .ok_or("a code heap unreadable")?;
        if !(4..=16).contains(&shift) || kernel.heap_lo[i] >= kernel.heap_hi[i] {
            return Err(format!("code heap {i}: segment shift {shift}"));
        }
        kernel.seg_shift[i] = shift;
    }
    Ok(Some(Meta { kernel, ..meta }))
}

/// `pid`'s JVM tables, read through its `libjvm.so` mapping `m`; None
/// where the file or the process's memory cannot be opened.
fn tables_of(
    pid: u32,
    m: &crate::tracee::process::MapLine,
) -> Option<(Mem, Result<Tables, String>)> {
    let open = format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end);
    let data = object::ReadCache::new(File::open(&open).ok()?);
    let obj = object::File::parse(&data).ok()?;
    let syms = crate::tracee::symbols::dynamic_values(&obj, |n| n.starts_with(b"gHotSpotVM"));
    let mem = Mem::open(pid)?;
    // libjvm.so's segments are mapped at their file offsets.
    let base = m.start.wrapping_sub(m.offset);
    let sym = |name: &str| syms.get(name.as_bytes()).map(|v| base.wrapping_add(*v));
    let tables = read_tables(&mem, &sym);
    Some((mem, tables))
}

/// Processes running HotSpot, for naming.
static PROCS: Mutex<Option<HashMap<u32, Meta>>> = Mutex::new(None);

fn registered(pid: u32) -> Option<Meta> {
    PROCS.lock().ok()?.as_ref()?.get(&pid).copied()
}

/// What a method tells: its class, name, source file and line table.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Method {
    class: String,
    name: String,
    file: String,
    /// `(bci, line)`, as the class file gives them.
    lines: Vec<(u32, u32)>,
    code_size: u32,
}

impl Method {
    /// The line of bytecode index `bci`, as HotSpot's
    /// `Method::line_from_bci` finds it.
    fn line(&self, bci: u64) -> Option<u32> {
        if bci >= u64::from(self.code_size) {
            return None;
        }
        let mut best: Option<(u32, u32)> = None;
        for &(b, l) in &self.lines {
            if u64::from(b) == bci {
                return Some(l);
            }
            if u64::from(b) < bci && best.is_none_or(|(bb, _)| b >= bb) {
                best = Some((b, l));
            }
        }
        best.map(|(_, l)| l)
    }

    fn label(&self, bci: Option<u64>) -> String {
        let name = format!("{PREFIX}{}.{}", self.class, self.name);
        match (self.file.as_str(), bci.and_then(|b| self.line(b))) {
            ("", _) => name,
            (file, Some(line)) => format!("{name} ({file}:{line})"),
            (file, None) => format!("{name} ({file})"),
        }
    }
}

/// What a blob is: a compiled method's, or a stub by its name.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Blob {
    Method(u64, Option<Scopes>),
    Stub(String),
}

/// What a compiled method says of the methods inlined into it: its
/// `PcDesc`s (pc offset from its code, scope offset), its scopes'
/// stream and its metadata (the methods the scopes name).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Scopes {
    pcs: Vec<(u32, u32)>,
    data: Vec<u8>,
    metadata: Vec<u64>,
    /// Its UNSIGNED5's excluded bytes ([`Unsigned5`]).
    x: u8,
}

/// Most bytes of a compiled method's scopes read.
const MAX_SCOPES: u64 = 1 << 20;

impl Scopes {
    /// The (method, bci) of each scope at pc offset `off` from the code,
    /// innermost first, or None when no `PcDesc` covers it: a return
    /// address's is at the address itself (a call into the VM's leaf
    /// routines has none); a sampled pc's is the first at or after it, as
    /// HotSpot's approximate lookup finds it (`approximate`).
    fn at(&self, off: u32, approximate: bool) -> Option<Vec<(u64, u64)>> {
        let i = self.pcs.partition_point(|&(pc, _)| pc < off);
        let &(pc, mut scope) = self.pcs.get(i)?;
        if !approximate && pc != off {
            return None;
        }
        let mut out = Vec::new();
        // DebugInformationRecorder::serialized_null.
        while scope != 0 && out.len() < 64 {
            let mut r = Unsigned5 {
                bytes: self.data.get(scope as usize..)?,
                x: self.x,
            };
            let sender = r.next()?;
            let method = r.next()?;
            let bci = r.next()?.checked_sub(1);
            let m = *self.metadata.get((method as usize).checked_sub(1)?)?;
            out.push((m, bci.map_or(LOW_MAX, u64::from)));
            if sender >= scope {
                return None;
            }
            scope = sender;
        }
        (!out.is_empty()).then_some(out)
    }
}

/// HotSpot's `CompressedReadStream::read_int`: UNSIGNED5, one byte below
/// `L`, else up to five with 6 more bits each. From JDK 21 no byte is 0
/// (`X` = 1: each byte is its value plus 1, and `L` is 191), so that a 0
/// can end a stream; before, `X` is 0 and `L` 192.
struct Unsigned5<'a> {
    bytes: &'a [u8],
    x: u8,
}

impl Unsigned5<'_> {
    /// The next byte as it is.
    fn byte(&mut self) -> Option<u8> {
        let (&b, rest) = self.bytes.split_first()?;
        self.bytes = rest;
        Some(b)
    }

    fn next(&mut self) -> Option<u32> {
        let x = self.x;
        let low = 192 - u64::from(x);
        let b0 = self.byte()?.checked_sub(x)?;
        let mut sum = u64::from(b0);
        if sum < low {
            return u32::try_from(sum).ok();
        }
        let mut shift = 6;
        for i in 1..=4 {
            let b = u64::from(self.byte()?.checked_sub(x)?);
            sum += b << shift;
            if b < low || i == 4 {
                break;
            }
            shift += 6;
        }
        u32::try_from(sum).ok()
    }
}

/// Reads the inlining scopes of `nmethod` `blob`, or None when its
/// sections are not where its header says.
fn read_scopes(mem: &Mem, meta: &Meta, blob: u64) -> Option<Scopes> {
    let off = |field: u32| -> Option<u64> {
        let v = mem.u32(blob + u64::from(field))?;
        Some(blob + u64::from(v))
    };
    let metadata = off(meta.nmethod_metadata)?;
    let data = mem.u64(blob + u64::from(meta.compiled_scopes_data))?;
    let pcs = off(meta.nmethod_scopes_pcs)?;
    let deps = off(meta.nmethod_dependencies)?;
    if !(metadata <= data && data <= pcs && pcs <= deps && deps - metadata <= MAX_SCOPES) {
        return None;
    }
    let size = u64::from(meta.pc_desc_size).max(8);
    let raw = mem.bytes(pcs, (deps - pcs) as usize)?;
    let field = |c: &[u8], at: u32| -> Option<u32> {
        let b = c.get(at as usize..at as usize + 4)?;
        Some(u32::from_ne_bytes(b.try_into().ok()?))
    };
    let mut descs = Vec::new();
    for c in raw.chunks_exact(size as usize) {
        // The first is a sentinel at pc offset -1 (`lower_offset_limit`).
        let Ok(pc) = u32::try_from(field(c, meta.pc_desc_pc)? as i32) else {
            continue;
        };
        descs.push((pc, field(c, meta.pc_desc_scope)?));
    }
    if !descs.is_sorted_by_key(|d| d.0) {
        return None;
    }
    let metadata = mem
        .bytes(metadata, (data - metadata) as usize)?
        .chunks_exact(8)
        .map(|b| u64::from_ne_bytes(b.try_into().unwrap_or_default()))
        .collect();
    Some(Scopes {
        pcs: descs,
        data: mem.bytes(data, (pcs - data) as usize)?,
        metadata,
        x: meta.unsigned5_x,
    })
}

type Cache<T> = Mutex<Option<HashMap<(u32, u64), T>>>;
/// Methods read, by process and `Method*`.
static METHODS: Cache<Method> = Mutex::new(None);
/// Blobs read, by process and `CodeBlob*`.
static BLOBS: Cache<Blob> = Mutex::new(None);
/// Most methods (and blobs) kept; past it, they are read when named.
const MAX_KEPT: usize = 1 << 18;

fn cached<T: Clone>(cache: &Cache<T>, pid: u32, at: u64) -> Option<T> {
    cache.lock().ok()?.as_ref()?.get(&(pid, at)).cloned()
}

fn keep<T>(cache: &Cache<T>, pid: u32, at: u64, v: T) {
    if let Ok(mut g) = cache.lock() {
        let all = g.get_or_insert_with(HashMap::new);
        if all.len() < MAX_KEPT {
            all.insert((pid, at), v);
        }
    }
}

/// The text of `Symbol*` `sym`.
fn symbol(mem: &Mem, meta: &Meta, sym: u64) -> Option<String> {
    if sym == 0 {
        return None;
    }
    let len = mem.u16(sym + u64::from(meta.symbol_length))?;
    if len == 0 || len > 2048 {
        return None;
    }
    let bytes = mem.bytes(sym + u64::from(meta.symbol_body), usize::from(len))?;
    let text = String::from_utf8(bytes).ok()?;
    (!text.chars().any(char::is_control)).then_some(text)
}

/// The symbol at `index` of constant pool `cp`.
fn pool_symbol(mem: &Mem, meta: &Meta, cp: u64, index: u16) -> Option<String> {
    let len = mem.u32(cp + u64::from(meta.pool_length))?;
    if index == 0 || u32::from(index) >= len {
        return None;
    }
    let at = cp + u64::from(meta.pool_size) + 8 * u64::from(index);
    symbol(mem, meta, mem.u64(at)?)
}

/// Reads `Method*` `method`; None unless its class's constant pool and
/// the method's agree (a freed or foreign pointer).
fn read_method(mem: &Mem, meta: &Meta, method: u64) -> Option<Method> {
    let cm = mem.u64(method + u64::from(meta.kernel.method_const))?;
    let cp = mem.u64(cm + u64::from(meta.const_constants))?;
    let klass = mem.u64(cp + u64::from(meta.pool_holder))?;
    if cm == 0 || cp == 0 || klass == 0 {
        return None;
    }
    if mem.u64(klass + u64::from(meta.klass_constants))? != cp {
        return None;
    }
    let class = symbol(mem, meta, mem.u64(klass + u64::from(meta.klass_name))?)?.replace('/', ".");
    let name = pool_symbol(
        mem,
        meta,
        cp,
        mem.u16(cm + u64::from(meta.const_name_index))?,
    )?;
    let file = match meta.pool_source_file {
        at if at & SOURCE_IN_KLASS != 0 => mem.u16(klass + u64::from(at & !SOURCE_IN_KLASS)),
        at => mem.u16(cp + u64::from(at)),
    }
    .and_then(|i| pool_symbol(mem, meta, cp, i))
    .unwrap_or_default();
    let flags = mem.u16(cm + u64::from(meta.const_flags))?;
    let code_size = u32::from(mem.u16(cm + u64::from(meta.const_code_size))?);
    let lines = if flags & meta.has_line_table != 0 {
        let at = cm + u64::from(meta.kernel.const_method_size) + u64::from(code_size);
        read_lines(mem, at, meta.unsigned5_x).unwrap_or_default()
    } else {
        Vec::new()
    };
    Some(Method {
        class,
        name,
        file,
        lines,
        code_size,
    })
}

/// The compressed line-number table at `at`, read 256 bytes at a time.
fn read_lines(mem: &Mem, at: u64, x: u8) -> Option<Vec<(u32, u32)>> {
    let mut buf = Vec::new();
    loop {
        match decode_lines(&buf, x) {
            Some(pairs) => return Some(pairs),
            None if buf.len() >= 1 << 16 => return None,
            None => buf.extend(mem.bytes(at + buf.len() as u64, 256)?),
        }
    }
}

/// HotSpot's `CompressedLineNumberReadStream`: pairs of (bci, line)
/// deltas, one byte (`bci << 3 | line`) when both are small, else 0xff
/// and two signed UNSIGNED5 numbers; a 0 byte ends it. None: the bytes
/// end before it does.
fn decode_lines(bytes: &[u8], x: u8) -> Option<Vec<(u32, u32)>> {
    let mut r = Unsigned5 { bytes, x };
    let mut pairs = Vec::new();
    let (mut bci, mut line) = (0i64, 0i64);
    let signed = |u: u32| {
        let v = i64::from(u);
        (v >> 1) ^ -(v & 1)
    };
    loop {
        match r.byte()? {
            0 => return Some(pairs),
            0xff => {
                bci += signed(r.next()?);
                line += signed(r.next()?);
            }
            b => {
                bci += i64::from(b >> 3);
                line += i64::from(b & 7);
            }
        }
        pairs.push((u32::try_from(bci).ok()?, u32::try_from(line).ok()?));
    }
}

/// Reads blob `blob`: a compiled method's, or a stub's name.
fn read_blob(mem: &Mem, meta: &Meta, blob: u64) -> Option<Blob> {
    let name = cstr(mem, mem.u64(blob + u64::from(meta.blob_name))?)?;
    if name == "nmethod" || name == "native nmethod" {
        let m = mem.u64(blob + u64::from(meta.compiled_method))?;
        let scopes = (name == "nmethod")
            .then(|| read_scopes(mem, meta, blob))
            .flatten();
        return (m != 0).then_some(Blob::Method(m, scopes));
    }
    (!name.chars().any(char::is_control)).then_some(Blob::Stub(name))
}

/// The method `method` of `pid`, read now if it was not.
fn method(mem: &Mem, meta: &Meta, pid: u32, method: u64) -> Option<Method> {
    if let Some(m) = cached(&METHODS, pid, method) {
        return Some(m);
    }
    let m = read_method(mem, meta, method)?;
    keep(&METHODS, pid, method, m.clone());
    Some(m)
}

fn blob(mem: &Mem, meta: &Meta, pid: u32, at: u64) -> Option<Blob> {
    if let Some(b) = cached(&BLOBS, pid, at) {
        return Some(b);
    }
    let b = read_blob(mem, meta, at)?;
    keep(&BLOBS, pid, at, b.clone());
    Some(b)
}

/// Reads the methods and blobs of Java frame slots `slots` of `pid`
/// that were not read yet (told of by the kernel).
pub fn learn(pid: u32, slots: &[u64]) {
    let Some(meta) = registered(pid) else {
        return;
    };
    let Some(mem) = Mem::open(pid) else {
        return;
    };
    for &slot in slots {
        let (at, _, compiled) = common::decode(slot);
        if compiled {
            if let Some(Blob::Method(m, scopes)) = blob(&mem, &meta, pid, at) {
                method(&mem, &meta, pid, m);
                let inlined = scopes.iter().flat_map(|s| s.metadata.iter());
                for &m in inlined.filter(|&&m| m != 0).take(256) {
                    method(&mem, &meta, pid, m);
                }
            }
        } else {
            method(&mem, &meta, pid, at);
        }
    }
}

/// The frames of Java frame `slot` of `pid`, outermost first: one, or a
/// compiled method's with the methods inlined into it at its pc (suffixed
/// `_[i]`). None when `pid` is not known to run HotSpot.
pub fn name(pid: u32, slot: u64) -> Option<Vec<String>> {
    let meta = registered(pid)?;
    let (at, low, compiled) = common::decode(slot);
    let mem = Mem::open(pid);
    let read_method =
        |m: u64| cached(&METHODS, pid, m).or_else(|| method(mem.as_ref()?, &meta, pid, m));
    let bci = |b: u64| (b != LOW_MAX).then_some(b);
    if !compiled {
        return Some(vec![match read_method(at) {
            Some(m) => m.label(bci(low)),
            None => format!("{PREFIX}[unreadable method {at:#x}]"),
        }]);
    }
    let b = cached(&BLOBS, pid, at).or_else(|| blob(mem.as_ref()?, &meta, pid, at));
    let (m, scopes) = match b {
        Some(Blob::Method(m, scopes)) => (m, scopes),
        Some(Blob::Stub(s)) => return Some(vec![format!("{PREFIX}[{s}]")]),
        None => return Some(vec![format!("{PREFIX}[unreadable code {at:#x}]")]),
    };
    // The kernel keeps the offset of the return address, or of the
    // sampled pc; a clamped one is not looked up.
    let (off, leaf) = (low & OFFSET_MAX, low & LEAF != 0);
    let chain = scopes
        .filter(|_| off != OFFSET_MAX)
        .and_then(|s| s.at(off as u32, leaf))
        .filter(|c| c.last().is_some_and(|&(outer, _)| outer == m));
    let Some(chain) = chain else {
        return Some(vec![match read_method(m) {
            Some(m) => m.label(None),
            None => format!("{PREFIX}[unreadable method {m:#x}]"),
        }]);
    };
    let mut out = Vec::new();
    for (i, &(method, b)) in chain.iter().rev().enumerate() {
        let name = match read_method(method) {
            Some(m) => m.label(bci(b)),
            None => format!("{PREFIX}[unreadable method {method:#x}]"),
        };
        out.push(if i == 0 { name } else { format!("{name}_[i]") });
    }
    Some(out)
}

/// Finds HotSpot in processes and keeps the kernel's `HS_PROCS` current.
pub struct Hotspot {
    procs: BpfHash<MapData, u32, HsProc>,
    /// Processes whose JVM did not match (told once per binary).
    failed: HashSet<u32>,
    /// Processes whose JVM has not set its code heaps up yet.
    waiting: HashSet<u32>,
    told: Vec<String>,
}

impl Hotspot {
    /// Takes `HS_PROCS` out of `ebpf`. `PROFILER_JAVA_FRAMES=0` in the
    /// environment leaves it empty (for comparing costs).
    pub fn take(ebpf: &mut aya::Ebpf) -> crate::Result<Self> {
        use crate::Error;
        if std::env::var_os("PROFILER_JAVA_FRAMES").is_some_and(|v| v == "0") {
            return Err(Error::Load(
                "Java frames turned off by PROFILER_JAVA_FRAMES=0".into(),
            ));
        }
        let map = ebpf
            .take_map(common::HS_PROCS_MAP)
            .ok_or_else(|| Error::Load(format!("no {} map", common::HS_PROCS_MAP)))?;
        Ok(Hotspot {
            procs: BpfHash::try_from(map).map_err(|e| Error::Load(crate::error::chain(&e)))?,
            failed: HashSet::new(),
            waiting: HashSet::new(),
            told: Vec::new(),
        })
    }

    /// Looks for a JVM in `pid`'s executable mappings (`exec`, lines of
    /// `/proc/PID/maps`) and tells the kernel where its code is.
    pub fn add_process(&mut self, pid: u32, exec: &str) {
        let Some(m) = exec
            .lines()
            .filter_map(crate::tracee::process::parse_line)
            .find(|m| m.path.ends_with("/libjvm.so"))
        else {
            self.remove_process(pid);
            return;
        };
        if registered(pid).is_some() || self.failed.contains(&pid) {
            return;
        }
        let Some((mem, tables)) = tables_of(pid, &m) else {
            return;
        };
        let read = tables.and_then(|t| read_meta(&mem, &t));
        self.waiting.remove(&pid);
        match read {
            Ok(Some(meta)) => {
                if self.procs.insert(pid, meta.kernel, 0).is_ok() {
                    if let Ok(mut g) = PROCS.lock() {
                        g.get_or_insert_with(HashMap::new).insert(pid, meta);
                    }
                }
            }
            Ok(None) => {
                self.waiting.insert(pid);
            }
            Err(why) => {
                self.failed.insert(pid);
                if !self.told.contains(&m.path) {
                    self.told.push(m.path.clone());
                    eprintln!(
                        "profiler: note: {} (PID {pid}) runs HotSpot, but its structures do \
                         not match what the profiler reads ({why}); its Java frames stay native \
                         addresses",
                        m.path
                    );
                }
            }
        }
    }

    /// Whether `pid` runs a JVM not read yet (its code heaps were not
    /// set up when its mappings were last read).
    pub fn pending(&self, pid: u32) -> bool {
        self.waiting.contains(&pid)
    }

    /// Forgets `pid` in the kernel (its names stay, for its samples).
    pub fn remove_process(&mut self, pid: u32) {
        let _ = self.procs.remove(&pid);
        self.waiting.remove(&pid);
        self.failed.remove(&pid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_are_found_exactly_at_return_addresses_and_after_a_sampled_pc() {
        // Two scopes at pc offset 0x40: `inner` (metadata 2, bci 5)
        // inlined into `outer` (metadata 1, bci 9); one at 0x80.
        let data = vec![0, 0, 1, 10, 1, 2, 6, 0, 1, 3];
        let s = Scopes {
            pcs: vec![(0x40, 4), (0x80, 7)],
            data,
            metadata: vec![0x1000, 0x2000],
            x: 0,
        };
        assert_eq!(s.at(0x40, false), Some(vec![(0x2000, 5), (0x1000, 9)]));
        assert_eq!(s.at(0x30, false), None);
        assert_eq!(s.at(0x30, true), Some(vec![(0x2000, 5), (0x1000, 9)]));
        assert_eq!(s.at(0x41, true), Some(vec![(0x1000, 2)]));
        assert_eq!(s.at(0x81, true), None);
        let mut u = Unsigned5 {
            bytes: &[191, 232, 1],
            x: 0,
        };
        assert_eq!((u.next(), u.next(), u.next()), (Some(191), Some(296), None));
        // JDK 21's: each byte one more, 191 low values; no byte is 0.
        let mut u = Unsigned5 {
            bytes: &[191, 192, 233, 2, 0],
            x: 1,
        };
        assert_eq!(
            (u.next(), u.next(), u.next(), u.next()),
            (Some(190), Some(191 + (232 << 6) + (1 << 12)), None, None)
        );
    }

    #[test]
    fn line_tables_decode_as_hotspot_writes_them() {
        // (0, 3), (4, 5): one byte each; then (300, 1000): 0xff with
        // signed UNSIGNED5 deltas 296 and 995; before JDK 21 (`x` 0) and
        // after (`x` 1: each byte one more, 191 low values), as
        // HotSpot's `write_signed_int` writes them: zigzag, then UNSIGNED5.
        for x in [0u8, 1] {
            let low = 192 - u64::from(x);
            let mut bytes = vec![3, (4 << 3) | 2, 0xff];
            for v in [296i64, 995] {
                let mut sum = ((v << 1) ^ (v >> 63)) as u64;
                let mut i = 0;
                while sum >= low && i < 4 {
                    sum -= low;
                    bytes.push((low + u64::from(x) + sum % 64) as u8);
                    sum >>= 6;
                    i += 1;
                }
                bytes.push((sum + u64::from(x)) as u8);
            }
            bytes.push(0);
            assert_eq!(
                decode_lines(&bytes, x),
                Some(vec![(0, 3), (4, 5), (300, 1000)]),
                "x {x}: {bytes:?}"
            );
            assert_eq!(decode_lines(&[3, 9], x), None);
        }
        // JDK 21's, as read from a JVM: line 15 at bci 0 (0xff, then 0
        // and 30 each written one more), line 16 at bci 4.
        assert_eq!(
            decode_lines(&[255, 1, 31, 33, 0], 1),
            Some(vec![(0, 15), (4, 16)])
        );
        let m = Method {
            class: "a.B".into(),
            name: "c".into(),
            file: "B.java".into(),
            lines: vec![(0, 10), (4, 11), (9, 13)],
            code_size: 12,
        };
        assert_eq!(m.line(0), Some(10));
        assert_eq!(m.line(5), Some(11));
        assert_eq!(m.line(11), Some(13));
        assert_eq!(m.line(12), None);
        assert_eq!(m.label(Some(5)), "java:a.B.c (B.java:11)");
        assert_eq!(m.label(None), "java:a.B.c (B.java)");
    }
}
