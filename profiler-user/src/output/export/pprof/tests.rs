use std::io::Read;

use flate2::read::GzDecoder;
use prost::Message;

use super::*;

fn frame(name: &str, binary: Option<&str>) -> Frame {
    Frame {
        name: name.to_string(),
        binary: binary.map(str::to_string),
        ..Default::default()
    }
}

fn decode(gz: &[u8]) -> proto::Profile {
    let mut raw = Vec::new();
    GzDecoder::new(gz).read_to_end(&mut raw).unwrap();
    proto::Profile::decode(raw.as_slice()).unwrap()
}

/// Function names of a location, innermost first.
fn names(p: &proto::Profile, loc: u64) -> Vec<&str> {
    let l = &p.location[loc as usize - 1];
    assert_eq!(l.id, loc);
    l.line
        .iter()
        .map(|line| {
            let f = &p.function[line.function_id as usize - 1];
            p.string_table[f.name as usize].as_str()
        })
        .collect()
}

fn stack() -> Vec<Frame> {
    let mut main = frame("main", Some("/bin/app"));
    main.file = Some("main.c".into());
    main.line = Some(10);
    let mut helper = frame("helper", Some("/bin/app"));
    helper.inlined = true;
    helper.line = Some(20);
    vec![main, helper, frame("leaf", Some("/lib/libc.so.6"))]
}

#[test]
fn roundtrip_dedups_and_orders_leaf_first() {
    let mut kernel = frame("do_sys_open", None);
    kernel.kernel = true;
    let mut suffixed = frame("vfs_read_[k]", None);
    suffixed.kernel = true;
    let samples = vec![
        Sample {
            frames: stack(),
            values: vec![1, 100],
            labels: Vec::new(),
        },
        Sample {
            frames: vec![stack()[0].clone(), kernel, suffixed],
            values: vec![2, 200],
            labels: Vec::new(),
        },
        Sample {
            frames: stack(),
            values: vec![3],
            labels: Vec::new(),
        },
    ];
    let types = [
        ValueType::new("samples", "count"),
        ValueType::new("cpu", "nanoseconds"),
    ];
    let gz = encode(
        &samples,
        &types,
        ValueType::new("cpu", "nanoseconds"),
        10_000_000,
        5_000_000_000,
        1_700_000_000_000_000_000,
    );
    assert_eq!(&gz[..2], &[0x1f, 0x8b], "gzip magic");
    let p = decode(&gz);

    let st = &p.string_table;
    assert_eq!(st[0], "");
    let s = |i: i64| st[i as usize].as_str();
    assert_eq!(
        p.sample_type
            .iter()
            .map(|t| (s(t.ty), s(t.unit)))
            .collect::<Vec<_>>(),
        [("samples", "count"), ("cpu", "nanoseconds")]
    );
    let pt = p.period_type.as_ref().unwrap();
    assert_eq!((s(pt.ty), s(pt.unit)), ("cpu", "nanoseconds"));
    assert_eq!(p.period, 10_000_000);
    assert_eq!(p.duration_nanos, 5_000_000_000);
    assert_eq!(p.time_nanos, 1_700_000_000_000_000_000);
    // Every string is interned once.
    let mut sorted = st.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), st.len());

    // Functions: main, helper, leaf, do_sys_open_[k], vfs_read_[k].
    let mut fnames: Vec<&str> = p.function.iter().map(|f| s(f.name)).collect();
    fnames.sort();
    assert_eq!(
        fnames,
        ["do_sys_open_[k]", "helper", "leaf", "main", "vfs_read_[k]"]
    );
    let main = p.function.iter().find(|f| s(f.name) == "main").unwrap();
    assert_eq!(s(main.filename), "main.c");

    // One mapping per binary, kernel frames share one.
    let mut maps: Vec<&str> = p.mapping.iter().map(|m| s(m.filename)).collect();
    maps.sort();
    assert_eq!(maps, ["/bin/app", "/lib/libc.so.6", KERNEL_BINARY]);

    // The third sample merged into the first (missing value counts 0).
    assert_eq!(p.sample.len(), 2);
    assert_eq!(p.sample[0].value, [4, 100]);
    assert_eq!(p.sample[1].value, [2, 200]);

    // Leaf first; the inlined helper shares main's location, innermost first.
    let locs = &p.sample[0].location_id;
    assert_eq!(locs.len(), 2);
    assert_eq!(names(&p, locs[0]), ["leaf"]);
    assert_eq!(names(&p, locs[1]), ["helper", "main"]);
    let lines: Vec<i64> = p.location[locs[1] as usize - 1]
        .line
        .iter()
        .map(|l| l.line)
        .collect();
    assert_eq!(lines, [20, 10]);

    let locs = &p.sample[1].location_id;
    let chain: Vec<Vec<&str>> = locs.iter().map(|&l| names(&p, l)).collect();
    assert_eq!(chain, [["vfs_read_[k]"], ["do_sys_open_[k]"], ["main"]]);
    // `main` alone is its own location, distinct from the inlined one.
    assert_ne!(locs[2], p.sample[0].location_id[1]);
    for l in &p.location {
        assert_ne!(l.mapping_id, 0);
    }
}

#[test]
fn empty_profile_is_valid() {
    let p = decode(&encode(
        &[],
        &[ValueType::new("samples", "count")],
        ValueType::new("samples", "count"),
        1,
        0,
        0,
    ));
    assert!(p.sample.is_empty());
    assert_eq!(p.string_table, ["", "samples", "count"]);
}

#[test]
fn labels_keep_samples_apart_and_are_strings() {
    let label = |cg: &str| vec![("cgroup".to_string(), cg.to_string())];
    let samples = vec![
        Sample {
            frames: stack(),
            values: vec![1],
            labels: label("/a"),
        },
        Sample {
            frames: stack(),
            values: vec![2],
            labels: label("/b"),
        },
        Sample {
            frames: stack(),
            values: vec![4],
            labels: label("/a"),
        },
    ];
    let t = ValueType::new("samples", "count");
    let p = decode(&encode(
        &samples,
        std::slice::from_ref(&t),
        t.clone(),
        1,
        1,
        0,
    ));
    let s = |i: i64| p.string_table[i as usize].as_str();
    let mut got: Vec<(&str, &str, i64)> = p
        .sample
        .iter()
        .map(|x| {
            assert_eq!(x.label.len(), 1);
            (s(x.label[0].key), s(x.label[0].str), x.value[0])
        })
        .collect();
    got.sort();
    assert_eq!(got, [("cgroup", "/a", 5), ("cgroup", "/b", 2)]);
}
