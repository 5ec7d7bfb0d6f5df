//! The report pages answer "does paging pay here?" in their first screen: each opens with a
//! verdict line whose figures this test recomputes from the folder's own files, the line ends
//! inside a 1280×800 screen in headless Chromium, and no axis label is a raw float such as
//! `3500000.0`. Set `KVBENCH_REPORT_SHOTS=DIR` to keep a PNG of each page's first screen there.

use crate::support;
use crate::support::report_browser;

use std::collections::BTreeMap;
use std::path::Path;

use report_browser::{check_marker, marker_number, render, screenshot, SCREEN};
use support::{kvbench, run_sim};

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The text of every SVG `<text>` element of the page.
fn svg_texts(html: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = html;
    while let Some(at) = rest.find("<text") {
        rest = &rest[at..];
        let open_end = rest.find('>').expect("text tag closes");
        let close = rest.find("</text>").expect("text element closes");
        out.push(rest[open_end + 1..close].trim().to_string());
        rest = &rest[close..];
    }
    out
}

/// A label that is a plain number (optionally `×` or a `k`/`M`/`G` suffix): `Some(digits)`.
fn numeric(label: &str) -> Option<&str> {
    let core = label.trim_end_matches(['×', 'k', 'M', 'G']);
    (!core.is_empty() && core.parse::<f64>().is_ok()).then_some(core)
}

/// A raw float: a trailing zero after the point (`200.0`, `0.50`) or more than four significant
/// digits (`3500000`, `7179.119`).
fn raw_float(core: &str) -> bool {
    if core.contains('e') {
        return false;
    }
    let trailing_zero = core.contains('.') && core.ends_with('0');
    let significant = core
        .trim_start_matches('-')
        .replace('.', "")
        .trim_start_matches('0')
        .len();
    trailing_zero || significant > 4
}

fn assert_axis_labels_read(html: &str, what: &str) {
    let labels = svg_texts(html);
    let numbers: Vec<&String> = labels.iter().filter(|l| numeric(l).is_some()).collect();
    assert!(
        numbers.len() >= 5,
        "{what}: too few numeric labels to judge: {labels:?}"
    );
    for l in numbers {
        let core = numeric(l).expect("numeric");
        assert!(!raw_float(core), "{what}: raw axis label {l:?}");
    }
}

/// The text of the verdict's `data-figure` span `name`.
fn figure(html: &str, name: &str) -> String {
    let key = format!("data-figure=\"{name}\">");
    let at = html
        .find(&key)
        .unwrap_or_else(|| panic!("no figure {name}"))
        + key.len();
    html[at..]
        .split('<')
        .next()
        .expect("figure text")
        .to_string()
}

fn number(text: &str) -> f64 {
    let t: String = text
        .chars()
        .filter(|c| c.is_ascii_digit() || *c == '.' || *c == '-')
        .collect();
    t.parse()
        .unwrap_or_else(|_| panic!("not a number: {text:?}"))
}

/// `"136 ms"` or `"26.3 s"` in ms.
fn ms(text: &str) -> f64 {
    if text.ends_with(" ms") {
        number(text)
    } else {
        assert!(text.ends_with(" s"), "time without unit: {text:?}");
        number(text) * 1000.0
    }
}

fn close(got: f64, want: f64, tol: f64, what: &str) {
    assert!(
        (got - want).abs() <= tol,
        "{what}: page shows {got}, the files give {want}"
    );
}

/// The verdict line ends inside the first screen; with `KVBENCH_REPORT_SHOTS` set, keeps a PNG.
fn verdict_in_first_screen(page: &Path, name: &str) {
    if let Ok(dir) = std::env::var("KVBENCH_REPORT_SHOTS") {
        std::fs::create_dir_all(&dir).expect("shots dir");
        screenshot(page, &Path::new(&dir).join(format!("{name}.png")));
    }
    let Some(dom) = render(page) else { return };
    let marker = check_marker(&dom);
    assert!(marker.contains("data-status=\"ok\""), "{name}: {marker}");
    let bottom = marker_number(&marker, "data-verdict-bottom")
        .unwrap_or_else(|| panic!("{name}: no verdict on the page: {marker}"));
    let viewport = marker_number(&marker, "data-viewport").expect("viewport");
    // Headless Chromium keeps some of the window for itself: the viewport is at most the window.
    assert!(
        viewport > 500 && viewport <= i64::from(SCREEN.1),
        "{name}: {marker}"
    );
    assert!(
        bottom > 0 && bottom <= viewport,
        "{name}: the verdict ends at {bottom} px, below the first screen ({viewport} px)"
    );
}

