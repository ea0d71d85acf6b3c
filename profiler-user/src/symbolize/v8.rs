//! V8 frames (node): finds the processes that run V8 (a mapped binary
//! exporting V8's postmortem metadata, the `v8dbg_*` symbols), tells the
//! kernel how to tell a JavaScript frame (`V8_PROCS`), and names the
//! frames it found (`JS:name file:line:column`, the perf map's names
//! without the tier) from each function's `SharedFunctionInfo`, read
//! through `/proc/PID/mem`.
//!
//! Every offset and instance type comes from the binary's own metadata,
//! read from its file; a binary that lacks one gets one line on stderr
//! and keeps the names it had (perf maps, addresses). What the metadata
//! does not describe is taken from V8's sources, by version: how many
//! instance types mark a function (15 since V8 9.6.138), where a
//! `ScopeInfo` keeps the function's name and source position (a scan of
//! its first slots before V8 12.8.44, fixed slots since), and where an
//! external string caches its characters.
//!
//! A function is read when the kernel first stores a stack holding it (a
//! notice in `PY_NEWS`, shared with Python's code objects) and kept: a
//! process that exits takes its heap along. The garbage collector may move
//! a `SharedFunctionInfo`; the address read is checked to still hold one,
//! but one moved away and another moved in between the sample and the
//! read is named as the newcomer.
use std::{collections::HashMap, fs::File, sync::Mutex};

use aya::maps::{HashMap as BpfHash, MapData};
use object::{Object, ObjectSection};
use profiler_common::v8::{self as common, V8Proc};

use super::proc_mem::Mem;
use crate::tracee::process::FileKey;

/// Prefix of a JavaScript frame's name (the perf map's).
pub const PREFIX: &str = "JS:";

/// What V8's metadata says of the objects the namer reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta {
    pub version: (u32, u32, u32),
    pub kernel: V8Proc,
    scope_info_type: u16,
    script_type: u16,
    fixed_array_type: u16,
    first_nonstring_type: u16,
    shared_name_or_scope_info: u32,
    shared_script_or_debug_info: u32,
    script_name: u32,
    script_source: u32,
    script_line_ends: u32,
    scope_first_vars: u32,
    scope_context_locals: u32,
    string_length: u32,
    repr_mask: u16,
    encoding_mask: u16,
    seq_tag: u16,
    cons_tag: u16,
    external_tag: u16,
    sliced_tag: u16,
    thin_tag: u16,
    one_byte_tag: u16,
    one_byte_chars: u32,
    two_byte_chars: u32,
    cons_first: u32,
    cons_second: u32,
    thin_actual: u32,
    sliced_parent: u32,
    sliced_offset: u32,
    external_resource: u32,
    array_length: u32,
    array_data: u32,
    /// Frame type (a marker's value) -> index in [`FRAME_TYPES`] + 1.
    frame_types: [u8; 64],
}

/// The frame types a marker in JIT memory may name, as the metadata
/// spells them (`v8dbg_frametype_*`).
const FRAME_TYPES: [&str; 6] = [
    "IrregexpFrame",
    "StubFrame",
    "TurbofanStubWithContextFrame",
    "InternalFrame",
    "BuiltinFrame",
    "NativeFrame",
];

