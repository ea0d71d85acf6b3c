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
