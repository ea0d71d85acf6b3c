//! `profile.pb.gz`: the gzipped pprof protobuf (`perftools.profiles.Profile`)
//! that `go tool pprof`, Pyroscope, Parca and Grafana read.
//!
//! Functions, locations and mappings are deduplicated: one `Mapping` per
//! binary, one `Function` per (name, file), one `Location` per (binary,
//! call chain of inlined frames). Frames marked `inlined` are folded into
//! the `Location` of the frame they were inlined into, innermost line first,
//! as pprof expects. Samples with the same location list are merged.
use std::collections::HashMap;
use std::io::Write;

use flate2::{write::GzEncoder, Compression};
use prost::Message;

pub mod proto;

/// Suffix pprof tools (and Linux `perf`) use to mark kernel functions.
pub const KERNEL_SUFFIX: &str = "_[k]";

/// Mapping name for kernel frames that carry no binary.
pub const KERNEL_BINARY: &str = "[kernel.kallsyms]";

/// One frame of a sampled stack.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Frame {
    /// Function name, demangled.
    pub name: String,
    /// Binary (path or name) the code lives in; one pprof `Mapping` each.
    pub binary: Option<String>,
    /// Source file, if known.
    pub file: Option<String>,
    /// Source line, if known.
    pub line: Option<u32>,
    /// The frame was inlined into its caller (the next frame outwards).
    pub inlined: bool,
    /// Kernel code: the name gets the `_[k]` suffix.
    pub kernel: bool,
}

/// One sampled stack with its values (one per [`ValueType`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sample {
    /// Frames, OUTERMOST first (root … leaf).
    pub frames: Vec<Frame>,
    /// One value per sample type given to [`encode`]; missing ones count 0.
    pub values: Vec<i64>,
    /// String labels (key, value), e.g. `("cgroup", "/system.slice/x")`.
    pub labels: Vec<(String, String)>,
}

/// What a value measures, e.g. `("samples", "count")`,
/// `("cpu", "nanoseconds")`, `("wall", "nanoseconds")`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ValueType {
    /// Kind of measurement (pprof `type`).
    pub kind: String,
    /// Unit of measurement.
    pub unit: String,
}

impl ValueType {
    /// Shorthand constructor.
    pub fn new(kind: &str, unit: &str) -> Self {
        Self {
            kind: kind.to_string(),
            unit: unit.to_string(),
        }
    }
}

/// Interns strings into the profile's string table (index 0 is `""`).
#[derive(Default)]
struct Strings {
    table: Vec<String>,
    index: HashMap<String, i64>,
}

impl Strings {
    fn new() -> Self {
        let mut s = Self::default();
        s.get("");
        s
    }

    fn get(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.table.len() as i64;
        self.table.push(s.to_string());
        self.index.insert(s.to_string(), i);
        i
    }
}

/// Builds the deduplicated tables of a profile.
struct Builder {
    strings: Strings,
    mappings: Vec<proto::Mapping>,
    mapping_ids: HashMap<String, u64>,
    functions: Vec<proto::Function>,
    function_ids: HashMap<(String, String), u64>,
    locations: Vec<proto::Location>,
    location_ids: HashMap<(u64, Vec<(u64, i64)>), u64>,
}

impl Builder {
    fn mapping(&mut self, f: &Frame) -> u64 {
        let binary = match (&f.binary, f.kernel) {
            (Some(b), _) => b.as_str(),
            (None, true) => KERNEL_BINARY,
            (None, false) => return 0,
        };
        if let Some(&id) = self.mapping_ids.get(binary) {
            let m = &mut self.mappings[id as usize - 1];
            m.has_filenames |= f.file.is_some();
            m.has_line_numbers |= f.line.is_some();
            m.has_inline_frames |= f.inlined;
            return id;
        }
        let id = self.mappings.len() as u64 + 1;
        let filename = self.strings.get(binary);
        self.mappings.push(proto::Mapping {
            id,
            filename,
            has_functions: true,
            has_filenames: f.file.is_some(),
            has_line_numbers: f.line.is_some(),
            has_inline_frames: f.inlined,
            ..Default::default()
        });
        self.mapping_ids.insert(binary.to_string(), id);
        id
    }

    fn function(&mut self, f: &Frame) -> u64 {
        let name = if f.kernel && !f.name.ends_with(KERNEL_SUFFIX) {
            format!("{}{KERNEL_SUFFIX}", f.name)
        } else {
            f.name.clone()
        };
        let file = f.file.clone().unwrap_or_default();
        let key = (name, file);
        if let Some(&id) = self.function_ids.get(&key) {
            return id;
        }
        let id = self.functions.len() as u64 + 1;
        let name = self.strings.get(&key.0);
        let filename = self.strings.get(&key.1);
        self.functions.push(proto::Function {
            id,
            name,
            system_name: name,
            filename,
            start_line: 0,
        });
        self.function_ids.insert(key, id);
        id
    }

