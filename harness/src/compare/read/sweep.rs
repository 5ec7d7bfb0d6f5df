//! A sweep folder (`sweep.json`) read into comparable metrics, each headline checked against
//! the per-seed figures it summarizes.

use super::*;

/// A sweep run's headline figure and the per-seed fields it is computed from.
struct SweepFigure {
    name: &'static str,
    /// The per-seed figure the headline is the mean of.
    seed_key: &'static str,
    bracket_key: &'static str,
}

const SWEEP_FIGURES: [SweepFigure; 2] = [
    SweepFigure {
        name: "rate_at_target_rps",
        seed_key: "rate_at_target_rps",
        bracket_key: "rate_bracket_rps",
    },
    SweepFigure {
        name: "throughput_at_target_tokens_per_s",
        seed_key: "throughput_at_target_tokens_per_s",
        bracket_key: "throughput_bracket_tokens_per_s",
    },
];

pub(super) fn read_sweep(dir: &Path) -> Result<Folder, CompareError> {
    let path = dir.join("sweep.json");
    let j = read_json(&path)?;
    let file = path.display().to_string();
    let mut problems = Vec::new();
    let scenario = text(&j, "scenario", &path)?;
    let mut identity = Identity::default();
    let mut seeds: Vec<u64> = Vec::new();
    for s in field(&j, "seeds", &path)?.as_array().into_iter().flatten() {
        match s.as_u64() {
            Some(x) if seeds.contains(&x) => {
                problems.push(format!("{file}: seed {x} listed twice"))
            }
            Some(x) => seeds.push(x),
            None => problems.push(format!("{file}: seeds: {s} is not a seed")),
        }
    }
    if seeds.is_empty() {
        problems.push(format!("{file}: no seeds"));
    }
    let hashes: Vec<String> = match j.get("workload_hashes").and_then(Value::as_array) {
        Some(a) => a
            .iter()
            .filter_map(|h| h.as_str().map(str::to_string))
            .collect(),
        None => vec![text(&j, "workload_hash", &path)?],
    };
    if hashes.len() != seeds.len() {
        problems.push(format!(
            "{file}: {} workload hashes for {} seeds",
            hashes.len(),
            seeds.len()
        ));
    }
    for (seed, h) in seeds.iter().zip(hashes) {
        identity.workloads.insert((scenario.clone(), *seed), h);
    }
    let definition = match j.get("definition_hash") {
        Some(d) => d.as_str().unwrap_or_default().to_string(),
        None => field(&j, "slo", &path)?.to_string(),
    };
    identity.definitions.insert(scenario.clone(), definition);
    identity.axis.insert(
        scenario.clone(),
        format!(
            "by {} slo {}",
            text(&j, "by", &path)?,
            field(&j, "slo", &path)?
        ),
    );
    if let Some(d) = j.get("device").and_then(Value::as_str) {
        identity.devices.insert(scenario.clone(), d.to_string());
    }
    match j.get("checks_ok") {
        Some(Value::Bool(true)) => {}
        Some(Value::Bool(false)) => problems.push(format!(
            "{file}: the sweep's own checks failed (checks_ok: false{})",
            failures_note(j.get("check_failures"))
        )),
        _ => problems.push(format!(
            "{file}: no checks_ok: whether its checks passed is unknown"
        )),
    }
    let mut metrics = Vec::new();
    let mut caches = BTreeSet::new();
    for run in field(&j, "runs", &path)?.as_array().into_iter().flatten() {
        let cache = text(run, "cache", &path)?;
        if !caches.insert(cache.clone()) {
            problems.push(format!("{file}: cache mode {cache} appears twice in runs"));
            continue;
        }
        let seeds_json = run.get("per_seed").and_then(Value::as_array);
        let listed: Vec<u64> = seeds_json
            .into_iter()
            .flatten()
            .filter_map(|s| s.get("seed").and_then(Value::as_u64))
            .collect();
        let distinct: BTreeSet<u64> = listed.iter().copied().collect();
        if distinct.len() != listed.len() {
            problems.push(format!("{file}: {cache}: a seed appears twice in per_seed"));
        }
        if distinct != seeds.iter().copied().collect::<BTreeSet<u64>>() {
            problems.push(format!(
                "{file}: {cache}: per_seed holds seeds {listed:?}, the sweep ran {seeds:?}"
            ));
        }
        for fig in &SWEEP_FIGURES {
            let what = format!("{file}: {cache} {}", fig.name);
            let point = figure(run.get(fig.name), &what, &mut problems);
            let ci = pair(run.get(format!("{}_ci", fig.name)));
            let mut per_seed = BTreeMap::new();
            let mut seed_figures = Vec::new();
            for s in seeds_json.into_iter().flatten() {
                let Some(seed) = s.get("seed").and_then(Value::as_u64) else {
                    continue;
                };
                let x = figure(
                    s.get(fig.seed_key),
                    &format!("{what} seed {seed}"),
                    &mut problems,
                );
                let bracket = pair(s.get(fig.bracket_key));
                if let (Some(x), Some([lo, hi])) = (x, bracket) {
                    if !(lo - x <= 1e-9 * x.abs().max(1.0) && x - hi <= 1e-9 * x.abs().max(1.0)) {
                        problems.push(format!(
                            "{what} seed {seed}: {x} lies outside its own bracket [{lo}, {hi}]"
                        ));
                    }
                }
                if let Some(b) = bracket {
                    per_seed.insert(seed, b);
                }
                seed_figures.push(x);
            }
            match point {
                Some(p) => {
                    let ci = match ci {
                        Some(ci) => ci,
                        None => {
                            problems.push(format!("{what}_ci: missing or not [low, high]"));
                            [p, p]
                        }
                    };
                    if !(ci[0] - p <= 1e-9 * p.abs().max(1.0)
                        && p - ci[1] <= 1e-9 * p.abs().max(1.0))
                    {
                        problems.push(format!(
                            "{what}: the headline {p} lies outside its own interval [{}, {}]",
                            ci[0], ci[1]
                        ));
                    }
                    let xs: Option<Vec<f64>> = seed_figures.iter().copied().collect();
                    match xs.filter(|xs| !xs.is_empty()) {
                        Some(xs) => {
                            let mean = crate::stats::mean_sd(&xs).0;
                            if !close(mean, p) {
                                problems.push(format!(
                                    "{what}: the headline {p} is not the mean {mean} of its per-seed figures"
                                ));
                            }
                        }
                        None => problems.push(format!(
                            "{what}: a headline {p} where some seed has no figure"
                        )),
                    }
                    metrics.push(Metric {
                        scenario: scenario.clone(),
                        cache: cache.clone(),
                        name: fig.name.into(),
                        better: Better::Higher,
                        gated: true,
                        value: Some(p),
                        lo: ci[0],
                        hi: ci[1],
                        n: seed_figures.len(),
                        per_seed,
                    });
                }
                None => {
                    if !seed_figures.is_empty() && seed_figures.iter().all(Option::is_some) {
                        problems.push(format!("{what}: no headline where every seed has a figure"));
                    }
                    metrics.push(Metric {
                        scenario: scenario.clone(),
                        cache: cache.clone(),
                        name: fig.name.into(),
                        better: Better::Higher,
                        gated: true,
                        value: None,
                        lo: f64::NAN,
                        hi: f64::NAN,
                        n: seed_figures.len(),
                        per_seed,
                    });
                }
            }
        }
    }
    Ok(Folder {
        path: dir.to_path_buf(),
        kind: Kind::Sweep,
        backend: text(&j, "backend", &path)?,
        metrics,
        identity,
        problems,
    })
}