/// Reads the metadata from a binary's symbols and data, or says which
/// symbol is missing. `Ok(None)`: the binary has no V8 in it.
fn read_meta(open: &str) -> Result<Option<Meta>, String> {
    let file = File::open(open).map_err(|e| e.to_string())?;
    let data = object::ReadCache::new(file);
    let obj = object::File::parse(&data).map_err(|e| e.to_string())?;
    // node exports its metadata; a binary without it in its dynamic
    // symbols (every library of a process) is not read further.
    let syms = crate::tracee::symbols::dynamic_values(&obj, |name| {
        name.starts_with(b"v8dbg_") || name.starts_with(b"_ZN2v88internal7Version6")
    });
    if !syms.contains_key(&b"v8dbg_off_fp_function"[..]) {
        return Ok(None);
    }
    // A symbol's value: a 32-bit int in the binary's data (0 in .bss).
    let value = |name: &str| -> Result<i64, String> {
        let addr = *syms
            .get(name.as_bytes())
            .ok_or_else(|| format!("no {name}"))?;
        for sec in obj.sections() {
            let (start, size) = (sec.address(), sec.size());
            if addr >= start && addr + 4 <= start + size {
                if sec.kind() == object::SectionKind::UninitializedData {
                    return Ok(0);
                }
                let bytes = sec.data_range(addr, 4).ok().flatten();
                return match bytes {
                    Some(b) => Ok(i64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]]))),
                    None => Err(format!("{name} unreadable")),
                };
            }
        }
        Err(format!("{name} in no section"))
    };
    let u = |name: &str| -> Result<u32, String> {
        let v = value(name)?;
        u32::try_from(v).map_err(|_| format!("{name} = {v}"))
    };
    let t = |name: &str| -> Result<u16, String> {
        let v = value(name)?;
        u16::try_from(v).map_err(|_| format!("{name} = {v}"))
    };
    let below = |name: &str| -> Result<u32, String> {
        let v = value(name)?;
        match u32::try_from(-v) {
            Ok(d) if d > 0 && d % 8 == 0 && d <= 64 => Ok(d),
            _ => Err(format!("{name} = {v}")),
        }
    };
    let version = (
        u("_ZN2v88internal7Version6major_E")?,
        u("_ZN2v88internal7Version6minor_E")?,
        u("_ZN2v88internal7Version6build_E")?,
    );
    let function_type = t("v8dbg_type_JSFunction__JS_FUNCTION_TYPE")?;
    // JSFunction has subclasses (constructors of builtins), whose types
    // follow its own: V8 9.0.14 added 13, 9.6.138 one more.
    let functions = match version {
        v if v >= (9, 6, 138) => 15,
        v if v >= (9, 0, 14) => 14,
        _ => 1,
    };
    for (name, want) in [
        ("v8dbg_SmiTagMask", 1),
        ("v8dbg_HeapObjectTag", 1),
        ("v8dbg_HeapObjectTagMask", 3),
        ("v8dbg_TaggedSize", 8),
        ("v8dbg_SmiShiftSize", 31),
    ] {
        let got = value(name)?;
        if got != want {
            return Err(format!("{name} = {got}, not {want}"));
        }
    }
    let mut frame_types = [0u8; 64];
    for (i, name) in FRAME_TYPES.iter().enumerate() {
        if let Ok(v) = u(&format!("v8dbg_frametype_{name}")) {
            if let Some(slot) = frame_types.get_mut(v as usize) {
                *slot = i as u8 + 1;
            }
        }
    }
    Ok(Some(Meta {
        frame_types,
        version,
        kernel: V8Proc {
            fp_marker: below("v8dbg_off_fp_context_or_frame_type")?,
            fp_function: below("v8dbg_off_fp_function")?,
            heap_map: u("v8dbg_class_HeapObject__map__Map")?,
            map_instance_type: u("v8dbg_class_Map__instance_type__uint16_t")?,
            function_shared: u("v8dbg_class_JSFunction__shared__SharedFunctionInfo")?,
            function_first: u32::from(function_type),
            function_last: u32::from(function_type) + functions - 1,
            shared_type: u32::from(t(
                "v8dbg_type_SharedFunctionInfo__SHARED_FUNCTION_INFO_TYPE",
            )?),
        },
        scope_info_type: t("v8dbg_type_ScopeInfo__SCOPE_INFO_TYPE")?,
        script_type: t("v8dbg_type_Script__SCRIPT_TYPE")?,
        fixed_array_type: t("v8dbg_type_FixedArray__FIXED_ARRAY_TYPE")?,
        first_nonstring_type: t("v8dbg_FirstNonstringType")?,
        shared_name_or_scope_info: u("v8dbg_class_SharedFunctionInfo__name_or_scope_info__Object")?,
        shared_script_or_debug_info: u(
            "v8dbg_class_SharedFunctionInfo__script_or_debug_info__HeapObject",
        )?,
        script_name: u("v8dbg_class_Script__name__Object")?,
        script_source: u("v8dbg_class_Script__source__Object")?,
        script_line_ends: u("v8dbg_class_Script__line_ends__Object")?,
        scope_first_vars: u("v8dbg_scopeinfo_idx_first_vars")?,
        scope_context_locals: u("v8dbg_scopeinfo_idx_ncontextlocals")?,
        string_length: u("v8dbg_class_String__length__int32_t")?,
        repr_mask: t("v8dbg_StringRepresentationMask")?,
        encoding_mask: t("v8dbg_StringEncodingMask")?,
        seq_tag: t("v8dbg_SeqStringTag")?,
        cons_tag: t("v8dbg_ConsStringTag")?,
        external_tag: t("v8dbg_ExternalStringTag")?,
        sliced_tag: t("v8dbg_SlicedStringTag")?,
        thin_tag: t("v8dbg_ThinStringTag")?,
        one_byte_tag: t("v8dbg_OneByteStringTag")?,
        one_byte_chars: u("v8dbg_class_SeqOneByteString__chars__char")?,
        two_byte_chars: u("v8dbg_class_SeqTwoByteString__chars__char")?,
        cons_first: u("v8dbg_class_ConsString__first__String")?,
        cons_second: u("v8dbg_class_ConsString__second__String")?,
        thin_actual: u("v8dbg_class_ThinString__actual__String")?,
        sliced_parent: u("v8dbg_class_SlicedString__parent__String")?,
        sliced_offset: u("v8dbg_class_SlicedString__offset__SMI")?,
        external_resource: u("v8dbg_class_ExternalString__resource__Object")?,
        array_length: u("v8dbg_class_FixedArrayBase__length__SMI")?,
        array_data: u("v8dbg_class_FixedArray__data__uintptr_t")?,
    }))
}

