//! `kvbench tune` end to end on `sim`: a scenario whose optimum is known, `tune.md` recomputed
//! from `tune.json`, the best reproduced by `sweep` with the printed `--set` line, a spent
//! budget reported, and bad `--space` files refused (exit 2, located, nothing written).
//! `report.html` is checked in the same runs: one chart per knob tried at two values around a
//! best, and every rate in its table the one `tune.json` holds.

use crate::support;

use std::path::Path;

use kvbench::tune::write::{markdown, ConfigJson, TuneJson};
use serde_json::Value;
use support::kvbench;
use support::tune_small::TUNE_SMALL;

fn files(dir: &Path, space: &str) -> (String, String) {
    let s = dir.join("small.toml");
    std::fs::write(&s, TUNE_SMALL).unwrap();
    let sp = dir.join("space.toml");
    std::fs::write(&sp, space).unwrap();
    (s.display().to_string(), sp.display().to_string())
}

fn read_json(out: &Path) -> (TuneJson, Value) {
    let text = std::fs::read_to_string(out.join("tune.json")).unwrap();
    (
        serde_json::from_str(&text).unwrap(),
        serde_json::from_str(&text).unwrap(),
    )
}

/// The best per mode recomputed from the rows alone: the highest rate, the rows whose
/// interval overlaps it, and among those the fewest knobs moved, then the smaller block size,
/// then the higher rate.
fn recomputed_best(j: &TuneJson, cache: &str) -> Option<usize> {
    let rows: Vec<usize> = (0..j.configurations.len())
        .filter(|&i| j.configurations[i].cache == cache)
        .filter(|&i| j.configurations[i].rate_at_target_rps.is_some())
        .collect();
    let lo = |i: usize| j.configurations[i].rate_at_target_rps.unwrap();
    let hi = |i: usize| {
        j.configurations[i]
            .lowest_failing_rps
            .unwrap_or(f64::INFINITY)
    };
    let top = rows
        .iter()
        .copied()
        .max_by(|&x, &y| lo(x).total_cmp(&lo(y)))?;
    rows.iter()
        .copied()
        .filter(|&i| hi(i) > lo(top) && hi(top) > lo(i))
        .min_by(|&x, &y| {
            let c = |i: usize| &j.configurations[i];
            c(x).knobs_away
                .cmp(&c(y).knobs_away)
                .then(
                    c(x).block_size
                        .unwrap_or(0.0)
                        .total_cmp(&c(y).block_size.unwrap_or(0.0)),
                )
                .then(lo(y).total_cmp(&lo(x)))
        })
}

/// The knobs a chart is due for, recomputed from the rows: per mode, the configurations that
/// equal that mode's best in every other knob, holding at least two values of this one.
fn knobs_with_two_values_around_a_best(j: &TuneJson) -> usize {
    j.space
        .iter()
        .filter(|k| {
            let mut seen: Vec<&str> = Vec::new();
            for m in &j.modes {
                let Some(b) = m.best.map(|i| &j.configurations[i]) else {
                    continue;
                };
                let others_equal = |c: &ConfigJson| {
                    b.values
                        .iter()
                        .all(|(key, v)| *key == k.key || c.values.get(key) == Some(v))
                };
                for c in j.configurations.iter().filter(|c| c.cache == b.cache) {
                    if others_equal(c) && !seen.contains(&c.values[&k.key].as_str()) {
                        seen.push(&c.values[&k.key]);
                    }
                }
            }
            seen.len() >= 2
        })
        .count()
}

/// The text of each `<td>` of each row in the table after `heading`.
fn table_rows(html: &str, heading: &str) -> Vec<Vec<String>> {
    let at = html.find(heading).expect("the heading") + heading.len();
    let body = &html[at..];
    let body = &body[..body.find("</table>").expect("the table ends")];
    body.split("<tr>")
        .filter(|r| r.contains("<td"))
        .map(|r| {
            r.split("<td")
                .skip(1)
                .map(|cell| {
                    let inner = &cell[cell.find('>').unwrap() + 1..cell.find("</td>").unwrap()];
                    // Drop inline tags (`<code>`): the cell's text.
                    let mut text = String::new();
                    let mut in_tag = false;
                    for ch in inner.chars() {
                        match ch {
                            '<' => in_tag = true,
                            '>' => in_tag = false,
                            c if !in_tag => text.push(c),
                            _ => {}
                        }
                    }
                    text
                })
                .collect()
        })
        .collect()
}