type Row = BTreeMap<String, String>;

fn csv_rows(path: &Path) -> Vec<Row> {
    let mut r = csv::Reader::from_path(path).expect("csv");
    let head = r.headers().expect("header").clone();
    r.records()
        .map(|rec| {
            let rec = rec.expect("row");
            head.iter()
                .zip(rec.iter())
                .map(|(h, v)| (h.to_string(), v.to_string()))
                .collect()
        })
        .collect()
}

fn ns(ms: &str) -> u64 {
    let (i, f) = ms.split_once('.').unwrap_or((ms, ""));
    i.parse::<u64>().expect("ms") * 1_000_000 + format!("{f:0<6}").parse::<u64>().expect("frac")
}

#[test]
fn the_run_verdict_is_recomputed_from_the_folders_files() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("run");
    run_sim("scenarios/quick-mixed.toml", &out, &[]);
    let html = read(&out.join("report.html"));
    assert!(
        html.find("id=\"verdict\"") < html.find("<table"),
        "the verdict comes before the table"
    );
    let mut summary: serde_json::Value =
        serde_json::from_str(&read(&out.join("summary.json"))).expect("summary");
    let run = |mode: &str| -> serde_json::Value {
        summary["runs"]
            .as_array()
            .expect("runs")
            .iter()
            .find(|r| r["cache"] == mode)
            .expect("mode")
            .clone()
    };
    let (p, c) = (run("paged"), run("contiguous"));
    let f = |r: &serde_json::Value, k: &str| r[k].as_f64().expect(k);

    // Throughput from requests.csv: every output token over the mode's duration.
    let rows = csv_rows(&out.join("requests.csv"));
    let tokens = |mode: &str| -> f64 {
        rows.iter()
            .filter(|r| r["cache"] == mode)
            .map(|r| r["output_tokens"].parse::<f64>().expect("tokens"))
            .sum()
    };
    let tput_p = tokens("paged") / f(&p, "duration_s");
    let tput_c = tokens("contiguous") / f(&c, "duration_s");
    close(
        number(&figure(&html, "throughput_ratio")),
        tput_p / tput_c,
        0.006,
        "throughput ratio",
    );
    close(
        number(&figure(&html, "throughput_paged")),
        tput_p,
        0.6,
        "paged throughput",
    );
    let good_ratio = f(&p, "goodput_requests_per_s") / f(&c, "goodput_requests_per_s");
    close(
        number(&figure(&html, "goodput_ratio")),
        good_ratio,
        0.006,
        "goodput ratio",
    );
    assert!(good_ratio > 1.01 && html.contains("<b>Paging pays here</b> (by goodput)"));

    // TTFT p99 from requests.csv (nearest rank), within the summary's histogram precision and
    // the page's three significant digits.
    for mode in ["paged", "contiguous"] {
        let mut ttft: Vec<u64> = rows
            .iter()
            .filter(|r| r["cache"] == mode && r["status"] != "rejected")
            .filter(|r| !r["first_token_ms"].is_empty())
            .map(|r| ns(&r["first_token_ms"]) - ns(&r["arrival_ms"]))
            .collect();
        ttft.sort_unstable();
        let rank = (ttft.len() as f64 * 0.99).ceil() as usize - 1;
        let want = ttft[rank] as f64 / 1e6;
        let got = ms(&figure(&html, &format!("ttft_p99_{mode}")));
        close(got, want, want * 0.02, &format!("{mode} TTFT p99"));
    }
    // summary.json carries the scenario's own SLO, and the page reads it from there.
    assert!(
        summary["slo"]["attainment"].as_f64().is_some(),
        "slo in summary.json"
    );
    assert!(
        !html.contains("SLO: not recorded"),
        "the recorded SLO is read"
    );
    assert_eq!(
        html.matches("met it").count() + html.matches("missed it").count(),
        2
    );
    // A folder whose summary.json states no SLO says so rather than guessing one.
    let mut bare = summary.clone();
    bare.as_object_mut().expect("object").remove("slo");
    std::fs::write(out.join("summary.json"), bare.to_string()).expect("write");
    let (code, text) = kvbench(&["report", out.to_str().expect("utf-8")]);
    assert_eq!(code, 0, "{text}");
    assert!(read(&out.join("report.html")).contains("SLO: not recorded"));

    // With the SLO recorded, the line states it with units and whether each mode met it.
    let attainment = |r: &serde_json::Value| {
        (f(r, "goodput_requests_per_s") * f(r, "duration_s")).round()
            / r["requests"]["total"].as_f64().expect("total")
    };
    for (target, word) in [(0.5, "met it"), (0.99, "missed it")] {
        summary["slo"] = serde_json::json!({
            "ttft_p99_ms": 2000.0, "itl_p99_ms": 200.0, "attainment": target
        });
        std::fs::write(out.join("summary.json"), summary.to_string()).expect("write");
        let (code, text) = kvbench(&["report", out.to_str().expect("utf-8")]);
        assert_eq!(code, 0, "{text}");
        let html = read(&out.join("report.html"));
        assert!(
            html.contains("TTFT ≤ 2 s and time per output token ≤ 200 ms per request"),
            "{html}"
        );
        for (mode, r) in [("paged", &p), ("contiguous", &c)] {
            let a = attainment(r);
            assert_eq!(a >= target, word == "met it", "{mode} {a} vs {target}");
            close(
                number(&figure(&html, &format!("attainment_{mode}"))),
                100.0 * a,
                0.06,
                &format!("{mode} attainment"),
            );
        }
        assert_eq!(html.matches(word).count(), 2, "{word}: {html}");
    }
    // A run whose own checks failed says so before any figure.
    summary["checks"] = serde_json::json!({"ok": false, "failures": ["planted leak"]});
    std::fs::write(out.join("summary.json"), summary.to_string()).expect("write");
    let (code, text) = kvbench(&["report", out.to_str().expect("utf-8")]);
    assert_eq!(code, 0, "{text}");
    let html = read(&out.join("report.html"));
    let verdict = &html[html.find("id=\"verdict\"").expect("verdict")..];
    assert!(
        verdict.find("Checks FAILED") < verdict.find("Paging pays here"),
        "{verdict}"
    );
    verdict_in_first_screen(&out.join("report.html"), "run");
}