/// Processes running V8, for naming.
static PROCS: Mutex<Option<HashMap<u32, Meta>>> = Mutex::new(None);

fn registered(pid: u32) -> Option<Meta> {
    PROCS.lock().ok()?.as_ref()?.get(&pid).copied()
}

/// What one function tells: its name and where it starts.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Function {
    name: String,
    /// `file:line:column`, or the file alone, or nothing.
    place: String,
}

impl Function {
    fn label(&self) -> String {
        let name = if self.name.is_empty() {
            "(anonymous)"
        } else {
            &self.name
        };
        match self.place.as_str() {
            "" => format!("{PREFIX}{name}"),
            // A script without a name (`eval`, `new Function`).
            place if place.starts_with(':') => format!("{PREFIX}{name} [no file]{place}"),
            place => format!("{PREFIX}{name} {place}"),
        }
    }
}

/// Functions read, by process and `SharedFunctionInfo` address.
static FUNCTIONS: Mutex<Option<HashMap<(u32, u64), Function>>> = Mutex::new(None);
/// Most functions kept; past it, they are read when named.
const MAX_FUNCTIONS: usize = 1 << 18;
/// Scripts' line ends (and names), by process and `Script` address.
type Scripts = HashMap<(u32, u64), (String, Option<Vec<u32>>)>;
static SCRIPTS: Mutex<Option<Scripts>> = Mutex::new(None);

fn cached(pid: u32, shared: u64) -> Option<String> {
    Some(
        FUNCTIONS
            .lock()
            .ok()?
            .as_ref()?
            .get(&(pid, shared))?
            .label(),
    )
}

fn keep(pid: u32, shared: u64, f: Function) {
    if let Ok(mut g) = FUNCTIONS.lock() {
        let all = g.get_or_insert_with(HashMap::new);
        if all.len() < MAX_FUNCTIONS {
            all.insert((pid, shared), f);
        }
    }
}

/// Finds V8 in processes and keeps the kernel's `V8_PROCS` current.
pub struct V8 {
    procs: BpfHash<MapData, u32, V8Proc>,
    /// Each binary read, by identity: its metadata if it holds V8.
    files: HashMap<FileKey, Option<Meta>>,
    /// Binaries already said to lack metadata.
    told: Vec<String>,
}

impl V8 {
    /// Takes `V8_PROCS` out of `ebpf`. `PROFILER_JS_FRAMES=0` in the
    /// environment leaves it empty (for comparing costs).
    pub fn take(ebpf: &mut aya::Ebpf) -> crate::Result<Self> {
        use crate::Error;
        if std::env::var_os("PROFILER_JS_FRAMES").is_some_and(|v| v == "0") {
            return Err(Error::Load(
                "JavaScript frames turned off by PROFILER_JS_FRAMES=0".into(),
            ));
        }
        let map = ebpf
            .take_map(common::V8_PROCS_MAP)
            .ok_or_else(|| Error::Load(format!("no {} map", common::V8_PROCS_MAP)))?;
        Ok(V8 {
            procs: BpfHash::try_from(map).map_err(|e| Error::Load(crate::error::chain(&e)))?,
            files: HashMap::new(),
            told: Vec::new(),
        })
    }