/// `report.html`: a page, one chart per knob tried at two values around a best, and each row of
/// its table of configurations holding that configuration's verdict and rate from `tune.json`.
/// Returns the number of charts.
fn check_report_html(out: &Path, j: &TuneJson) -> usize {
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>"), "{}", &html[..80]);
    assert!(html.trim_end().ends_with("</html>"));
    // `<svg ` with its space: the page's inline check script holds `i<svgs.length`.
    let charts = html.matches("<svg ").count();
    assert_eq!(charts, html.matches("</svg>").count());
    assert_eq!(charts, knobs_with_two_values_around_a_best(j));
    let rows = table_rows(&html, "<h2>Every configuration tried</h2>");
    assert_eq!(rows.len(), j.configurations.len(), "{rows:?}");
    let head = [
        "#",
        "cache",
        "verdict",
        "configuration",
        "knobs moved",
        "rate at target (req/s)",
    ];
    for row in &rows {
        assert!(row.len() >= head.len(), "{row:?}");
        let c = &j.configurations[row[0].parse::<usize>().unwrap()];
        assert_eq!(row[1], c.cache, "{row:?}");
        assert_eq!(row[2], c.verdict.name(), "{row:?}");
        match c.rate_at_target_rps {
            None => assert_eq!(row[5], "-", "{row:?}"),
            Some(r) => {
                let printed: f64 = row[5].parse().unwrap_or_else(|_| panic!("{row:?}"));
                // Printed to three decimals: within half of the last one.
                assert!((printed - r).abs() <= 0.0005 + 1e-12, "{row:?} vs {r}");
            }
        }
    }
    // Every row is a different configuration.
    let mut idx: Vec<&String> = rows.iter().map(|r| &r[0]).collect();
    idx.sort();
    idx.dedup();
    assert_eq!(idx.len(), rows.len());
    // The page is a function of tune.json alone.
    assert_eq!(html, kvbench::tune::html::report(j).unwrap());
    charts
}

/// `kvbench tune SCENARIO --space SPACE [extra...] --out OUT`.
fn tune(scenario: &str, space: &str, out: &Path, extra: &[&str]) -> (i32, String) {
    let mut args = vec!["tune", scenario, "--space", space];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--out", out.to_str().unwrap()]);
    kvbench(&args)
}