#[test]
fn every_page_opens_with_its_verdict_and_reads_its_axes() {
    let tmp = tempfile::tempdir().expect("tempdir");
    // A run page, its memory as per-step rows and as interval maxima.
    for (name, extra) in [
        ("run", &[][..]),
        ("run-intervals", &["--memory-resolution-ms", "20"][..]),
    ] {
        let out = tmp.path().join(name);
        run_sim("scenarios/quick-mixed.toml", &out, extra);
        let html = read(&out.join("report.html"));
        assert!(
            html.contains("time to first token (ms), log scale"),
            "{name}"
        );
        assert!(html.contains("cached free: blocks no running sequence holds"));
        assert_axis_labels_read(&html, name);
        verdict_in_first_screen(&out.join("report.html"), name);
    }
    // The sweep page, from the fixture.
    let sweep = tmp.path().join("sweep");
    std::fs::create_dir_all(&sweep).expect("mkdir");
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sweep/sweep.json"),
        sweep.join("sweep.json"),
    )
    .expect("copy");
    let (code, text) = kvbench(&["report", sweep.to_str().expect("utf-8")]);
    assert_eq!(code, 0, "{text}");
    let html = read(&sweep.join("report.html"));
    let s: serde_json::Value =
        serde_json::from_str(&read(&sweep.join("sweep.json"))).expect("json");
    close(
        number(&figure(&html, "throughput_at_target_ratio")),
        s["ratio_paged_over_contiguous"].as_f64().expect("ratio"),
        0.006,
        "sweep ratio",
    );
    // The fixture's TTFT runs past 10 s: that axis reads in s; the gap stays in ms.
    for label in ["target 0.5 s", "target 50 ms", "p99 TTFT (s), log scale"] {
        assert!(html.contains(label), "sweep: {label}");
    }
    assert_axis_labels_read(&html, "sweep");
    verdict_in_first_screen(&sweep.join("report.html"), "sweep");

    // A suite at two seeds: per scenario the mean of the per-seed goodput ratios.
    let suite = tmp.path().join("suite");
    let (code, text) = kvbench(&[
        "suite",
        "scenarios/quick-basic.toml",
        "scenarios/quick-mixed.toml",
        "--backend",
        "sim",
        "--seeds",
        "2",
        "--check-every",
        "0",
        "--out",
        suite.to_str().expect("utf-8"),
    ]);
    assert_eq!(code, 0, "{text}");
    let html = read(&suite.join("report.html"));
    let rows = csv_rows(&suite.join("suite.csv"));
    let mut ratios: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for p in rows.iter().filter(|r| r["cache"] == "paged") {
        let c = rows
            .iter()
            .find(|r| {
                r["cache"] == "contiguous"
                    && r["scenario"] == p["scenario"]
                    && r["seed"] == p["seed"]
            })
            .expect("pair");
        let g = |r: &Row| r["goodput_requests_per_s"].parse::<f64>().expect("goodput");
        ratios
            .entry(p["scenario"].clone())
            .or_default()
            .push(g(p) / g(c));
    }
    let mut order: Vec<(String, f64)> = ratios
        .iter()
        .map(|(s, v)| (s.clone(), v.iter().sum::<f64>() / v.len() as f64))
        .collect();
    order.sort_by(|a, b| b.1.total_cmp(&a.1));
    let table = &html[html
        .find("<table class=\"compact\">")
        .expect("compact table")..];
    let mut last = 0;
    for (scenario, mean) in &order {
        let row = table
            .find(&format!("<td>{scenario}</td>"))
            .unwrap_or_else(|| panic!("{scenario} row"));
        assert!(row >= last, "rows sorted by goodput ratio");
        last = row;
        let cells = &table[row..];
        assert!(
            cells.contains(&format!("{mean:.2} [")),
            "{scenario}: mean goodput ratio {mean:.2} with an interval"
        );
    }
    assert!(
        html.find("id=\"verdict\"") < html.find("<svg "),
        "verdict first"
    );
    assert!(html.contains("p99 TTFT (ms), log scale"));
    assert_axis_labels_read(&html, "suite");
    verdict_in_first_screen(&suite.join("report.html"), "suite");

    // The cells record their scenario's SLO, so the TTFT bars draw each target; a suite whose
    // cells state none says no target is drawn.
    assert!(html.contains("Red ticks: each scenario"), "{html}");
    assert!(!html.contains("no target is drawn"));
    for entry in std::fs::read_dir(&suite).expect("suite") {
        let path = entry.expect("entry").path().join("summary.json");
        if path.is_file() {
            let mut v: serde_json::Value = serde_json::from_str(&read(&path)).expect("summary");
            v.as_object_mut().expect("object").remove("slo");
            std::fs::write(&path, v.to_string()).expect("write");
        }
    }
    let (code, text) = kvbench(&["report", suite.to_str().expect("utf-8")]);
    assert_eq!(code, 0, "{text}");
    assert!(read(&suite.join("report.html")).contains("no target is drawn"));
    for entry in std::fs::read_dir(&suite).expect("suite") {
        let cell = entry.expect("entry").path();
        let path = cell.join("summary.json");
        if !path.is_file() {
            continue;
        }
        let mut v: serde_json::Value = serde_json::from_str(&read(&path)).expect("summary");
        v["slo"] =
            serde_json::json!({"ttft_p99_ms": 200.0, "itl_p99_ms": 100.0, "attainment": 0.9});
        std::fs::write(&path, v.to_string()).expect("write");
    }
    let (code, text) = kvbench(&["report", suite.to_str().expect("utf-8")]);
    assert_eq!(code, 0, "{text}");
    let html = read(&suite.join("report.html"));
    assert!(html.contains("Red ticks: each scenario"), "{html}");
    assert!(html.contains("SLO: TTFT target"));
}

#[test]
fn raw_floats_are_told_from_readable_labels() {
    for raw in ["3500000.0", "200.0", "7179.119", "0.50", "12345"] {
        assert!(raw_float(numeric(raw).expect("numeric")), "{raw}");
    }
    for ok in ["3.5M", "200", "0.5", "10k", "1e-4", "2.38×", "1000"] {
        assert!(!raw_float(numeric(ok).expect("numeric")), "{ok}");
    }
    assert_eq!(numeric("paged (n=104)"), None);
}
