//! `report.html`: written by `kvbench run`, `suite` and `report` for run, sweep and suite folders;
//! self-contained; its plotted figures agree with the folder's files; and in headless Chromium
//! every plot draws and nothing fails to load. Without Chromium the browser checks print
//! `SKIP: chromium not installed`, unless `KVBENCH_REQUIRE_CHROMIUM=1` (CI), where they fail.

use crate::support;
use crate::support::report_browser;

use std::path::Path;

use report_browser::{browser_check, check_marker, render};
use support::{kvbench, run_sim};

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn svg_count(html: &str) -> usize {
    html.matches("<svg ").count()
}

/// No `src`/`href` pointing off the page: only the SVG namespace URI may name a host.
fn assert_self_contained(html: &str, what: &str) {
    for attr in [
        "src=\"http",
        "href=\"http",
        "src=\"//",
        "href=\"//",
        "@import",
        "url(",
    ] {
        assert!(!html.contains(attr), "{what}: external reference {attr:?}");
    }
    assert!(html.contains("default-src 'none'"), "{what}: no CSP");
}

fn summary_count(dir: &Path, cache: &str, dist: &str) -> u64 {
    let v: serde_json::Value =
        serde_json::from_str(&read(&dir.join("summary.json"))).expect("json");
    let runs = v["runs"].as_array().expect("runs");
    let run = runs
        .iter()
        .find(|r| r["cache"] == cache)
        .expect("cache run");
    run[dist]["count"].as_u64().expect("count")
}

#[test]
fn a_run_writes_a_self_contained_page_whose_plots_count_the_files_samples() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("run");
    run_sim("scenarios/quick-basic.toml", &out, &[]);
    let html = read(&out.join("report.html"));
    assert_self_contained(&html, "run page");
    // TTFT CDF, inter-token CDF, both modes' KV timelines in one plot.
    assert_eq!(svg_count(&html), 3, "{html}");
    assert!(html.contains("<h1>kvbench run: quick-basic</h1>"));
    // The legends name each mode's sample count; recount those from requests.csv and trace.jsonl
    // here and check both against summary.json's latency counts.
    let mut ttft: std::collections::BTreeMap<String, u64> = Default::default();
    let mut r = csv::Reader::from_path(out.join("requests.csv")).expect("requests.csv");
    let head = r.headers().expect("header").clone();
    let col = |n: &str| head.iter().position(|h| h == n).expect("column");
    let (cache, first, status) = (col("cache"), col("first_token_ms"), col("status"));
    for rec in r.records() {
        let rec = rec.expect("row");
        if !rec[first].is_empty() && &rec[status] != "rejected" {
            *ttft.entry(rec[cache].to_string()).or_default() += 1;
        }
    }
    let mut tokens: std::collections::BTreeMap<String, u64> = Default::default();
    let mut firsts: std::collections::BTreeMap<String, u64> = Default::default();
    for line in read(&out.join("trace.jsonl")).lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect("trace line");
        let c = v["cache"].as_str().expect("cache").to_string();
        match v["event"].as_str() {
            Some("token") => *tokens.entry(c).or_default() += 1,
            Some("first_token") => *firsts.entry(c).or_default() += 1,
            _ => {}
        }
    }
    for mode in ["paged", "contiguous"] {
        let n_ttft = ttft[mode];
        assert_eq!(
            n_ttft,
            summary_count(&out, mode, "ttft_ms"),
            "{mode} TTFT count"
        );
        assert!(
            html.contains(&format!("{mode} (n={n_ttft})")),
            "{mode} TTFT legend"
        );
        // Every token but a stream's first closes one gap.
        let n_itl = tokens[mode];
        assert_eq!(
            n_itl,
            summary_count(&out, mode, "itl_ms"),
            "{mode} gap count"
        );
        assert!(
            html.contains(&format!("{mode} (n={n_itl})")),
            "{mode} gap legend"
        );
        assert!(firsts[mode] >= n_ttft);
    }
    // Deterministic on sim, like every other file but environment.json.
    let again = tmp.path().join("again");
    run_sim("scenarios/quick-basic.toml", &again, &[]);
    assert!(
        read(&again.join("report.html")) == html,
        "report.html differs between two sim runs"
    );
    browser_check(&out.join("report.html"));
}