#[test]
fn finds_the_known_optimum_and_every_figure_in_tune_md_comes_from_tune_json() {
    let dir = tempfile::tempdir().unwrap();
    let (scenario, space) = files(dir.path(), "scheduler.max_seqs_per_step = [1, 4, 8]\n");
    let out = dir.path().join("out");
    let (code, text) = tune(&scenario, &space, &out, &["--backend", "sim"]);
    assert_eq!(code, 0, "{text}");
    let (j, raw) = read_json(&out);
    assert_eq!(j.modes.len(), 2);
    for m in &j.modes {
        let best = &j.configurations[m.best.expect("a best")];
        assert_eq!(
            best.values["scheduler.max_seqs_per_step"], "8",
            "{}",
            m.cache
        );
        assert_eq!(m.best, recomputed_best(&j, &m.cache), "{}", m.cache);
        assert_eq!(
            m.best_set.as_deref(),
            Some("--set scheduler.max_seqs_per_step=8")
        );
        assert!(
            text.contains(&format!(
                "reproduce: kvbench sweep {scenario} --backend sim --set scheduler.max_seqs_per_step=8"
            )),
            "{text}"
        );
        // The rate rises with the knob: each searched value above the one below it.
        let mut searched: Vec<(i64, f64)> = j
            .configurations
            .iter()
            .filter(|c| c.cache == m.cache)
            .filter_map(|c| {
                Some((
                    c.values["scheduler.max_seqs_per_step"].parse().ok()?,
                    c.rate_at_target_rps?,
                ))
            })
            .collect();
        searched.sort_by_key(|x| x.0);
        assert!(searched.len() >= 2, "{searched:?}");
        assert!(searched.windows(2).all(|w| w[1].1 > w[0].1), "{searched:?}");
        let probes: u32 = j
            .configurations
            .iter()
            .filter(|c| c.cache == m.cache)
            .map(|c| c.probes)
            .sum();
        assert_eq!(probes, m.probes);
        // Fewer configurations than the grid: 1 is pruned, below the scenario's own 2.
        assert!(j
            .configurations
            .iter()
            .any(|c| c.cache == m.cache && c.verdict.name() == "pruned"));
    }
    assert_eq!(
        j.probes,
        j.modes.iter().map(|m| m.probes).sum::<u32>(),
        "total probes"
    );
    assert_eq!(raw["budget_hit"], Value::Bool(false));
    // Every figure of tune.md: the page is a function of tune.json alone.
    let md = std::fs::read_to_string(out.join("tune.md")).unwrap();
    assert_eq!(md, markdown(&j));
    assert!(md.contains("Tie rule: "), "the tie rule is stated");
    assert_eq!(
        check_report_html(&out, &j),
        1,
        "one knob, tried at 2, 4 and 8"
    );
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    for m in &j.modes {
        assert!(
            html.contains(m.best_set.as_deref().unwrap()),
            "{}: the best's --set line",
            m.cache
        );
    }

    // The printed line reproduces the best: the sweep of that configuration brackets the same
    // rate.
    let sweep_out = dir.path().join("sweep");
    let (code, text) = kvbench(&[
        "sweep",
        &scenario,
        "--backend",
        "sim",
        "--set",
        "scheduler.max_seqs_per_step=8",
        "--out",
        sweep_out.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{text}");
    let sweep: Value =
        serde_json::from_str(&std::fs::read_to_string(sweep_out.join("sweep.json")).unwrap())
            .unwrap();
    for m in &j.modes {
        let run = sweep["runs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["cache"] == m.cache.as_str())
            .unwrap();
        let (slo, shi) = (
            run["rate_at_target_rps_ci"][0].as_f64().unwrap(),
            run["rate_at_target_rps_ci"][1].as_f64().unwrap(),
        );
        let [tlo, thi] = m.rate_at_target_rps_ci;
        assert!(
            slo < thi && tlo < shi,
            "{}: sweep [{slo}, {shi}] vs tune [{tlo}, {thi}]",
            m.cache
        );
    }

    // An existing tune folder is replaced only with --force.
    let (code, text) = tune(&scenario, &space, &out, &[]);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains("--force") || text.contains("exists"),
        "{text}"
    );
}

#[test]
fn a_spent_budget_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let (scenario, space) = files(dir.path(), "scheduler.max_seqs_per_step = [1, 4]\n");
    let out = dir.path().join("out");
    let (code, text) = tune(&scenario, &space, &out, &["--budget-s", "0.000001"]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("time budget hit"), "{text}");
    let (j, _) = read_json(&out);
    assert!(j.budget_hit);
    assert!(j
        .configurations
        .iter()
        .all(|c| c.verdict.name() == "unfinished"));
    let md = std::fs::read_to_string(out.join("tune.md")).unwrap();
    assert!(md.contains("time budget of"), "{md}");
    assert_eq!(check_report_html(&out, &j), 0, "no best, so no chart");
    // A tune folder is a results folder: --force replaces it, and nothing else is left beside.
    std::fs::write(out.join("tune.md"), "stale").unwrap();
    let (code, text) = tune(
        &scenario,
        &space,
        &out,
        &["--budget-s", "0.000001", "--force"],
    );
    assert_eq!(code, 0, "{text}");
    let md = std::fs::read_to_string(out.join("tune.md")).unwrap();
    assert!(md.starts_with("# kvbench tune: tune-small"), "{md}");
    let beside: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(beside.is_empty(), "{beside:?}");
}

#[test]
fn a_bad_space_file_exits_2_naming_file_line_and_key_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, &str); 7] = [
        ("cache.nope = [1]", "space.toml:2:7: cache.nope: "),
        (
            "traffic.requests = [10]",
            "space.toml:2:9: traffic.requests: not a knob",
        ),
        (
            "cache.block_size = 16",
            "space.toml:2:7: cache.block_size: expected a list",
        ),
        (
            "scheduler.policy = [\"decode_first\", \"fastest\"]",
            "space.toml:2:11: scheduler.policy: value \"fastest\"",
        ),
        (
            "[scheduler]\nmax_seqs_per_step = [4, 4]",
            "space.toml:3:1: scheduler.max_seqs_per_step: 4 is listed twice",
        ),
        (
            "cache.block_size = []",
            "space.toml:2:7: cache.block_size: an empty list",
        ),
        ("cache.block_size = [", "space.toml:3:1: (syntax)"),
    ];
    for (body, want) in cases {
        let (scenario, space) = files(dir.path(), &format!("# a space\n{body}\n"));
        let out = dir.path().join("out");
        let (code, text) = tune(&scenario, &space, &out, &[]);
        assert_eq!(code, 2, "{body}: {text}");
        assert!(text.contains(want), "{body}: want {want:?} in {text}");
        assert!(!out.exists(), "{body}: nothing written");
        let leftovers: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().to_string())
            .filter(|n| n.starts_with('.'))
            .collect();
        assert!(leftovers.is_empty(), "{body}: {leftovers:?}");
    }
}