    /// Looks for V8 in `pid`'s executable mappings (`exec`, lines of
    /// `/proc/PID/maps`) and tells the kernel how its frames look.
    pub fn add_process(&mut self, pid: u32, exec: &str) {
        for m in exec.lines().filter_map(crate::tracee::process::parse_line) {
            let open = format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end);
            let Ok(meta) = std::fs::metadata(&open) else {
                continue;
            };
            let key = FileKey::new(&meta);
            let read = match self.files.get(&key) {
                Some(read) => *read,
                None => {
                    let read = match read_meta(&open) {
                        Ok(read) => read,
                        Err(why) => {
                            if !self.told.contains(&m.path) {
                                self.told.push(m.path.clone());
                                eprintln!(
                                    "profiler: note: {} (PID {pid}) runs V8, but its metadata \
                                     does not match what the profiler reads ({why}); its \
                                     JavaScript frames keep the perf map's names or addresses",
                                    m.path
                                );
                            }
                            None
                        }
                    };
                    self.files.insert(key, read);
                    read
                }
            };
            let Some(meta) = read else { continue };
            if self.procs.insert(pid, meta.kernel, 0).is_ok() {
                if let Ok(mut g) = PROCS.lock() {
                    g.get_or_insert_with(HashMap::new).insert(pid, meta);
                }
            }
            return;
        }
        self.remove_process(pid);
    }

    /// Forgets `pid` in the kernel (its names stay, for its samples).
    pub fn remove_process(&mut self, pid: u32) {
        let _ = self.procs.remove(&pid);
    }
}

/// Reads the functions of JavaScript frame slots `slots` of `pid` that
/// were not read yet (told of by the kernel).
pub fn learn(pid: u32, slots: &[u64]) {
    let Some(meta) = registered(pid) else {
        return;
    };
    let mut mem = None;
    for &slot in slots {
        let shared = common::decode(slot);
        if cached(pid, shared).is_some() {
            continue;
        }
        let mem = match &mem {
            Some(m) => m,
            None => match Mem::open(pid) {
                Some(m) => mem.insert(m),
                None => return,
            },
        };
        if let Some(f) = read_function(mem, &meta, pid, shared) {
            keep(pid, shared, f);
        }
    }
}

/// The name of JavaScript frame `slot` of `pid`. None when `pid` is not
/// known to run V8.
pub fn name(pid: u32, slot: u64) -> Option<String> {
    let meta = registered(pid)?;
    if let Some(t) = common::marker(slot) {
        let known = meta.frame_types.get(t as usize).copied().unwrap_or(0);
        return Some(match FRAME_TYPES.get((known as usize).wrapping_sub(1)) {
            Some(&"IrregexpFrame") => format!("{PREFIX}[regular expression code]"),
            Some(name) => format!("{PREFIX}[V8 {}]", name.trim_end_matches("Frame")),
            None => format!("{PREFIX}[V8 frame type {t}]"),
        });
    }
    let shared = common::decode(slot);
    if let Some(name) = cached(pid, shared) {
        return Some(name);
    }
    let Some(mem) = Mem::open(pid) else {
        return Some(format!("{PREFIX}[exited before its function was read]"));
    };
    Some(match read_function(&mem, &meta, pid, shared) {
        Some(f) => {
            let label = f.label();
            keep(pid, shared, f);
            label
        }
        None => format!("{PREFIX}[moved or freed function {shared:#x}]"),
    })
}

/// The heap object a tagged word at `addr` points at, with its type.
fn object(mem: &Mem, meta: &Meta, addr: u64) -> Option<(u64, u16)> {
    let obj = heap_object(mem.u64(addr)?)?;
    Some((obj, type_of(mem, meta, obj)?))
}

fn type_of(mem: &Mem, meta: &Meta, obj: u64) -> Option<u16> {
    let map = heap_object(mem.u64(obj + u64::from(meta.kernel.heap_map))?)?;
    mem.u16(map + u64::from(meta.kernel.map_instance_type))
}

