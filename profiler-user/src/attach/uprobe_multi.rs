//! Many uprobes behind one BPF link (`BPF_TRACE_UPROBE_MULTI`, Linux 6.6+).
//!
//! aya 0.14 attaches every uprobe as its own perf event, and each perf
//! event's destruction waits for an RCU-tasks-trace grace period under the
//! global `event_mutex`: 2,000 probes take minutes to detach. A uprobe_multi
//! link registers all offsets of one binary directly, and closing it
//! unregisters them with a single synchronization.
//!
//! aya cannot load a program with `expected_attach_type =
//! BPF_TRACE_UPROBE_MULTI` (aya issue #992), so [`load_multi_program`]
//! re-parses the same object with `aya_obj`, relocates it against the maps
//! the already-loaded [`aya::Ebpf`] created (so global overrides apply), and
//! calls `BPF_PROG_LOAD` itself. [`attach_uprobe_multi`] does the
//! `BPF_LINK_CREATE`.
use std::{
    collections::{HashMap, HashSet},
    ffi::CString,
    os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd},
    os::unix::ffi::OsStrExt,
    path::Path,
};

use aya::maps::{Map, MapData};
use aya_obj::generated::{
    bpf_attach_type::BPF_TRACE_UPROBE_MULTI, bpf_attr, bpf_cmd, bpf_insn,
    bpf_prog_type::BPF_PROG_TYPE_KPROBE, BPF_F_UPROBE_MULTI_RETURN,
};

/// Size of the verifier log buffer used when a load fails.
const LOG_SIZE: usize = 16 << 20;

fn map_data(map: &Map) -> &MapData {
    match map {
        Map::Array(m)
        | Map::ArrayOfMaps(m)
        | Map::BloomFilter(m)
        | Map::CgroupArray(m)
        | Map::CgroupStorage(m)
        | Map::CgrpStorage(m)
        | Map::CpuMap(m)
        | Map::DevMap(m)
        | Map::DevMapHash(m)
        | Map::HashMap(m)
        | Map::HashOfMaps(m)
        | Map::InodeStorage(m)
        | Map::LpmTrie(m)
        | Map::LruHashMap(m)
        | Map::PerCpuArray(m)
        | Map::PerCpuCgroupStorage(m)
        | Map::PerCpuHashMap(m)
        | Map::PerCpuLruHashMap(m)
        | Map::PerfEventArray(m)
        | Map::ProgramArray(m)
        | Map::Queue(m)
        | Map::ReusePortSockArray(m)
        | Map::RingBuf(m)
        | Map::SockHash(m)
        | Map::SockMap(m)
        | Map::SkStorage(m)
        | Map::Stack(m)
        | Map::StackTraceMap(m)
        | Map::Unsupported(m)
        | Map::XskMap(m) => m,
    }
}

/// `bpf(cmd, attr)`; returns the new fd or the OS error.
fn sys_bpf(cmd: bpf_cmd, attr: &mut bpf_attr) -> std::io::Result<OwnedFd> {
    // SAFETY: `attr` is a valid, fully initialized bpf_attr of the size we
    // pass; every pointer inside it outlives the call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd as libc::c_long,
            attr as *mut bpf_attr,
            std::mem::size_of::<bpf_attr>(),
        )
    };
    if ret < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: on success these commands return a new fd that we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(ret as RawFd) })
}

fn zeroed_attr() -> bpf_attr {
    // SAFETY: bpf_attr is plain old data; all-zero is its "unset" value.
    unsafe { std::mem::zeroed() }
}

