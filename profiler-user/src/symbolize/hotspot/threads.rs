//! The JVM's own names of its threads: Linux keeps 15 characters of a
//! thread's name (`AWT-EventQueue-0` is `AWT-EventQueue-` in
//! `/proc/PID/task/TID/comm`, and `pool-1-thread-1` and `pool-1-thread-12`
//! are one name there), while each `java.lang.Thread` keeps all of it.
//!
//! Read from the live process, as the frames are: the VM's list of Java
//! threads (`ThreadsSMRSupport::_java_thread_list`), each one's OS thread
//! ID and `Thread` object, its `name` field found in `java.lang.Thread`'s
//! field table (the offset is not in `gHotSpotVMStructs`), and the
//! `String`'s bytes (Latin-1 or UTF-16 by its `coder`), with compressed
//! oops and class pointers decoded as the VM's flags say.
use super::{pool_symbol, read_meta, tables_of, Meta, Tables};
use crate::symbolize::proc_mem::Mem;

/// Most threads read from one list.
const MAX_THREADS: u32 = 100_000;
/// Longest name kept (characters).
const MAX_NAME: u32 = 1024;

/// How to read a Java object's reference fields and arrays.
struct Oops {
    /// `UseCompressedOops`: a reference field is a 32-bit narrow oop,
    /// `base + (narrow << shift)`.
    compressed: Option<(u64, u32)>,
    /// An array's length, and its first element, from its start.
    array_length: u64,
    array_base: u64,
}

impl Oops {
    fn read(mem: &Mem, t: &Tables) -> Result<Oops, String> {
        let flag = |name: &str| flag(mem, t, name);
        let compressed = if flag("UseCompressedOops")? {
            let base = mem
                .u64(t.address("CompressedOops", "_narrow_oop._base")?)
                .ok_or("the compressed oops' base unreadable")?;
            let shift = mem
                .u32(t.address("CompressedOops", "_narrow_oop._shift")?)
                .ok_or("the compressed oops' shift unreadable")?;
            if shift > 5 {
                return Err(format!("compressed oops shifted by {shift}"));
            }
            Some((base, shift))
        } else {
            None
        };
        // An array's header: the mark word, the class pointer (4 bytes
        // when compressed), the length; the elements from the next word.
        let array_length = if flag("UseCompressedClassPointers")? {
            12
        } else {
            16
        };
        Ok(Oops {
            compressed,
            array_length,
            array_base: (array_length + 4).next_multiple_of(8),
        })
    }

    /// The reference field at `off` of object `obj` (0: null).
    fn field(&self, mem: &Mem, obj: u64, off: u64) -> Option<u64> {
        match self.compressed {
            Some((base, shift)) => {
                let narrow = mem.u32(obj + off)?;
                Some(if narrow == 0 {
                    0
                } else {
                    base + (u64::from(narrow) << shift)
                })
            }
            None => mem.u64(obj + off),
        }
    }
}

/// The boolean VM flag `name` (`JVMFlag::flags`).
fn flag(mem: &Mem, t: &Tables, name: &str) -> Result<bool, String> {
    let flags = mem
        .u64(t.address("JVMFlag", "flags")?)
        .ok_or("the VM's flags unreadable")?;
    let count = mem
        .u64(t.address("JVMFlag", "numFlags")?)
        .ok_or("the VM's flags unreadable")?;
    let size = u64::from(t.size("JVMFlag")?);
    let (name_at, addr_at) = (
        u64::from(t.off("JVMFlag", "_name", "const char*")?),
        u64::from(t.off("JVMFlag", "_addr", "")?),
    );
    for i in 0..count.min(10_000) {
        let f = flags + i * size;
        let Some(n) = mem.u64(f + name_at) else {
            continue;
        };
        if super::cstr(mem, n).as_deref() == Some(name) {
            let addr = mem.u64(f + addr_at).ok_or("a VM flag unreadable")?;
            let v = mem.bytes(addr, 1).ok_or("a VM flag unreadable")?;
            return Ok(v[0] != 0);
        }
    }
    Err(format!("no flag {name}"))
}

/// The offset of instance field `want` of class `klass` (an
/// `InstanceKlass*`), from its field table.
fn field_offset(mem: &Mem, t: &Tables, meta: &Meta, klass: u64, want: &str) -> Result<u64, String> {
    let unreadable = || format!("{want}'s class unreadable");
    let fields = mem
        .u64(klass + u64::from(t.off("InstanceKlass", "_fields", "Array<u2>*")?))
        .ok_or_else(unreadable)?;
    let count = mem
        .u16(klass + u64::from(t.off("InstanceKlass", "_java_fields_count", "u2")?))
        .ok_or_else(unreadable)?;
    let cp = mem
        .u64(klass + u64::from(meta.klass_constants))
        .ok_or_else(unreadable)?;
    let data = fields + u64::from(t.off("Array<u2>", "_data", "")?);
    let int = |name: &str| -> Result<u64, String> {
        u64::try_from(t.int(name)?).map_err(|_| format!("{name} < 0"))
    };
    let slots = int("FieldInfo::field_slots")?;
    let (access, name_index, low, high) = (
        int("FieldInfo::access_flags_offset")?,
        int("FieldInfo::name_index_offset")?,
        int("FieldInfo::low_packed_offset")?,
        int("FieldInfo::high_packed_offset")?,
    );
    let (tag_size, tag_offset) = (int("FIELDINFO_TAG_SIZE")?, int("FIELDINFO_TAG_OFFSET")?);
    let internal = int("JVM_ACC_FIELD_INTERNAL")?;
    if slots == 0 || slots > 16 || tag_size > 8 {
        return Err(format!("field records of {slots} slots"));
    }
    for i in 0..u64::from(count) {
        let at = |slot: u64| mem.u16(data + 2 * (i * slots + slot)).map(u64::from);
        let flags = at(access).ok_or_else(unreadable)?;
        // ACC_STATIC; an internal field's name is the VM's own symbol.
        if flags & 0x0008 != 0 || flags & internal != 0 {
            continue;
        }
        let index = at(name_index).ok_or_else(unreadable)?;
        let name = u16::try_from(index)
            .ok()
            .and_then(|i| pool_symbol(mem, meta, cp, i));
        if name.as_deref() != Some(want) {
            continue;
        }
        let packed = (at(high).ok_or_else(unreadable)? << 16) | at(low).ok_or_else(unreadable)?;
        if packed & ((1 << tag_size) - 1) != tag_offset {
            return Err(format!("{want}'s offset not set"));
        }
        return Ok(packed >> tag_size);
    }
    Err(format!("no field {want}"))
}