#[test]
fn a_requests_level_trace_says_why_there_is_no_gap_cdf() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("run");
    run_sim(
        "scenarios/quick-basic.toml",
        &out,
        &["--trace-level", "requests"],
    );
    let html = read(&out.join("report.html"));
    assert_eq!(svg_count(&html), 2);
    assert!(html.contains("no inter-token CDF"), "{html}");
}

#[test]
fn report_renders_a_sweep_folder_from_sweep_json_alone() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("sweep");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sweep/sweep.json");
    std::fs::copy(&fixture, dir.join("sweep.json")).expect("copy fixture");
    let (code, text) = kvbench(&["report", dir.to_str().expect("utf-8")]);
    assert_eq!(code, 0, "{text}");
    let html = read(&dir.join("report.html"));
    assert_self_contained(&html, "sweep page");
    // p99 TTFT and p99 gap against throughput; the fixture states no attainment target.
    assert_eq!(svg_count(&html), 2, "{html}");
    let sweep: serde_json::Value = serde_json::from_str(&read(&fixture)).expect("fixture");
    for run in sweep["runs"].as_array().expect("runs") {
        let rate = run["rate_at_target_rps"].as_f64().expect("rate");
        let tput = run["throughput_at_target_tokens_per_s"]
            .as_f64()
            .expect("tput");
        assert!(
            html.contains(&format!("<td class=\"num\">{rate:.3}</td>")),
            "rate {rate}"
        );
        assert!(
            html.contains(&format!("<td class=\"num\">{tput:.1}</td>")),
            "tput {tput}"
        );
        for p in run["probes"].as_array().expect("probes") {
            assert!(html.contains(p["verdict"].as_str().expect("verdict")));
        }
    }
    let ratio = sweep["ratio_paged_over_contiguous"]
        .as_f64()
        .expect("ratio");
    assert!(html.contains(&format!("<b>{ratio:.3}</b>")));
    browser_check(&dir.join("report.html"));
}

#[test]
fn a_sweep_over_block_sizes_plots_throughput_at_target_per_size() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("sweep");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sweep/sweep.json");
    let mut sweep: serde_json::Value = serde_json::from_str(&read(&fixture)).expect("fixture");
    // One run per mode and block size: the fixture's runs at 16, scaled copies at 8 and 32.
    let base = sweep["runs"].as_array().expect("runs").clone();
    let mut runs = Vec::new();
    for (bs, scale) in [(8u32, 0.9), (16, 1.0), (32, 0.95)] {
        for r in &base {
            let mut r = r.clone();
            r["block_size"] = bs.into();
            let t = r["throughput_at_target_tokens_per_s"]
                .as_f64()
                .expect("tput");
            r["throughput_at_target_tokens_per_s"] = (t * scale).into();
            runs.push(r);
        }
    }
    sweep["runs"] = runs.into();
    std::fs::write(dir.join("sweep.json"), sweep.to_string()).expect("write");
    let (code, text) = kvbench(&["report", dir.to_str().expect("utf-8")]);
    assert_eq!(code, 0, "{text}");
    let html = read(&dir.join("report.html"));
    assert!(
        html.contains("Block size against throughput at target"),
        "{html}"
    );
    assert_eq!(svg_count(&html), 3);
    assert!(html.contains("<h3>paged bs32</h3>"));
}