/// Loads the program `name` from the eBPF object `bytes` (the same bytes
/// aya loaded, e.g. `probes/mod.rs`'s `EBPF_OBJECT`), relocated against the maps
/// that `ebpf` (the already-loaded [`aya::Ebpf`]) created, including the
/// `.rodata`/`.bss` global-data maps (so `TARGET_TGID` etc. overrides
/// apply), as `BPF_PROG_TYPE_KPROBE` with expected attach type
/// `BPF_TRACE_UPROBE_MULTI`. Returns the program fd. On failure the error
/// holds the verifier log.
pub fn load_multi_program(bytes: &[u8], ebpf: &aya::Ebpf, name: &str) -> Result<OwnedFd, String> {
    let mut obj = aya_obj::Object::parse(bytes).map_err(|e| format!("parsing the object: {e}"))?;
    if obj.has_btf_relocations() {
        let btf =
            aya_obj::btf::Btf::from_sys_fs().map_err(|e| format!("reading the kernel BTF: {e}"))?;
        obj.relocate_btf(&btf)
            .map_err(|e| format!("relocating BTF: {e}"))?;
    }
    let fds: HashMap<&str, RawFd> = ebpf
        .maps()
        .map(|(n, m)| (n, map_data(m).fd().as_fd().as_raw_fd()))
        .collect();
    let obj_maps: Vec<(String, aya_obj::Map)> = obj.maps.drain().collect();
    let maps = obj_maps
        .iter()
        .filter_map(|(n, m)| fds.get(n.as_str()).map(|&fd| (n.as_str(), fd, m)));
    let text_sections: HashSet<usize> = obj.functions.keys().map(|(s, _)| *s).collect();
    obj.relocate_maps(maps, &text_sections)
        .map_err(|e| format!("relocating maps of {name}: {e}"))?;
    obj.relocate_calls(&text_sections)
        .map_err(|e| format!("relocating calls of {name}: {e}"))?;
    let prog = obj
        .programs
        .get(name)
        .ok_or_else(|| format!("program {name} not in the object"))?;
    let insns: &[bpf_insn] = &obj
        .functions
        .get(&prog.function_key())
        .ok_or_else(|| format!("function of {name} not in the object"))?
        .instructions;
    let license = prog.license.clone();

    let mut attr = zeroed_attr();
    // SAFETY: writing plain integers into the PROG_LOAD member of the union.
    let load = unsafe { &mut attr.__bindgen_anon_3 };
    load.prog_type = BPF_PROG_TYPE_KPROBE as u32;
    load.expected_attach_type = BPF_TRACE_UPROBE_MULTI as u32;
    load.insns = insns.as_ptr() as u64;
    load.insn_cnt = insns.len() as u32;
    load.license = license.as_ptr() as u64;
    // The kernel accepts 15 characters of [A-Za-z0-9_.].
    for (dst, src) in load.prog_name.iter_mut().zip(
        name.bytes()
            .filter(|b| b.is_ascii_alphanumeric() || *b == b'_' || *b == b'.')
            .take(15),
    ) {
        *dst = src as libc::c_char;
    }
    let first = match sys_bpf(bpf_cmd::BPF_PROG_LOAD, &mut attr) {
        Ok(fd) => return Ok(fd),
        Err(e) => e,
    };
    // Load again with the verifier log, for the error message.
    let mut log = vec![0u8; LOG_SIZE];
    // SAFETY: as above.
    let load = unsafe { &mut attr.__bindgen_anon_3 };
    load.log_level = 1;
    load.log_buf = log.as_mut_ptr() as u64;
    load.log_size = log.len() as u32;
    match sys_bpf(bpf_cmd::BPF_PROG_LOAD, &mut attr) {
        Ok(fd) => Ok(fd),
        Err(e) => {
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            let text = String::from_utf8_lossy(&log[..end]);
            Err(format!(
                "loading {name} for uprobe_multi: {first} (with log: {e}); verifier log:\n{text}"
            ))
        }
    }
}

