//! The tagged tables (`dist = "..."`, `kind = "..."`) read through one flat struct each.
//!
//! serde's internally tagged enums buffer the table before choosing a variant, which loses the
//! position of every key inside it: a bad `traffic.prompt_tokens.median` was reported at the
//! `[traffic]` header, and a key the chosen variant does not use (`rate_per_s` under
//! `kind = "burst"`) was silently accepted. Reading into a flat struct keeps the parser's spans
//! for type errors; the variant's own key set is then checked here, and the messages use the
//! `unknown field` / `missing field` wording that `load` maps to the full dotted key.

use serde::Deserialize;

use super::trace_spec::{FailedRows, TraceFormat, TraceSpec};
use super::types::{ArrivalSpec, DelayDist, LengthDist};

/// The keys one variant takes, required first.
struct Variant {
    name: &'static str,
    required: &'static [&'static str],
    optional: &'static [&'static str],
}

/// `present` lists the keys written (besides the tag). Refuses unknown keys and missing ones.
fn check_keys(
    tag: &str,
    chosen: &str,
    variants: &[Variant],
    present: &[(&'static str, bool)],
) -> Result<(), String> {
    let Some(v) = variants.iter().find(|v| v.name == chosen) else {
        let known: Vec<&str> = variants.iter().map(|v| v.name).collect();
        return Err(format!(
            "invalid value for field `{tag}`: unknown {tag} `{chosen}` (known: {})",
            known.join(", ")
        ));
    };
    for (key, written) in present {
        if *written && !v.required.contains(key) && !v.optional.contains(key) {
            let mut takes: Vec<&str> = v.required.iter().chain(v.optional).copied().collect();
            if takes.is_empty() {
                takes.push("no other keys");
            }
            return Err(format!(
                "unknown field `{key}`: {tag} = \"{chosen}\" takes {}",
                takes.join(", ")
            ));
        }
    }
    for key in v.required {
        if !present.iter().any(|(k, w)| k == key && *w) {
            return Err(format!(
                "missing field `{key}` (required for {tag} = \"{chosen}\")"
            ));
        }
    }
    Ok(())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLength {
    dist: String,
    value: Option<u32>,
    min: Option<u32>,
    max: Option<u32>,
    mean: Option<f64>,
    std: Option<f64>,
    median: Option<f64>,
    sigma: Option<f64>,
    n: Option<u64>,
    s: Option<f64>,
    scale: Option<f64>,
    csv: Option<String>,
    column: Option<String>,
}

const LENGTH_VARIANTS: &[Variant] = &[
    Variant {
        name: "fixed",
        required: &["value"],
        optional: &[],
    },
    Variant {
        name: "uniform",
        required: &["min", "max"],
        optional: &[],
    },
    Variant {
        name: "normal",
        required: &["mean", "std"],
        optional: &["min", "max"],
    },
    Variant {
        name: "lognormal",
        required: &["median", "sigma"],
        optional: &["min", "max"],
    },
    Variant {
        name: "zipf",
        required: &["n", "s"],
        optional: &["scale", "min", "max"],
    },
    Variant {
        name: "empirical",
        required: &["csv", "column"],
        optional: &["min", "max"],
    },
];

impl TryFrom<RawLength> for LengthDist {
    type Error = String;

    fn try_from(r: RawLength) -> Result<LengthDist, String> {
        let present = [
            ("value", r.value.is_some()),
            ("min", r.min.is_some()),
            ("max", r.max.is_some()),
            ("mean", r.mean.is_some()),
            ("std", r.std.is_some()),
            ("median", r.median.is_some()),
            ("sigma", r.sigma.is_some()),
            ("n", r.n.is_some()),
            ("s", r.s.is_some()),
            ("scale", r.scale.is_some()),
            ("csv", r.csv.is_some()),
            ("column", r.column.is_some()),
        ];
        check_keys("dist", &r.dist, LENGTH_VARIANTS, &present)?;
        // check_keys guarantees the required keys are present; `unwrap_or_default` never applies.
        Ok(match r.dist.as_str() {
            "fixed" => LengthDist::Fixed {
                value: r.value.unwrap_or_default(),
            },
            "uniform" => LengthDist::Uniform {
                min: r.min.unwrap_or_default(),
                max: r.max.unwrap_or_default(),
            },
            "normal" => LengthDist::Normal {
                mean: r.mean.unwrap_or_default(),
                std: r.std.unwrap_or_default(),
                min: r.min,
                max: r.max,
            },
            "lognormal" => LengthDist::Lognormal {
                median: r.median.unwrap_or_default(),
                sigma: r.sigma.unwrap_or_default(),
                min: r.min,
                max: r.max,
            },
            "zipf" => LengthDist::Zipf {
                n: r.n.unwrap_or_default(),
                s: r.s.unwrap_or_default(),
                scale: r.scale.unwrap_or(1.0),
                min: r.min,
                max: r.max,
            },
            _ => LengthDist::Empirical {
                csv: r.csv.unwrap_or_default(),
                column: r.column.unwrap_or_default(),
                min: r.min,
                max: r.max,
            },
        })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDelay {
    dist: String,
    ms: Option<f64>,
    min_ms: Option<f64>,
    max_ms: Option<f64>,
    mean_ms: Option<f64>,
}

const DELAY_VARIANTS: &[Variant] = &[
    Variant {
        name: "fixed",
        required: &["ms"],
        optional: &[],
    },
    Variant {
        name: "uniform",
        required: &["min_ms", "max_ms"],
        optional: &[],
    },
    Variant {
        name: "exponential",
        required: &["mean_ms"],
        optional: &[],
    },
];

impl TryFrom<RawDelay> for DelayDist {
    type Error = String;

    fn try_from(r: RawDelay) -> Result<DelayDist, String> {
        let present = [
            ("ms", r.ms.is_some()),
            ("min_ms", r.min_ms.is_some()),
            ("max_ms", r.max_ms.is_some()),
            ("mean_ms", r.mean_ms.is_some()),
        ];
        check_keys("dist", &r.dist, DELAY_VARIANTS, &present)?;
        Ok(match r.dist.as_str() {
            "fixed" => DelayDist::Fixed {
                ms: r.ms.unwrap_or_default(),
            },
            "uniform" => DelayDist::Uniform {
                min_ms: r.min_ms.unwrap_or_default(),
                max_ms: r.max_ms.unwrap_or_default(),
            },
            _ => DelayDist::Exponential {
                mean_ms: r.mean_ms.unwrap_or_default(),
            },
        })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawArrival {
    kind: String,
    rate_per_s: Option<f64>,
    shape: Option<f64>,
    clients: Option<u32>,
    think_ms: Option<f64>,
    path: Option<String>,
    format: Option<String>,
    time_scale: Option<f64>,
    rate_scale: Option<f64>,
    start_s: Option<f64>,
    skip_bad_rows: Option<bool>,
    model: Option<String>,
    log_type: Option<String>,
    failed: Option<String>,
    hash_block_tokens: Option<u32>,
    prefix_tokens: Option<u32>,
}

const ARRIVAL_VARIANTS: &[Variant] = &[
    Variant {
        name: "poisson",
        required: &["rate_per_s"],
        optional: &[],
    },
    Variant {
        name: "gamma",
        required: &["rate_per_s", "shape"],
        optional: &[],
    },
    Variant {
        name: "constant",
        required: &["rate_per_s"],
        optional: &[],
    },
    Variant {
        name: "burst",
        required: &[],
        optional: &[],
    },
    Variant {
        name: "closed_loop",
        required: &["clients"],
        optional: &["think_ms"],
    },
    Variant {
        name: "trace",
        required: &["path"],
        optional: &[
            "format",
            "time_scale",
            "rate_scale",
            "start_s",
            "skip_bad_rows",
            "model",
            "log_type",
            "failed",
            "hash_block_tokens",
            "prefix_tokens",
        ],
    },
];

impl TryFrom<RawArrival> for ArrivalSpec {
    type Error = String;

    fn try_from(r: RawArrival) -> Result<ArrivalSpec, String> {
        let present = [
            ("rate_per_s", r.rate_per_s.is_some()),
            ("shape", r.shape.is_some()),
            ("clients", r.clients.is_some()),
            ("think_ms", r.think_ms.is_some()),
            ("path", r.path.is_some()),
            ("format", r.format.is_some()),
            ("time_scale", r.time_scale.is_some()),
            ("rate_scale", r.rate_scale.is_some()),
            ("start_s", r.start_s.is_some()),
            ("skip_bad_rows", r.skip_bad_rows.is_some()),
            ("model", r.model.is_some()),
            ("log_type", r.log_type.is_some()),
            ("failed", r.failed.is_some()),
            ("hash_block_tokens", r.hash_block_tokens.is_some()),
            ("prefix_tokens", r.prefix_tokens.is_some()),
        ];
        check_keys("kind", &r.kind, ARRIVAL_VARIANTS, &present)?;
        let rate_per_s = r.rate_per_s.unwrap_or_default();
        Ok(match r.kind.as_str() {
            "poisson" => ArrivalSpec::Poisson { rate_per_s },
            "gamma" => ArrivalSpec::Gamma {
                rate_per_s,
                shape: r.shape.unwrap_or_default(),
            },
            "constant" => ArrivalSpec::Constant { rate_per_s },
            "burst" => ArrivalSpec::Burst,
            "closed_loop" => ArrivalSpec::ClosedLoop {
                clients: r.clients.unwrap_or_default(),
                think_ms: r.think_ms.unwrap_or_default(),
            },
            _ => {
                let format = match r.format.as_deref() {
                    None | Some("auto") => TraceFormat::Auto,
                    Some("azure") => TraceFormat::Azure,
                    Some("burstgpt") => TraceFormat::Burstgpt,
                    Some("mooncake") => TraceFormat::Mooncake,
                    Some("csv") => TraceFormat::Csv,
                    Some(other) => {
                        return Err(format!(
                            "invalid value for field `format`: unknown trace format `{other}` \
                             (known: auto, azure, burstgpt, mooncake, csv)"
                        ))
                    }
                };
                let failed = match r.failed.as_deref() {
                    None | Some("skip") => FailedRows::Skip,
                    Some("cancel") => FailedRows::Cancel,
                    Some(other) => {
                        return Err(format!(
                            "invalid value for field `failed`: `{other}` (known: skip, cancel)"
                        ))
                    }
                };
                let d = TraceSpec::new(r.path.unwrap_or_default());
                ArrivalSpec::Trace(TraceSpec {
                    format,
                    time_scale: r.time_scale.unwrap_or(d.time_scale),
                    rate_scale: r.rate_scale.unwrap_or(d.rate_scale),
                    start_s: r.start_s.unwrap_or(d.start_s),
                    skip_bad_rows: r.skip_bad_rows.unwrap_or(d.skip_bad_rows),
                    model: r.model,
                    log_type: r.log_type,
                    failed,
                    hash_block_tokens: r.hash_block_tokens,
                    prefix_tokens: r.prefix_tokens.unwrap_or(d.prefix_tokens),
                    ..d
                })
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arrival(text: &str) -> Result<ArrivalSpec, String> {
        toml::from_str::<RawArrival>(text)
            .map_err(|e| e.message().to_string())
            .and_then(ArrivalSpec::try_from)
    }

    #[test]
    fn a_key_the_variant_does_not_use_is_unknown() {
        let err = arrival("kind = \"burst\"\nrate_per_s = 3.0").err();
        assert!(
            err.as_deref()
                .is_some_and(|e| e.starts_with("unknown field `rate_per_s`")),
            "{err:?}"
        );
        assert_eq!(arrival("kind = \"burst\""), Ok(ArrivalSpec::Burst));
    }

    #[test]
    fn missing_and_unknown_variants_are_named() {
        let err = arrival("kind = \"gamma\"\nrate_per_s = 3.0").err();
        assert!(
            err.as_deref()
                .is_some_and(|e| e.starts_with("missing field `shape`")),
            "{err:?}"
        );
        let err = arrival("kind = \"sometimes\"").err();
        assert!(
            err.as_deref()
                .is_some_and(|e| e.starts_with("invalid value for field `kind`")),
            "{err:?}"
        );
    }
}