#[test]
fn a_suite_with_block_sizes_gets_a_trade_off_plot_and_cell_pages() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("suite");
    let (code, text) = kvbench(&[
        "suite",
        "scenarios/quick-basic.toml",
        "--backend",
        "sim",
        "--check-every",
        "0",
        "--set",
        "cache.block_size=[8,32]",
        "--out",
        out.to_str().expect("utf-8"),
    ]);
    assert_eq!(code, 0, "{text}");
    let html = read(&out.join("report.html"));
    assert_self_contained(&html, "suite page");
    // The ratio chart, p99 TTFT and throughput bars, and quick-basic's block-size trade-off.
    assert_eq!(svg_count(&html), 4, "{html}");
    assert!(html.contains("Block size trade-off, quick-basic"));
    for cell in ["quick-basic-bs8", "quick-basic-bs32"] {
        assert!(out.join(cell).join("report.html").is_file(), "{cell}");
        assert!(
            html.contains(&format!("href=\"{cell}/report.html\"")),
            "{cell} link"
        );
        let s: serde_json::Value =
            serde_json::from_str(&read(&out.join(cell).join("summary.json"))).expect("summary");
        let want: u64 = cell
            .trim_start_matches("quick-basic-bs")
            .parse()
            .expect("bs");
        assert_eq!(
            s["runs"][0]["block_size"].as_u64(),
            Some(want),
            "{cell} ran its size"
        );
    }
    // Re-rendering from the folder alone gives the same page.
    std::fs::remove_file(out.join("report.html")).expect("rm");
    let (code, text) = kvbench(&["report", out.to_str().expect("utf-8")]);
    assert_eq!(code, 0, "{text}");
    assert!(
        read(&out.join("report.html")) == html,
        "re-rendered suite page differs"
    );
    browser_check(&out.join("report.html"));
}

#[test]
fn report_renders_the_trimmed_reference_suite_from_its_table() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("results/reference/sim");
    let dir = tmp.path().join("reference");
    for entry in std::fs::read_dir(&src).expect("reference") {
        let entry = entry.expect("entry");
        let to = dir.join(entry.file_name());
        if entry.path().is_dir() {
            std::fs::create_dir_all(&to).expect("mkdir");
            for f in std::fs::read_dir(entry.path()).expect("cell") {
                let f = f.expect("file");
                std::fs::copy(f.path(), to.join(f.file_name())).expect("copy");
            }
        } else {
            std::fs::create_dir_all(&dir).expect("mkdir");
            std::fs::copy(entry.path(), &to).expect("copy");
        }
    }
    let (code, text) = kvbench(&["report", dir.to_str().expect("utf-8")]);
    assert_eq!(code, 0, "{text}");
    let html = read(&dir.join("report.html"));
    // The compact table: a header and one row per scenario (the reference runs one seed, one
    // block size, both modes: two suite.csv rows a scenario).
    let rows = read(&dir.join("suite.csv")).lines().count() - 1;
    assert_eq!(
        html.matches("<tr>").count(),
        rows / 2 + 1,
        "one table row per scenario"
    );
    assert_eq!(
        svg_count(&html),
        3,
        "the ratio chart, p99 TTFT and throughput bars"
    );
    assert!(
        html.contains("<li>chat-8b-h200</li>"),
        "trimmed cells listed without links"
    );
}

#[test]
fn report_refuses_a_folder_that_holds_no_results() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (code, text) = kvbench(&["report", tmp.path().to_str().expect("utf-8")]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("not a results folder"), "{text}");
}

#[test]
fn the_browser_check_catches_an_empty_plot_and_a_failed_load() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("run");
    run_sim(
        "scenarios/quick-basic.toml",
        &out,
        &["--trace-level", "requests"],
    );
    let html = read(&out.join("report.html"));
    let broken = html.replacen(
        "</body>",
        "<svg width=\"10\" height=\"10\"></svg><img src=\"missing.png\"></body>",
        1,
    );
    let page = tmp.path().join("broken.html");
    std::fs::write(&page, broken).expect("write");
    let Some(dom) = render(&page) else { return };
    let marker = check_marker(&dom);
    assert!(marker.contains("data-status=\"failed\""), "{marker}");
    assert!(marker.contains("is empty"), "{marker}");
    assert!(marker.contains("missing.png"), "{marker}");
}

/// The `<svg>` of the figure that follows `marker` (a plot title) in `html`.
fn svg_after<'a>(html: &'a str, marker: &str) -> &'a str {
    let at = html
        .find(marker)
        .unwrap_or_else(|| panic!("no {marker:?} in the page"));
    let start = html[..at].rfind("<svg").expect("an svg around the title");
    let end = at + html[at..].find("</svg>").expect("its end");
    &html[start..end]
}