/// A host-tier capacity is one value however it is spelled ("64 MiB" and "65536 KiB" would be
/// one configuration searched twice): refused like a value listed twice, before any work.
#[test]
fn a_capacity_spelled_twice_in_a_space_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (scenario, space) = files(
        dir.path(),
        "# a space\n[cache.host_tier]\ncapacity = [\"64 MiB\", \"65536 KiB\"]\n",
    );
    let out = dir.path().join("out");
    let (code, text) = tune(
        &scenario,
        &space,
        &out,
        &["--set", "scheduler.prefix_cache=true"],
    );
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains(
            "space.toml:3:1: cache.host_tier.capacity: \"64 MiB\" and \"65536 KiB\" are the same \
             size (67108864 bytes)"
        ),
        "{text}"
    );
    assert!(!out.exists(), "nothing written");
}

/// The contiguous baseline has no host tier, so its search tries the scenario as written only,
/// where the paged search tries each capacity.
#[test]
fn the_contiguous_mode_does_not_search_a_host_tier_capacity() {
    let dir = tempfile::tempdir().unwrap();
    let (scenario, space) = files(
        dir.path(),
        "[cache.host_tier]\ncapacity = [\"64 MiB\", \"128 MiB\"]\n",
    );
    let out = dir.path().join("out");
    let (code, text) = tune(
        &scenario,
        &space,
        &out,
        &["--set", "scheduler.prefix_cache=true"],
    );
    assert_eq!(code, 0, "{text}");
    let (j, _) = read_json(&out);
    let tried = |cache: &str| -> Vec<&ConfigJson> {
        j.configurations
            .iter()
            .filter(|c| c.cache == cache)
            .collect()
    };
    let contiguous = tried("contiguous");
    assert_eq!(contiguous.len(), 1, "{contiguous:?}");
    assert!(contiguous[0].set.is_empty(), "{contiguous:?}");
    assert_eq!(tried("paged").len(), 3);
}

/// A scenario where the block size alone decides the rate at target. `sim`'s step cost has no
/// block-size term (`backend/sim/cost.rs`: weights, K/V bytes read and written, FLOPs, per-step
/// and per-sequence overheads — paged attention's penalty is per byte, not per block), so a block
/// size acts only through memory: a sequence holds whole blocks, and its last block's unused
/// slots are KV the budget pays for and nobody uses. Here every request is exactly 40 tokens
/// (32 prompt + 8 output) and the KV budget is 80 MiB, 640 tokens of Llama-3-8B's 128 KiB a
/// token: at 8-token blocks a sequence holds 5 blocks and wastes nothing, so 16 sequences run
/// at once; at 16 it holds 3 (48 tokens, 13 at once), at 32 two (64 tokens, 10), at 64 one
/// (64 tokens, 10 less the admission reserve). Steps are bound by reading the weights, so the
/// rate served is proportional to the sequences running at once, and only the 8-token block
/// reaches the highest rate at the TTFT target. The scenario's own block size is 64, so the tie
/// rule (fewest knobs moved) cannot hand tune the answer: it has to measure it. Contiguous
/// reservations (prompt + output, 40 tokens each) do not depend on the block size at all.
const TUNE_BLOCK: &str = r#"name = "tune-block"
seed = 3
device = "h200"

[model]
preset = "llama3-8b"

[memory]
kv_budget = "80 MiB"

[cache]
block_size = 64
contiguous_reservation = "prompt_plus_output"
max_seq_len = 64

[traffic]
requests = 300

[traffic.arrival]
kind = "poisson"
rate_per_s = 50.0

[traffic.prompt_tokens]
dist = "uniform"
min = 32
max = 32

[traffic.output_tokens]
dist = "uniform"
min = 8
max = 8

[scheduler]
policy = "decode_first"
max_tokens_per_step = 2048
max_seqs_per_step = 256

[slo]
ttft_p99_ms = 200.0
itl_p99_ms = 100.0
"#;