/// The text of string `obj` (of type `ty`), at most `limit` bytes.
fn string(mem: &Mem, meta: &Meta, obj: u64, ty: u16, limit: usize, depth: u32) -> Option<String> {
    if ty >= meta.first_nonstring_type || depth == 0 {
        return None;
    }
    let len = (mem.u32(obj + u64::from(meta.string_length))? as usize).min(limit);
    let one_byte = ty & meta.encoding_mask == meta.one_byte_tag;
    let repr = ty & meta.repr_mask;
    let chars = |at: u64| -> Option<String> {
        if one_byte {
            Some(mem.bytes(at, len)?.iter().map(|&b| char::from(b)).collect())
        } else {
            let b = mem.bytes(at, len * 2)?;
            let units: Vec<u16> = b
                .chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]))
                .collect();
            Some(String::from_utf16_lossy(&units))
        }
    };
    if repr == meta.seq_tag {
        let at = if one_byte {
            meta.one_byte_chars
        } else {
            meta.two_byte_chars
        };
        chars(obj + u64::from(at))
    } else if repr == meta.cons_tag {
        let (a, at) = object(mem, meta, obj + u64::from(meta.cons_first))?;
        let first = string(mem, meta, a, at, limit, depth - 1)?;
        let (b, bt) = object(mem, meta, obj + u64::from(meta.cons_second))?;
        let rest = limit.saturating_sub(first.len());
        Some(first + &string(mem, meta, b, bt, rest, depth - 1)?)
    } else if repr == meta.thin_tag {
        let (a, at) = object(mem, meta, obj + u64::from(meta.thin_actual))?;
        string(mem, meta, a, at, limit, depth - 1)
    } else if repr == meta.sliced_tag {
        let (p, pt) = object(mem, meta, obj + u64::from(meta.sliced_parent))?;
        let offset = smi(mem.u64(obj + u64::from(meta.sliced_offset))?)? as usize;
        let whole = string(mem, meta, p, pt, offset + len, depth - 1)?;
        Some(whole.chars().skip(offset).take(len).collect())
    } else if repr == meta.external_tag {
        // The characters' address, cached beside the resource (V8's
        // ExternalString::kResourceDataOffset).
        let data = mem.u64(obj + u64::from(meta.external_resource) + 8)?;
        (data != 0).then_some(())?;
        chars(data)
    } else {
        None
    }
}

fn heap_object(word: u64) -> Option<u64> {
    (word & 3 == 1).then_some(word & !3)
}

/// A small integer's value (in the upper half of the word).
fn smi(word: u64) -> Option<i64> {
    (word & 1 == 0).then_some((word as i64) >> 32)
}

/// Longest name read.
const MAX_NAME: usize = 256;
/// Longest script source read to find its lines.
const MAX_SOURCE: usize = 16 << 20;

fn read_function(mem: &Mem, meta: &Meta, pid: u32, shared: u64) -> Option<Function> {
    if u32::from(type_of(mem, meta, shared)?) != meta.kernel.shared_type {
        return None;
    }
    let (nos, nos_type) = object(
        mem,
        meta,
        shared + u64::from(meta.shared_name_or_scope_info),
    )?;
    let (name, start) = if nos_type == meta.scope_info_type {
        scope_info(mem, meta, nos)
    } else {
        let name = string(mem, meta, nos, nos_type, MAX_NAME, 8);
        (name.unwrap_or_default(), None)
    };
    let name = crate::symbolize::perfmap::clean_name(name.as_bytes());
    let mut place = String::new();
    if let Some((script, ty)) = object(
        mem,
        meta,
        shared + u64::from(meta.shared_script_or_debug_info),
    ) {
        if ty == meta.script_type {
            let (file, ends) = script_lines(mem, meta, pid, script);
            place = file;
            if let (Some(start), Some(ends)) = (start, ends) {
                if let Some((line, col)) = line_and_column(&ends, start) {
                    place = format!("{place}:{line}:{col}");
                }
            }
        }
    }
    Some(Function { name, place })
}