    /// A location for `frames` (innermost first): inlined frames followed
    /// by the frame they were inlined into.
    fn location(&mut self, frames: &[&Frame]) -> u64 {
        let mapping_id = self.mapping(frames[frames.len() - 1]);
        for f in &frames[..frames.len() - 1] {
            self.mapping(f);
        }
        let lines: Vec<(u64, i64)> = frames
            .iter()
            .map(|f| (self.function(f), f.line.map_or(0, i64::from)))
            .collect();
        let key = (mapping_id, lines);
        if let Some(&id) = self.location_ids.get(&key) {
            return id;
        }
        let id = self.locations.len() as u64 + 1;
        self.locations.push(proto::Location {
            id,
            mapping_id,
            address: 0,
            line: key
                .1
                .iter()
                .map(|&(function_id, line)| proto::Line { function_id, line })
                .collect(),
            is_folded: false,
        });
        self.location_ids.insert(key, id);
        id
    }

    /// Location ids of a stack given outermost first, returned leaf first.
    fn stack(&mut self, frames: &[Frame]) -> Vec<u64> {
        let mut ids = Vec::new();
        let mut group: Vec<&Frame> = Vec::new();
        for f in frames.iter().rev() {
            // An inlined frame only shares a location with its caller when
            // both come from the same binary.
            if let Some(prev) = group.last() {
                if prev.binary != f.binary {
                    ids.push(self.location(&group));
                    group.clear();
                }
            }
            group.push(f);
            if !f.inlined {
                ids.push(self.location(&group));
                group.clear();
            }
        }
        if !group.is_empty() {
            ids.push(self.location(&group));
        }
        ids
    }
}

/// Encodes `samples` as a gzipped pprof profile.
///
/// `types` names the sample values (same order as [`Sample::values`]);
/// `period_type`/`period` say how often samples were taken (e.g.
/// `("cpu","nanoseconds")` and `1e9 / hz`); `duration_ns` and
/// `start_unix_ns` place the profile in time.
pub fn encode(
    samples: &[Sample],
    types: &[ValueType],
    period_type: ValueType,
    period: i64,
    duration_ns: i64,
    start_unix_ns: i64,
) -> Vec<u8> {
    let mut b = Builder {
        strings: Strings::new(),
        mappings: Vec::new(),
        mapping_ids: HashMap::new(),
        functions: Vec::new(),
        function_ids: HashMap::new(),
        locations: Vec::new(),
        location_ids: HashMap::new(),
    };
    let value_type = |b: &mut Builder, t: &ValueType| proto::ValueType {
        ty: b.strings.get(&t.kind),
        unit: b.strings.get(&t.unit),
    };
    let sample_type: Vec<_> = types.iter().map(|t| value_type(&mut b, t)).collect();
    let period_type = value_type(&mut b, &period_type);

    let mut out: Vec<proto::Sample> = Vec::new();
    // Samples merge when their locations and labels are the same.
    type Key<'a> = (Vec<u64>, &'a [(String, String)]);
    let mut seen: HashMap<Key, usize> = HashMap::new();
    for s in samples {
        let location_id = b.stack(&s.frames);
        let mut value = s.values.clone();
        value.resize(types.len(), 0);
        let key = (location_id.clone(), s.labels.as_slice());
        if let Some(&i) = seen.get(&key) {
            for (acc, v) in out[i].value.iter_mut().zip(value) {
                *acc = acc.saturating_add(v);
            }
            continue;
        }
        seen.insert(key, out.len());
        let label = s
            .labels
            .iter()
            .map(|(k, v)| proto::Label {
                key: b.strings.get(k),
                str: b.strings.get(v),
                ..Default::default()
            })
            .collect();
        out.push(proto::Sample {
            location_id,
            value,
            label,
        });
    }

    let profile = proto::Profile {
        sample_type,
        sample: out,
        mapping: b.mappings,
        location: b.locations,
        function: b.functions,
        string_table: b.strings.table,
        time_nanos: start_unix_ns,
        duration_nanos: duration_ns,
        period_type: Some(period_type),
        period,
        ..Default::default()
    };
    let mut gz = GzEncoder::new(Vec::new(), Compression::default());
    gz.write_all(&profile.encode_to_vec())
        .expect("writing to a Vec cannot fail");
    gz.finish().expect("writing to a Vec cannot fail")
}

#[cfg(test)]
mod tests;
