use super::*;

#[test]
fn hostile_names_cannot_end_the_script() {
    let mut page = Page::new("evil</script><b>", 10);
    page.fact("exe", "/x/</script><script>alert(1)</script>");
    page.functions = vec![(
        "evil</script>&amp;<g>\u{7f}\u{2028}\u{1}<!--".into(),
        "/bin/a".into(),
        1,
        2,
        3,
        4,
        5,
        6,
        0,
    )];
    let html = page.render();
    let data = html.split("id=\"data\">").nth(1).unwrap();
    let data = data.split("</script>").next().unwrap();
    for bad in ["<", ">", "&", "\u{7f}", "\u{2028}", "\u{1}"] {
        assert!(!data.contains(bad), "{bad:?} left in the data");
    }
    // The data still parses to the same names.
    let v: serde_json::Value = serde_json::from_str(data).unwrap();
    assert_eq!(
        v["functions"][0][0],
        "evil</script>&amp;<g>\u{7f}\u{2028}\u{1}<!--"
    );
    assert!(html.contains("<title>evil&lt;/script&gt;&lt;b&gt;</title>"));
    assert_eq!(html.matches("</script>").count(), 2, "only the page's own");
}

#[test]
fn placeholders_in_values_stay_text() {
    let page = Page::new("{{STYLE}} {{DATA}}", 1);
    let html = page.render();
    assert_eq!(html.matches("<style>").count(), 1);
    assert!(html.contains("<title>{{STYLE}} {{DATA}}</title>"));
}

#[test]
fn svg_is_embedded_from_its_root_without_comments() {
    let lines = vec!["main;work 10".to_string()];
    let svg = crate::output::report::flame::svg(&lines, "t").unwrap();
    let mut page = Page::new("t", 1);
    page.flame("wall", "t", &svg);
    let s = &page.flames[0].svg;
    assert!(s.starts_with("<svg"));
    assert!(!s.contains("<!--") && !s.contains("DOCTYPE"));
    assert!(s.contains("function init(evt)"), "inferno's script kept");
}

#[test]
fn page_references_no_web_resource() {
    let html = Page::new("t", 1).render();
    assert!(!html.contains("http://") && !html.contains("https://"));
    assert!(html.contains("default-src 'none'"));
}

/// A page as large as the load-time goal names: `slow` slow
/// dispatches, each its own group (the longest table), with 24-node trees
/// (traced, sampled and blocked frames), `funcs` functions, and the three
/// flame graphs drawn from `funcs` call paths.
pub(crate) fn synthetic(slow: usize, funcs: usize) -> Page {
    use crate::analyze::dispatch::{sched::Split, tree::Kind, Config, Dispatcher, Group, Slow};
    let cfg = Config {
        tid: 1,
        thread_name: "main".into(),
        rule: "--dispatch dispatch_event".into(),
        threshold_ns: 50_000_000,
        hang_ns: 1_000_000_000,
        frame_interval_ns: 16_666_666,
        full_tree: false,
        sample_period_ns: 1_003_009,
        wakers: true,
        wait_loop: false,
        preset: false,
    };
    let duration_ns = 600_000_000_000u64;
    let mut d = Dispatcher::new(cfg, 0, vec!["dispatch_event".into()], vec![true], 0);
    let name = |i: usize| format!("app::module_{}::Widget<T>::handle_event_{i}", i % 97);
    for i in 0..slow {
        let dur = 50_000_000 + (i as u64 * 7_919_003) % 900_000_000;
        let tree: Vec<FlatNode> = (0..24u32)
            .map(|n| {
                let depth = if n == 0 { 0 } else { 1 + (n - 1) % 6 };
                let kind = match n % 8 {
                    6 => Kind::Blocked,
                    7 => Kind::Sampled,
                    _ => Kind::Traced,
                };
                FlatNode {
                    name: if n == 0 {
                        "dispatch_event".into()
                    } else {
                        name(i * 31 + n as usize)
                    },
                    depth,
                    calls: 1 + u64::from(n % 3),
                    total_ns: dur >> depth,
                    self_ns: dur >> (depth + 1),
                    detached: 0,
                    tail_calls: 0,
                    kind,
                }
            })
            .collect();
        let key = format!("{} <- dispatch_event", name(i));
        d.slow.push(Slow {
            index: i as u64 * 37,
            start_ns: i as u64 * (duration_ns / slow.max(1) as u64),
            duration_ns: dur,
            split: Split {
                on_cpu_ns: dur / 2,
                blocked_ns: dur / 3,
                runnable_ns: dur - dur / 2 - dur / 3,
            },
            dropped_frames: dur / 16_666_666,
            key: key.clone(),
            verdict: format!("50% on CPU in {key}"),
            samples: (dur / 1_003_009) as u32,
            tree: tree.clone(),
            blocking_stacks: vec![(dur / 3, vec!["futex_wait".into(), name(i)])],
            truncated: false,
            wakers: Vec::new(),
            source: None,
            detached_frames: 0,
            probe_ns: 0,
            probes_mainly: false,
        });
        let mut g = Group::new(key.clone());
        g.verdict = "50% on CPU".into();
        g.worst_tree = tree;
        g.durations.add(dur);
        d.groups.insert(key, g);
    }
    let mut page = Page::new("profiler: synthetic large recording", duration_ns);
    page.fact("target", "PID 1 /usr/bin/synthetic");
    let json = crate::output::dispatches::json(&d, duration_ns);
    page.dispatches(&json, group_trees(&d));
    page.functions = (0..funcs)
        .map(|i| {
            let n = i as u64;
            (
                name(i),
                format!("/usr/lib/libapp{}.so", i % 40),
                1 + n * 13 % 100_000,
                n * 1_000_003 % 9_000_000_000,
                n * 700_001 % 5_000_000_000,
                100 + n % 1000,
                10_000 + n * 17 % 1_000_000,
                1_000_000 + n * 7_919 % 900_000_000,
                0,
            )
        })
        .collect();
    let lines: Vec<String> = (0..funcs)
        .map(|i| {
            format!(
                "main;run_loop;{};{};{} {}",
                name(i / 100),
                name(i / 10),
                name(i),
                1 + i * 7 % 1000
            )
        })
        .collect();
    for id in ["wall", "cpu", "offcpu"] {
        let svg = crate::output::report::flame::svg(&lines, id).unwrap();
        page.flame(id, id, &svg);
    }
    page
}

/// The large page renders, with every slow dispatch and function in its
/// data. With `PROFILER_HTML_LARGE=PATH` (`cargo xtask bench --only html`)
/// it is the size (1,000 slow dispatches, 10,000 functions) and is
/// written to PATH for the browser to load; otherwise a tenth of it.
#[test]
fn synthetic_page_holds_every_dispatch_and_function() {
    let target = std::env::var_os("PROFILER_HTML_LARGE");
    let (slow, funcs) = match target {
        Some(_) => (1_000, 10_000),
        None => (100, 1_000),
    };
    let html = synthetic(slow, funcs).render();
    let data = html.split("id=\"data\">").nth(1).unwrap();
    let data = data.split("</script>").next().unwrap();
    let v: serde_json::Value = serde_json::from_str(data).unwrap();
    assert_eq!(v["dispatches"]["slow"].as_array().unwrap().len(), slow);
    assert_eq!(v["dispatches"]["groups"].as_array().unwrap().len(), slow);
    assert_eq!(v["functions"].as_array().unwrap().len(), funcs);
    assert_eq!(v["flames"].as_array().unwrap().len(), 3);
    if let Some(path) = target {
        std::fs::write(path, html).unwrap();
    }
}