/// Peak running paged sequences of one `kvbench run` of the block scenario.
fn peak_running(dir: &Path, scenario: &str, block: &str, rate: f64) -> f64 {
    let out = dir.join(format!("run-b{block}"));
    let (code, text) = kvbench(&[
        "run",
        scenario,
        "--backend",
        "sim",
        "--set",
        &format!("cache.block_size={block}"),
        "--set",
        &format!("traffic.arrival.rate_per_s={rate}"),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{text}");
    let s: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    let paged = s["runs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["cache"] == "paged")
        .expect("a paged run");
    paged["peak_running_sequences"].as_f64().unwrap()
}

#[test]
fn finds_the_only_block_size_whose_waste_leaves_room_for_the_best_rate() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("block.toml");
    std::fs::write(&scenario, TUNE_BLOCK).unwrap();
    let space = dir.path().join("space.toml");
    std::fs::write(&space, "cache.block_size = [8, 16, 32, 64]\n").unwrap();
    let scenario = scenario.display().to_string();
    let out = dir.path().join("out");
    let (code, text) = tune(
        &scenario,
        space.to_str().unwrap(),
        &out,
        &["--backend", "sim"],
    );
    assert_eq!(code, 0, "{text}");
    let (j, _) = read_json(&out);
    assert_eq!(j.modes.len(), 2, "{text}");

    // Paged: the 8-token block, away from the scenario's 64, and every other block size wholly
    // below it (its lowest failing rate at or under the rate the 8-token block passed).
    let paged = j.modes.iter().find(|m| m.cache == "paged").unwrap();
    let best_i = paged.best.expect("a paged best");
    let best = &j.configurations[best_i];
    assert_eq!(best.values["cache.block_size"], "8", "{text}");
    assert_eq!(best.knobs_away, 1);
    assert_eq!(paged.best, recomputed_best(&j, "paged"));
    assert_eq!(paged.best_set.as_deref(), Some("--set cache.block_size=8"));
    let best_rate = best.rate_at_target_rps.expect("the best passed");
    let mut paged_blocks = Vec::new();
    for (i, c) in j.configurations.iter().enumerate() {
        // Each row's figures hang together: its interval starts at its rate at target and ends
        // at its lowest failing rate, and it spent at least one probe.
        assert!(c.probes >= 1, "{i}: {c:?}");
        if let Some(r) = c.rate_at_target_rps {
            assert_eq!(c.rate_at_target_rps_ci[0], r, "{i}");
        }
        if let Some(fail) = c.lowest_failing_rps {
            assert_eq!(c.rate_at_target_rps_ci[1], fail, "{i}");
        }
        if c.cache != "paged" {
            continue;
        }
        paged_blocks.push(c.values["cache.block_size"].clone());
        if i == best_i {
            assert_eq!(c.verdict.name(), "best");
            continue;
        }
        assert!(
            matches!(c.verdict.name(), "below" | "pruned"),
            "{i}: {} is {}",
            c.values["cache.block_size"],
            c.verdict.name()
        );
        let fail = c
            .lowest_failing_rps
            .expect("failed somewhere below the best");
        assert!(
            fail <= best_rate,
            "{i}: fails at {fail}, best passes {best_rate}"
        );
    }
    paged_blocks.sort();
    assert_eq!(
        paged_blocks,
        ["16", "32", "64", "8"],
        "every block size tried"
    );

    // Contiguous: the block size moves nothing, so every value ties and the tie rule keeps the
    // scenario's own.
    let contiguous = j.modes.iter().find(|m| m.cache == "contiguous").unwrap();
    let cbest = &j.configurations[contiguous.best.expect("a contiguous best")];
    assert_eq!(cbest.knobs_away, 0);
    assert_eq!(
        contiguous.best_set.as_deref().unwrap_or(""),
        "",
        "no --set needed"
    );
    for c in j.configurations.iter().filter(|c| c.cache == "contiguous") {
        assert_eq!(c.rate_at_target_rps, cbest.rate_at_target_rps, "{c:?}");
        assert!(
            matches!(c.verdict.name(), "best" | "indistinguishable"),
            "{c:?}"
        );
    }

    // The probes add up: per mode over its rows, and over the modes to the whole search.
    for m in &j.modes {
        let rows: Vec<_> = j
            .configurations
            .iter()
            .filter(|c| c.cache == m.cache)
            .collect();
        assert_eq!(rows.len(), m.configurations, "{}", m.cache);
        assert_eq!(
            rows.iter().map(|c| c.probes).sum::<u32>(),
            m.probes,
            "{}",
            m.cache
        );
        assert_eq!(
            rows.iter().filter(|c| c.verdict.name() == "best").count(),
            1,
            "{}",
            m.cache
        );
    }
    assert_eq!(j.modes.iter().map(|m| m.probes).sum::<u32>(), j.probes);

    // The reason is the one stated above: at the best's rate, memory caps the sequences running
    // at once, 16 at 8-token blocks (640 tokens ÷ 40, no waste), fewer as the block grows.
    let peaks: Vec<f64> = ["8", "16", "32", "64"]
        .iter()
        .map(|b| peak_running(dir.path(), &scenario, b, best_rate))
        .collect();
    assert_eq!(peaks[0], 16.0, "{peaks:?}");
    assert!(
        peaks[0] > peaks[1] && peaks[1] > peaks[2] && peaks[2] >= peaks[3],
        "{peaks:?}"
    );
}
