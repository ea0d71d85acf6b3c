//! The kernel-to-agent rings. `EVENTS` in the object is an array of
//! ring-buffer maps (`BPF_MAP_TYPE_ARRAY_OF_MAPS`); after loading, the agent
//! creates the rings and puts them in: one per online CPU (`--rings
//! per-cpu`, each program writes to the ring of the CPU it runs on, so
//! writers on different CPUs never share a ring's spinlock), or one shared
//! ring in slot 0 (`--rings shared`). Each ring is `--ring-size` bytes.
use aya::{
    maps::{ArrayOfMaps, Map, MapData, RingBuf},
    Ebpf, EbpfLoader,
};
use aya_obj::generated::bpf_map_type::BPF_MAP_TYPE_RINGBUF;
use profiler_common::{EVENTS_MAP, PER_CPU_RINGS_GLOBAL};

pub use crate::cli::RingMode;
use crate::{error::chain, Error, Result};

/// How the rings are laid out: the mode and each ring's size in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingSpec {
    /// One ring per CPU, or one shared.
    pub mode: RingMode,
    /// Bytes per ring (a power of two, at least a page).
    pub size: u32,
}

impl RingSpec {
    /// A shared ring of `size` bytes.
    pub fn shared(size: u32) -> Self {
        RingSpec {
            mode: RingMode::Shared,
            size,
        }
    }

    /// Sets the loader's ring settings: the mode global and the number of
    /// slots (every possible CPU id, or one).
    pub fn configure<'a, 'b>(
        &self,
        loader: &'b mut EbpfLoader<'a>,
    ) -> Result<&'b mut EbpfLoader<'a>> {
        // `override_global` borrows the value for the loader's lifetime.
        static PER_CPU: [u32; 2] = [0, 1];
        let per_cpu = &PER_CPU[usize::from(self.mode == RingMode::PerCpu)];
        let slots = match self.mode {
            RingMode::PerCpu => possible_cpus()?,
            RingMode::Shared => 1,
        };
        Ok(loader
            .override_global(PER_CPU_RINGS_GLOBAL, per_cpu, true)
            .map_max_entries(EVENTS_MAP, slots))
    }
}

/// How many CPU ids there can be (the slots of the per-CPU array).
fn possible_cpus() -> Result<u32> {
    aya::util::nr_cpus()
        .map(|n| n as u32)
        .map_err(|(what, e)| Error::io(what.to_string(), e))
}

/// One ring of `EVENTS`.
pub struct EventRing {
    /// The ring.
    pub ring: RingBuf<MapData>,
}

/// Creates the rings of `spec` and puts them into the `EVENTS` array of
/// `ebpf` (loaded with [`RingSpec::configure`]).
pub fn create(ebpf: &mut Ebpf, spec: RingSpec) -> Result<Vec<EventRing>> {
    let fail =
        |what: &str, e: String| Error::Load(format!("creating the event rings: {what}: {e}"));
    let map = ebpf
        .map_mut(EVENTS_MAP)
        .ok_or_else(|| fail("the object", "no EVENTS map".into()))?;
    let mut slots: ArrayOfMaps<&mut MapData, MapData> =
        ArrayOfMaps::try_from(map).map_err(|e| fail("EVENTS", chain(&e)))?;
    let cpus: Vec<Option<u32>> = match spec.mode {
        RingMode::Shared => vec![None],
        RingMode::PerCpu => aya::util::online_cpus()
            .map_err(|(what, e)| Error::io(what.to_string(), e))?
            .into_iter()
            .map(Some)
            .collect(),
    };
    let mut rings = Vec::with_capacity(cpus.len());
    for cpu in cpus {
        let slot = cpu.unwrap_or(0);
        let obj = aya_obj::Map::new_from_params(BPF_MAP_TYPE_RINGBUF as u32, 0, 0, spec.size, 0);
        let name = format!("EVENTS_{slot}");
        let data = MapData::create(obj, &name, None).map_err(|e| fail(&name, chain(&e)))?;
        slots
            .set(slot, &data, 0)
            .map_err(|e| fail(&format!("slot {slot}"), chain(&e)))?;
        let ring = RingBuf::try_from(Map::RingBuf(data)).map_err(|e| fail(&name, chain(&e)))?;
        rings.push(EventRing { ring });
    }
    Ok(rings)
}