/// The function's name and start position from its `ScopeInfo`.
fn scope_info(mem: &Mem, meta: &Meta, obj: u64) -> (String, Option<u32>) {
    const SLOTS: usize = 16;
    // The slots follow the map (ScopeInfo is no FixedArray since 9.1.71).
    let base = obj + u64::from(meta.kernel.heap_map) + 8;
    let Some(raw) = mem.bytes(base, SLOTS * 8) else {
        return (String::new(), None);
    };
    let slot = |i: usize| u64::from_ne_bytes(raw[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
    let fixed_positions = meta.version >= (12, 8, 44);
    let locals = smi(slot(meta.scope_context_locals as usize))
        .unwrap_or(0)
        .max(0) as usize;
    let mut name = String::new();
    let mut prev = 1u64;
    for i in (meta.scope_first_vars as usize + 2 * locals)..SLOTS {
        let cur = slot(i);
        if name.is_empty() {
            if let Some(obj) = heap_object(cur) {
                if let Some(ty) = type_of(mem, meta, obj) {
                    name = string(mem, meta, obj, ty, MAX_NAME, 8).unwrap_or_default();
                }
            }
        }
        if fixed_positions && !name.is_empty() {
            break;
        }
        // Before 12.8.44: the first two small integers in a row, rising,
        // after the name are the start and end positions.
        if !fixed_positions {
            if let (Some(a), Some(b)) = (smi(prev), smi(cur)) {
                if a < b && a >= 0 {
                    return (name, Some(a as u32));
                }
            }
        }
        prev = cur;
    }
    if fixed_positions {
        return (name, smi(slot(3)).and_then(|s| u32::try_from(s).ok()));
    }
    (name, None)
}

/// A script's name, and where its lines end (from `line_ends` when V8
/// computed them, else from its source), cached per script.
fn script_lines(mem: &Mem, meta: &Meta, pid: u32, script: u64) -> (String, Option<Vec<u32>>) {
    if let Some(hit) = SCRIPTS
        .lock()
        .ok()
        .and_then(|g| g.as_ref()?.get(&(pid, script)).cloned())
    {
        return hit;
    }
    let name = object(mem, meta, script + u64::from(meta.script_name))
        .and_then(|(o, t)| string(mem, meta, o, t, 4096, 8))
        .unwrap_or_default();
    let name = crate::symbolize::perfmap::clean_name(name.as_bytes());
    let mut ends = None;
    if let Some((arr, ty)) = object(mem, meta, script + u64::from(meta.script_line_ends)) {
        if ty == meta.fixed_array_type {
            let n = mem
                .u64(arr + u64::from(meta.array_length))
                .and_then(smi)
                .unwrap_or(0)
                .clamp(0, 1 << 22) as usize;
            if let Some(raw) = mem.bytes(arr + u64::from(meta.array_data), n * 8) {
                ends = raw
                    .chunks_exact(8)
                    .map(|c| smi(u64::from_ne_bytes(c.try_into().unwrap_or([1; 8]))))
                    .map(|v| v.and_then(|v| u32::try_from(v).ok()))
                    .collect();
            }
        }
    }
    if ends.is_none() {
        ends = object(mem, meta, script + u64::from(meta.script_source))
            .and_then(|(o, t)| string(mem, meta, o, t, MAX_SOURCE, 16))
            .map(|src| line_ends(&src));
    }
    let out = (name, ends);
    if let Ok(mut g) = SCRIPTS.lock() {
        g.get_or_insert_with(HashMap::new)
            .insert((pid, script), out.clone());
    }
    out
}

/// Positions (in characters) of each line's end in `src`.
fn line_ends(src: &str) -> Vec<u32> {
    src.chars()
        .enumerate()
        .filter(|&(_, c)| c == '\n')
        .map(|(i, _)| i as u32)
        .collect()
}

/// The 1-based line and column of position `pos`.
pub fn line_and_column(ends: &[u32], pos: u32) -> Option<(u32, u32)> {
    let line = ends.partition_point(|&e| e < pos);
    let start = match line {
        0 => 0,
        l => ends.get(l - 1)? + 1,
    };
    Some((line as u32 + 1, pos.checked_sub(start)? + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_become_lines_and_columns_as_the_perf_map_gives_them() {
        let src = "function slowHandler(n){ }\nconst f = () => 1;\n";
        let ends = line_ends(src);
        assert_eq!(ends, vec![26, 45]);
        // `(` of `slowHandler(`: the perf map's `…:1:21`.
        assert_eq!(line_and_column(&ends, 20), Some((1, 21)));
        // `(` of `() =>` on line 2: `…:2:11`.
        assert_eq!(line_and_column(&ends, 37), Some((2, 11)));
        assert_eq!(line_and_column(&ends, 100), Some((3, 55)));
    }

    #[test]
    fn node_on_this_machine_has_the_metadata_read() {
        let Ok(node) = std::fs::canonicalize("/usr/bin/node") else {
            return;
        };
        let meta = read_meta(node.to_str().unwrap())
            .expect("metadata matches")
            .expect("node holds V8");
        assert_eq!((meta.kernel.fp_marker, meta.kernel.fp_function), (8, 16));
        assert!(meta.version >= (10, 0, 0), "{:?}", meta.version);
        assert!(meta.kernel.function_last > meta.kernel.function_first);
        assert_eq!(read_meta("/bin/sh"), Ok(None));
    }
}