#[test]
fn a_suite_over_host_tier_capacities_plots_hit_share_and_ttft_from_each_cells_summary() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("suite");
    let caps = ["256 KiB", "1 MiB"];
    let (code, text) = kvbench(&[
        "suite",
        "scenarios/quick-tiered.toml",
        "--backend",
        "sim",
        "--check-every",
        "0",
        "--set",
        &format!(
            "cache.host_tier.capacity=[\"{}\", \"{}\"]",
            caps[0], caps[1]
        ),
        "--out",
        out.to_str().expect("utf-8"),
    ]);
    assert_eq!(code, 0, "{text}");
    let html = read(&out.join("report.html"));
    assert_self_contained(&html, "suite page");
    // The embedded points: one per cell, each a copy of its summary.json's paged run.
    let open = "<script type=\"application/json\" class=\"tier-capacity-data\" data-scenario=\"quick-tiered\"";
    let at = html.find(open).expect("the embedded data");
    let body = &html[at..];
    let json = &body[body.find('>').expect(">") + 1..body.find("</script>").expect("end")];
    let points: Vec<serde_json::Value> = serde_json::from_str(json).expect("points");
    assert_eq!(points.len(), caps.len(), "{json}");
    let mut achieved = Vec::new();
    for (p, cap) in points.iter().zip(caps) {
        let dir = out.join(format!("quick-tiered-host{}", cap.replace(' ', "")));
        assert_eq!(p["dir"].as_str(), dir.file_name().and_then(|n| n.to_str()));
        assert_eq!(p["host_tier"], cap);
        let s: serde_json::Value =
            serde_json::from_str(&read(&dir.join("summary.json"))).expect("summary");
        let paged = s["runs"]
            .as_array()
            .expect("runs")
            .iter()
            .find(|r| r["cache"] == "paged")
            .expect("paged run");
        let pc = &paged["prefix_cache"];
        for (key, want) in [
            ("capacity_bytes", &paged["tiers"][0]["capacity_bytes"]),
            ("achieved_hit_rate", &pc["achieved_hit_rate"]),
            ("optimum_hit_rate", &pc["bounds"]["optimum_hit_rate"]),
            ("ceiling_hit_rate", &pc["bounds"]["ceiling_hit_rate"]),
            ("ttft_p50_ms", &paged["ttft_ms"]["p50"]),
            ("ttft_p99_ms", &paged["ttft_ms"]["p99"]),
        ] {
            assert!(want.is_number(), "{}: {key} missing", dir.display());
            assert_eq!(&p[key], want, "{}: {key}", dir.display());
        }
        let (a, o, c) = (
            p["achieved_hit_rate"].as_f64().expect("achieved"),
            p["optimum_hit_rate"].as_f64().expect("optimum"),
            p["ceiling_hit_rate"].as_f64().expect("ceiling"),
        );
        assert!(
            o >= a && c >= o,
            "{cap}: achieved {a}, optimum {o}, ceiling {c}"
        );
        achieved.push(a);
    }
    assert!(
        achieved[1] > achieved[0],
        "the larger tier keeps more heads: {achieved:?}"
    );
    // The plots draw those points: three series of hit share (a marker per point each), named
    // in the legend, and TTFT p50 and p99.
    let share = svg_after(
        &html,
        "Prefix hit share against host-tier capacity, quick-tiered",
    );
    for label in ["achieved", "offline optimum", "infinite-cache ceiling"] {
        assert!(share.contains(&format!("\n{label}\n")), "legend {label}");
    }
    assert_eq!(share.matches("<circle").count(), 3 * caps.len(), "{share}");
    let ttft = svg_after(&html, "TTFT against host-tier capacity, quick-tiered");
    for label in ["TTFT p50", "TTFT p99"] {
        assert!(ttft.contains(&format!("\n{label}\n")), "legend {label}");
    }
    assert_eq!(ttft.matches("<circle").count(), 2 * caps.len(), "{ttft}");
    browser_check(&out.join("report.html"));
}