/// Creates one uprobe_multi link of program `prog` (loaded by
/// [`load_multi_program`]) on the file `path` (opened by the kernel, e.g.
/// `/proc/PID/exe` or `/proc/PID/map_files/…`) at the file `offsets`, with
/// one cookie per offset (read in BPF with `bpf_get_attach_cookie`), firing
/// only in process `pid` (0: every process), as return probes if
/// `retprobe`. `ref_ctrs`, when not empty, holds one USDT semaphore's file
/// offset per offset (0: none), which the kernel raises while the probe is
/// attached. Dropping the returned fd detaches them all at once.
pub fn attach_uprobe_multi(
    prog: BorrowedFd<'_>,
    path: &Path,
    offsets: &[u64],
    cookies: &[u64],
    ref_ctrs: &[u64],
    pid: u32,
    retprobe: bool,
) -> Result<OwnedFd, String> {
    if offsets.is_empty()
        || offsets.len() != cookies.len()
        || !(ref_ctrs.is_empty() || ref_ctrs.len() == offsets.len())
    {
        return Err(format!(
            "uprobe_multi needs one cookie per offset and at least one offset \
             ({} offsets, {} cookies)",
            offsets.len(),
            cookies.len()
        ));
    }
    let c_path = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| format!("path {} contains a NUL byte", path.display()))?;
    let mut attr = zeroed_attr();
    // SAFETY: writing plain integers into the LINK_CREATE member of the union.
    let link = unsafe { &mut attr.link_create };
    link.__bindgen_anon_1.prog_fd = prog.as_raw_fd() as u32;
    link.attach_type = BPF_TRACE_UPROBE_MULTI as u32;
    link.flags = 0;
    // SAFETY: as above.
    let multi = unsafe { &mut link.__bindgen_anon_3.uprobe_multi };
    multi.path = c_path.as_ptr() as u64;
    multi.offsets = offsets.as_ptr() as u64;
    multi.ref_ctr_offsets = match ref_ctrs {
        [] => 0,
        r => r.as_ptr() as u64,
    };
    multi.cookies = cookies.as_ptr() as u64;
    multi.cnt = offsets.len() as u32;
    multi.flags = if retprobe {
        BPF_F_UPROBE_MULTI_RETURN
    } else {
        0
    };
    multi.pid = pid;
    sys_bpf(bpf_cmd::BPF_LINK_CREATE, &mut attr).map_err(|e| {
        format!(
            "uprobe_multi link of {} {}probes on {}: {e}",
            offsets.len(),
            if retprobe { "return " } else { "" },
            path.display()
        )
    })
}

/// The uprobe PMU's `perf_event_attr.config` bit the semaphore's file
/// offset starts at (`/sys/bus/event_source/devices/uprobe/format/
/// ref_ctr_offset` reads `config:32-63`; Linux 4.20).
const REF_CTR_OFFSET_SHIFT: u32 = 32;

