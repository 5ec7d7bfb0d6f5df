//! Reading a scenario: parse, apply `--set` overrides, deserialize, check feasibility. Every
//! failure becomes a [`Diagnostic`] naming the file position (or the override) and the key.

use std::path::Path;

use super::error::{Diagnostic, KeyProblem, Origin, ScenarioError};
use super::locate::SourceMap;
use super::types::Scenario;

/// Loads, overrides and checks a scenario file. Overrides are `dotted.key=value`; the value is
/// read as a TOML value when it parses as one (`5`, `true`, `"x"`, `{ kind = "burst" }`) and as a
/// string otherwise (`8 GiB`, `cpu`).
pub fn load(path: &Path, overrides: &[String]) -> Result<Scenario, ScenarioError> {
    let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    parse_str(&text, Some(path), overrides)
}

/// [`load`] for text already in memory; `path` names it in errors and anchors relative paths.
pub fn parse_str(
    text: &str,
    path: Option<&Path>,
    overrides: &[String],
) -> Result<Scenario, ScenarioError> {
    let place = Placer { path, overrides };
    let file_map = SourceMap::parse(text).map_err(|(message, offset)| {
        let (line, col) = crate::scenario::locate::line_col(text, offset);
        invalid(vec![place.at(line, col, "(syntax)", message)])
    })?;

    let mut scenario: Scenario = if overrides.is_empty() {
        toml::from_str(text).map_err(|e| invalid(vec![place.de_error(&e, &file_map, None)]))?
    } else {
        let mut table: toml::Table = toml::from_str(text)
            .map_err(|e| invalid(vec![place.at(1, 1, "(syntax)", e.message().to_string())]))?;
        let mut problems = Vec::new();
        for o in overrides {
            if let Err(p) = apply_override(&mut table, o) {
                problems.push(Diagnostic {
                    origin: Origin::Override,
                    key: p.key,
                    message: p.message,
                });
            }
        }
        if !problems.is_empty() {
            return Err(invalid(problems));
        }
        // Re-render so the deserializer's spans can be mapped back to keys.
        let rendered = toml::to_string(&table).map_err(|e| {
            invalid(vec![Diagnostic {
                origin: Origin::Override,
                key: String::new(),
                message: e.to_string(),
            }])
        })?;
        let rendered_map = SourceMap::parse(&rendered).map_err(|(message, _)| {
            invalid(vec![Diagnostic {
                origin: Origin::Override,
                key: String::new(),
                message,
            }])
        })?;
        toml::from_str(&rendered)
            .map_err(|e| invalid(vec![place.de_error(&e, &file_map, Some(&rendered_map))]))?
    };

    scenario.source = path.map(Path::to_path_buf);
    let problems = scenario.check();
    if problems.is_empty() {
        Ok(scenario)
    } else {
        Err(invalid(
            problems
                .into_iter()
                .map(|p| place.problem(p, &file_map))
                .collect(),
        ))
    }
}

/// Any other checked TOML document (a device profile): deserialize `T` with the same
/// `FILE:LINE:COL: KEY: message` diagnostics as a scenario — unknown keys, missing keys, wrong
/// types — then place every problem `check` reports at its key.
pub fn parse_document<T: serde::de::DeserializeOwned>(
    text: &str,
    path: Option<&Path>,
    check: impl FnOnce(&T) -> Vec<KeyProblem>,
) -> Result<T, ScenarioError> {
    let place = Placer {
        path,
        overrides: &[],
    };
    let map = SourceMap::parse(text).map_err(|(message, offset)| {
        let (line, col) = crate::scenario::locate::line_col(text, offset);
        invalid(vec![place.at(line, col, "(syntax)", message)])
    })?;
    let doc: T = toml::from_str(text).map_err(|e| invalid(vec![place.de_error(&e, &map, None)]))?;
    let problems = check(&doc);
    if problems.is_empty() {
        Ok(doc)
    } else {
        Err(invalid(
            problems
                .into_iter()
                .map(|p| place.problem(p, &map))
                .collect(),
        ))
    }
}

/// A problem found after loading (by the workload generator) placed in the scenario's file:
/// the file is read again and `key` (or its nearest written ancestor) located.
pub fn locate_in_source(source: Option<&Path>, key: &str, message: String) -> Diagnostic {
    let located = source.and_then(|path| {
        let text = std::fs::read_to_string(path).ok()?;
        let map = SourceMap::parse(&text).ok()?;
        let (line, col) = map.position_of(key);
        Some(Origin::File {
            path: path.to_path_buf(),
            line,
            col,
        })
    });
    Diagnostic {
        origin: located.unwrap_or(Origin::Memory),
        key: key.to_string(),
        message,
    }
}

fn invalid(d: Vec<Diagnostic>) -> ScenarioError {
    ScenarioError::Invalid(d)
}

/// Turns keys and offsets into diagnostics for one file and its overrides.
struct Placer<'a> {
    path: Option<&'a Path>,
    overrides: &'a [String],
}