/// The `java.lang.String` at `s`, as its `value` bytes and `coder` say.
fn string(mem: &Mem, oops: &Oops, value_at: u64, coder_at: u64, s: u64) -> Option<String> {
    if s == 0 {
        return None;
    }
    let value = oops.field(mem, s, value_at)?;
    let coder = mem.bytes(s + coder_at, 1)?[0];
    if value == 0 {
        return None;
    }
    let len = mem.u32(value + oops.array_length)?;
    let text = match coder {
        0 if len <= MAX_NAME => mem
            .bytes(value + oops.array_base, len as usize)?
            .iter()
            .map(|&b| char::from(b))
            .collect(),
        1 if len <= 2 * MAX_NAME && len % 2 == 0 => {
            let bytes = mem.bytes(value + oops.array_base, len as usize)?;
            let units: Vec<u16> = bytes
                .chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]))
                .collect();
            String::from_utf16(&units).ok()?
        }
        _ => return None,
    };
    (!text.chars().any(char::is_control)).then_some(text)
}

/// Each Java thread of JVM `pid` with its full name (`Thread.getName()`),
/// by TID. Err: why not (not a JVM; the VM still starting; a layout this
/// does not read).
pub fn thread_names(pid: u32) -> Result<Vec<(u32, String)>, String> {
    let maps = crate::tracee::process::read_maps(pid).map_err(|e| e.to_string())?;
    let m = maps
        .lines()
        .filter_map(crate::tracee::process::parse_line)
        .find(|m| m.path.ends_with("/libjvm.so"))
        .ok_or("not a JVM")?;
    let (mem, t) = tables_of(pid, &m).ok_or("its libjvm.so or memory unreadable")?;
    let t = t?;
    let meta = read_meta(&mem, &t)?.ok_or("the VM is starting")?;
    let oops = Oops::read(&mem, &t)?;
    let class = |name: &str| -> Result<u64, String> {
        let at = t.address(
            "vmClasses",
            &format!("_klasses[static_cast<int>(vmClassID::{name}_klass_knum)]"),
        )?;
        match mem.u64(at) {
            Some(k) if k != 0 => Ok(k),
            _ => Err(format!("java.lang.{name} not loaded")),
        }
    };
    let thread_class = class("Thread")?;
    let string_class = class("String")?;
    let name_at = field_offset(&mem, &t, &meta, thread_class, "name")?;
    let value_at = field_offset(&mem, &t, &meta, string_class, "value")?;
    let coder_at = field_offset(&mem, &t, &meta, string_class, "coder")?;
    let unreadable = "the VM's thread list unreadable";
    let list = mem
        .u64(t.address("ThreadsSMRSupport", "_java_thread_list")?)
        .ok_or(unreadable)?;
    let len = mem
        .u32(list + u64::from(t.off("ThreadsList", "_length", "const uint")?))
        .ok_or(unreadable)?;
    let threads = mem
        .u64(list + u64::from(t.off("ThreadsList", "_threads", "JavaThread *const *const")?))
        .ok_or(unreadable)?;
    let osthread_at = u64::from(t.off("JavaThread", "_osthread", "OSThread*")?);
    let tid_at = u64::from(t.off("OSThread", "_thread_id", "OSThread::thread_id_t")?);
    let obj_at = u64::from(t.off("JavaThread", "_threadObj", "OopHandle")?)
        + u64::from(t.off("OopHandle", "_obj", "oop*")?);
    let mut out = Vec::new();
    for i in 0..u64::from(len.min(MAX_THREADS)) {
        // A thread that ends meanwhile is skipped, not an error.
        let read = || -> Option<(u32, String)> {
            let jt = mem.u64(threads + 8 * i)?;
            let os = mem.u64(jt + osthread_at)?;
            let tid = mem.u32(os + tid_at)?;
            let handle = mem.u64(jt + obj_at)?;
            let obj = mem.u64(handle)?;
            let name = oops.field(&mem, obj, name_at)?;
            Some((tid, string(&mem, &oops, value_at, coder_at, name)?))
        };
        if let Some((tid, name)) = read() {
            if tid != 0 && std::path::Path::new(&format!("/proc/{pid}/task/{tid}")).exists() {
                out.push((tid, name));
            }
        }
    }
    out.sort();
    Ok(out)
}