/// One uprobe behind a USDT semaphore, for kernels without uprobe_multi
/// links: a perf event on the file `path` at `offset` that raises the
/// semaphore at the file offset `ref_ctr` while it lives, in process `pid`,
/// and a `BPF_PERF_EVENT` link (Linux 5.15) running `prog` with `cookie`.
/// aya's per-probe attach has no semaphore. Dropping the two fds (the link
/// first) detaches it.
pub fn attach_gated_probe(
    prog: BorrowedFd<'_>,
    path: &Path,
    (offset, ref_ctr): (u64, u64),
    cookie: u64,
    pid: u32,
) -> Result<[OwnedFd; 2], String> {
    use aya_obj::generated::{
        bpf_attach_type::BPF_PERF_EVENT, perf_event_attr, PERF_FLAG_FD_CLOEXEC,
    };
    let pmu = std::fs::read_to_string("/sys/bus/event_source/devices/uprobe/type")
        .ok()
        .and_then(|t| t.trim().parse::<u32>().ok())
        .ok_or("this kernel has no uprobe PMU (/sys/bus/event_source/devices/uprobe)")?;
    let c_path = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| format!("path {} contains a NUL byte", path.display()))?;
    // SAFETY: perf_event_attr is plain old data; all-zero is "unset".
    let mut attr: perf_event_attr = unsafe { std::mem::zeroed() };
    attr.type_ = pmu;
    attr.size = std::mem::size_of::<perf_event_attr>() as u32;
    attr.config = ref_ctr << REF_CTR_OFFSET_SHIFT;
    attr.__bindgen_anon_3.uprobe_path = c_path.as_ptr() as u64;
    attr.__bindgen_anon_4.probe_offset = offset;
    // Every process: one CPU's event, as aya does (the program runs on
    // every CPU's hits whatever the event's CPU).
    let (pid, cpu) = match pid {
        0 => (-1, 0),
        p => (p as libc::c_int, -1),
    };
    // SAFETY: a valid attr whose path outlives the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &attr as *const perf_event_attr,
            pid,
            cpu as libc::c_int,
            -1 as libc::c_int,
            PERF_FLAG_FD_CLOEXEC as libc::c_ulong,
        )
    };
    if fd < 0 {
        return Err(format!(
            "a uprobe with a semaphore on {} at {offset:#x}: {}",
            path.display(),
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: a new fd that nothing else owns.
    let event = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
    let mut attr = zeroed_attr();
    // SAFETY: writing plain integers into the LINK_CREATE member of the union.
    let link = unsafe { &mut attr.link_create };
    link.__bindgen_anon_1.prog_fd = prog.as_raw_fd() as u32;
    link.__bindgen_anon_2.target_fd = event.as_raw_fd() as u32;
    link.attach_type = BPF_PERF_EVENT as u32;
    link.__bindgen_anon_3.perf_event.bpf_cookie = cookie;
    let link = sys_bpf(bpf_cmd::BPF_LINK_CREATE, &mut attr)
        .map_err(|e| format!("linking a program to a uprobe with a semaphore: {e}"))?;
    Ok([link, event])
}

#[cfg(test)]
mod tests {
    use std::{num::NonZeroU32, time::Instant};

    use aya::{
        maps::{MapData, RingBuf},
        programs::{
            uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeScope},
            UProbe,
        },
        EbpfLoader,
    };
    use object::{Object as _, ObjectSection as _};
    use profiler_common::{
        Event, COOKIE_DISPATCH, KIND_ENTRY, KIND_EXIT, PROG_ENTRY, PROG_EXIT, SAMPLE_ALL_GLOBAL,
        TARGET_TGID_GLOBAL, WAKEUP_BYTES_GLOBAL, WATCH_TID_GLOBAL,
    };

    use super::*;
    use crate::tracee::symbols::read_functions;

    static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/profiler"));

    #[inline(never)]
    fn multi_traced_leaf(x: u64) -> u64 {
        std::hint::black_box(x.wrapping_mul(3).wrapping_add(1))
    }

    /// The object loaded for `tgid`, with one shared ring.
    fn load_ebpf(tgid: u32) -> (aya::Ebpf, RingBuf<MapData>) {
        let spec = crate::attach::rings::RingSpec::shared(1 << 22);
        let mut loader = EbpfLoader::new();
        let mut ebpf = spec
            .configure(&mut loader)
            .unwrap()
            .override_global(TARGET_TGID_GLOBAL, &tgid, true)
            .override_global(WATCH_TID_GLOBAL, &0u32, true)
            .override_global(SAMPLE_ALL_GLOBAL, &0u32, true)
            .override_global(WAKEUP_BYTES_GLOBAL, &0u64, true)
            .load(EBPF_OBJECT)
            .expect("aya loads the object");
        let ring = crate::attach::rings::create(&mut ebpf, spec)
            .unwrap()
            .pop()
            .unwrap()
            .ring;
        (ebpf, ring)
    }

    /// (entries, exits) in the ring for thread `tid` with function `func`.
    fn count_events(ring: &mut RingBuf<MapData>, tid: u32, func: u32) -> (usize, usize) {
        let (mut entries, mut exits) = (0, 0);
        while let Some(item) = ring.next() {
            if item.len() != std::mem::size_of::<Event>() {
                continue;
            }
            let Some(ev) = profiler_common::read::<Event>(&item) else {
                continue;
            };
            if ev.tid != tid || ev.func() != func {
                continue;
            }
            match ev.kind() {
                KIND_ENTRY => entries += 1,
                KIND_EXIT => exits += 1,
                _ => {}
            }
        }
        (entries, exits)
    }

    /// File offsets of the first `n` distinct functions in this binary's `.text`.
    fn text_offsets(n: usize) -> Vec<u64> {
        let exe = Path::new("/proc/self/exe");
        let data = std::fs::read(exe).unwrap();
        let file = object::File::parse(&*data).unwrap();
        let (start, size) = file
            .section_by_name(".text")
            .and_then(|s| s.file_range())
            .unwrap();
        let mut offsets: Vec<u64> = read_functions(exe)
            .unwrap()
            .into_iter()
            .filter(|s| s.size > 0 && s.offset >= start && s.offset < start + size)
            .map(|s| s.offset)
            .collect();
        offsets.sort_unstable();
        offsets.dedup();
        offsets.truncate(n);
        offsets
    }

    #[test]
    fn uprobe_multi_events_and_fast_detach() {
        // SAFETY: plain syscalls without arguments.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipping: uprobe_multi needs root");
            return;
        }
        let pid = std::process::id();
        // SAFETY: as above.
        let tid = unsafe { libc::gettid() } as u32;
        let (mut ebpf, mut ring) = load_ebpf(pid);
        let entry = load_multi_program(EBPF_OBJECT, &ebpf, PROG_ENTRY).unwrap();
        let exit = load_multi_program(EBPF_OBJECT, &ebpf, PROG_EXIT).unwrap();

        let exe = Path::new("/proc/self/exe");
        let leaf = read_functions(exe)
            .unwrap()
            .into_iter()
            .find(|s| s.name.ends_with("multi_traced_leaf"))
            .expect("multi_traced_leaf symbol");
        const FUNC: u32 = 7;
        let cookies = [u64::from(FUNC) | COOKIE_DISPATCH];
        let exit_link =
            attach_uprobe_multi(exit.as_fd(), exe, &[leaf.offset], &cookies, &[], pid, true)
                .unwrap();
        let entry_link = attach_uprobe_multi(
            entry.as_fd(),
            exe,
            &[leaf.offset],
            &cookies,
            &[],
            pid,
            false,
        )
        .unwrap();
        const N: usize = 100;
        let mut acc = 0;
        for i in 0..N as u64 {
            acc += multi_traced_leaf(i);
        }
        std::hint::black_box(acc);
        let (entries, exits) = count_events(&mut ring, tid, FUNC);
        println!("uprobe_multi: {N} calls -> {entries} entry + {exits} exit events");
        assert_eq!((entries, exits), (N, N));
        drop(entry_link);
        drop(exit_link);
        multi_traced_leaf(0);
        assert_eq!(count_events(&mut ring, tid, FUNC), (0, 0), "detached");

        // Wrong arguments are refused before the syscall.
        assert!(
            attach_uprobe_multi(entry.as_fd(), exe, &[leaf.offset], &[], &[], pid, false).is_err()
        );

        // 1,000 distinct offsets per link, entry and return: attach and detach time.
        let offsets = text_offsets(1000);
        assert_eq!(offsets.len(), 1000);
        let cookies: Vec<u64> = (0..offsets.len() as u64).collect();
        let start = Instant::now();
        let exit_link =
            attach_uprobe_multi(exit.as_fd(), exe, &offsets, &cookies, &[], pid, true).unwrap();
        let entry_link =
            attach_uprobe_multi(entry.as_fd(), exe, &offsets, &cookies, &[], pid, false).unwrap();
        let attach = start.elapsed();
        let start = Instant::now();
        drop(entry_link);
        let detach_entry = start.elapsed();
        let start = Instant::now();
        drop(exit_link);
        let detach_exit = start.elapsed();
        println!(
            "uprobe_multi 2 x {} offsets: attach {:?}, detach entry link {:?}, detach return link {:?}",
            offsets.len(),
            attach,
            detach_entry,
            detach_exit
        );
        assert!(detach_entry.as_secs_f64() + detach_exit.as_secs_f64() < 1.0);

        // For comparison: aya's one perf event per probe.
        const PER_PROBE: usize = 10;
        let prog: &mut UProbe = ebpf.program_mut(PROG_ENTRY).unwrap().try_into().unwrap();
        prog.load().unwrap();
        let scope = UProbeScope::OneProcess(NonZeroU32::new(pid).unwrap());
        let ids: Vec<_> = offsets[..PER_PROBE]
            .iter()
            .map(|&off| {
                let point = UProbeAttachPoint {
                    location: UProbeAttachLocation::AbsoluteOffset(off),
                    cookie: Some(0),
                };
                prog.attach(point, exe, scope).unwrap()
            })
            .collect();
        let start = Instant::now();
        for id in ids {
            prog.detach(id).unwrap();
        }
        println!(
            "aya per-probe: detaching {PER_PROBE} perf-event uprobes took {:?}",
            start.elapsed()
        );
    }
}