impl Placer<'_> {
    fn at(&self, line: usize, col: usize, key: &str, message: String) -> Diagnostic {
        let origin = match self.path {
            Some(p) => Origin::File {
                path: p.to_path_buf(),
                line,
                col,
            },
            None => Origin::Memory,
        };
        Diagnostic {
            origin,
            key: key.to_string(),
            message,
        }
    }

    fn overridden(&self, key: &str) -> bool {
        self.overrides.iter().any(|o| {
            let ok = o.split_once('=').map_or(o.as_str(), |(k, _)| k).trim();
            related(ok, key)
        })
    }

    fn problem(&self, p: KeyProblem, file_map: &SourceMap) -> Diagnostic {
        if self.overridden(&p.key) {
            return Diagnostic {
                origin: Origin::Override,
                key: p.key,
                message: p.message,
            };
        }
        let (line, col) = file_map.position_of(&p.key);
        self.at(line, col, &p.key, p.message)
    }

    /// A deserialization error: `rendered` is the re-rendered text when overrides were applied
    /// (its spans are not the file's).
    fn de_error(
        &self,
        e: &toml::de::Error,
        file_map: &SourceMap,
        rendered: Option<&SourceMap>,
    ) -> Diagnostic {
        let message = e.message().trim().to_string();
        let map = rendered.unwrap_or(file_map);
        let missing = message.starts_with("missing field");
        let mut key = e
            .span()
            .map(|s| {
                if missing {
                    map.key_enclosing(&s)
                } else {
                    map.key_at(s.start)
                }
            })
            .unwrap_or_default();
        // Unknown and missing fields name the field in the message; point at it where written.
        if let Some(field) = quoted_field(&message) {
            let candidate = join(&key, &field);
            let written = e.span().and_then(|s| map.field_in(&s, &field));
            if missing || map.contains(&candidate) {
                key = candidate;
            } else if let Some(found) = written {
                key = found;
            }
        }
        match rendered {
            None if file_map.contains(&key) || e.span().is_none() => {
                let (line, col) = file_map.position_of(&key);
                self.at(line, col, &key, message)
            }
            None => {
                let (line, col) = e.span().map_or((1, 1), |s| file_map.line_col(s.start));
                self.at(line, col, &key, message)
            }
            Some(_) => self.problem(KeyProblem::new(key, message), file_map),
        }
    }
}

/// Two dotted keys where one is the other or lies inside it.
fn related(a: &str, b: &str) -> bool {
    a == b || a.starts_with(&format!("{b}.")) || b.starts_with(&format!("{a}."))
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{prefix}.{key}")
    }
}

/// The field in "unknown field `x`, expected ...", "missing field `x`" or "invalid value for
/// field `x`: ..." (the tagged tables' wording, `tagged.rs`).
fn quoted_field(message: &str) -> Option<String> {
    let rest = message
        .strip_prefix("unknown field `")
        .or_else(|| message.strip_prefix("missing field `"))
        .or_else(|| message.strip_prefix("invalid value for field `"))?;
    rest.split('`').next().map(str::to_string)
}

/// Sets `a.b.c=value` in the table, creating missing tables on the way.
fn apply_override(table: &mut toml::Table, spec: &str) -> Result<(), KeyProblem> {
    let Some((key, raw)) = spec.split_once('=') else {
        return Err(KeyProblem::new(spec.trim(), "expected KEY=VALUE"));
    };
    let key = key.trim();
    // `v = {raw}` is parsed as a TOML document: a line break would let one value smuggle in
    // further keys or tables.
    if spec.contains(['\n', '\r']) {
        return Err(KeyProblem::new(
            key.lines().next().unwrap_or(key).trim(),
            "a --set value must be one line (it holds a line break)",
        ));
    }
    let parts: Vec<&str> = key.split('.').map(str::trim).collect();
    if parts.iter().any(|p| p.is_empty()) {
        return Err(KeyProblem::new(key, "empty part in dotted key"));
    }
    let value = parse_value(raw.trim());
    let (last, parents) = parts
        .split_last()
        .ok_or_else(|| KeyProblem::new(key, "empty key"))?;
    let mut current = table;
    for (i, part) in parents.iter().enumerate() {
        let entry = current
            .entry(part.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        current = match entry {
            toml::Value::Table(t) => t,
            _ => {
                return Err(KeyProblem::new(
                    key,
                    format!("`{}` is a value, not a table", parts[..=i].join(".")),
                ))
            }
        };
    }
    current.insert(last.to_string(), value);
    Ok(())
}

fn parse_value(raw: &str) -> toml::Value {
    toml::from_str::<toml::Table>(&format!("v = {raw}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(raw.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn override_values_parse_as_toml_or_string() {
        assert_eq!(parse_value("5"), toml::Value::Integer(5));
        assert_eq!(parse_value("true"), toml::Value::Boolean(true));
        assert_eq!(parse_value("8 GiB"), toml::Value::String("8 GiB".into()));
        assert_eq!(parse_value("\"x\""), toml::Value::String("x".into()));
    }

    #[test]
    fn override_through_a_value_is_refused() {
        let mut t: toml::Table = toml::from_str("a = 1").unwrap_or_default();
        let err = apply_override(&mut t, "a.b=2").err();
        assert_eq!(err.map(|e| e.key), Some("a.b".to_string()));
    }

    #[test]
    fn override_with_a_line_break_is_refused() {
        let mut t: toml::Table = toml::from_str("a = 1").unwrap_or_default();
        let err = apply_override(&mut t, "a=2\n[b]\nc = 3").err();
        assert!(err.is_some_and(|e| e.message.contains("one line")));
        assert!(!t.contains_key("b"));
    }

    #[test]
    fn related_keys() {
        assert!(related("a.b", "a.b"));
        assert!(related("a.b.c", "a.b"));
        assert!(related("a", "a.b"));
        assert!(!related("a.bc", "a.b"));
    }
}
