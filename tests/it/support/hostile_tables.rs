//! Reading the hostile-input mutation tables (`hostile_input.toml` beside this file) and
//! editing TOML trees by dotted path: the data side of `scenario::hostile_input`, whose runner
//! drives the binary with what these return.

use toml::Value;

pub fn leaves(table: &toml::Table, prefix: &str, out: &mut Vec<(String, Value)>) {
    for (k, v) in table {
        let path = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match v {
            Value::Table(t) => leaves(t, &path, out),
            _ => out.push((path, v.clone())),
        }
    }
}

pub fn tables(table: &toml::Table, prefix: &str, out: &mut Vec<String>) {
    out.push(prefix.to_string());
    for (k, v) in table {
        if let Value::Table(t) = v {
            let path = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            tables(t, &path, out);
        }
    }
}

/// The mutation tables (`tests/it/support/hostile_input.toml`).
pub fn tables_file() -> toml::Table {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/it/support/hostile_input.toml");
    let text = std::fs::read_to_string(&path).expect("read the mutation tables");
    toml::from_str(&text).expect("the mutation tables parse")
}

/// The entries of array `name` in the mutation tables.
pub fn entries(name: &str) -> Vec<toml::Table> {
    match tables_file().remove(name) {
        Some(Value::Array(a)) => a
            .into_iter()
            .map(|v| match v {
                Value::Table(t) => t,
                other => panic!("{name}: an entry is not a table: {other}"),
            })
            .collect(),
        _ => panic!("the mutation tables have no array `{name}`"),
    }
}

pub fn field(t: &toml::Table, key: &str) -> Value {
    t.get(key)
        .cloned()
        .unwrap_or_else(|| panic!("a mutation table entry has no `{key}`: {t:?}"))
}

pub fn text(t: &toml::Table, key: &str) -> String {
    match field(t, key) {
        Value::String(s) => s,
        other => panic!("`{key}` is not a string: {other}"),
    }
}

/// (label, value) of every hostile value, in the tables' order.
pub fn hostile_values() -> Vec<(String, Value)> {
    entries("value")
        .iter()
        .map(|e| (text(e, "label"), field(e, "v")))
        .collect()
}

/// A TOML value written as text (`value = "..."` in the tables).
pub fn parse_value(value: &str) -> Option<Value> {
    let v: toml::Table = toml::from_str(&format!("v = {value}")).expect("value");
    v.get("v").cloned()
}

/// Number, string, bool, array, table: a value of another kind is a type error for any key
/// except those that take either a number or a list (`cache.block_size`).
pub fn kind(v: &Value) -> u8 {
    match v {
        Value::Integer(_) | Value::Float(_) => 0,
        Value::String(_) => 1,
        Value::Boolean(_) => 2,
        Value::Array(_) => 3,
        Value::Table(_) => 4,
        Value::Datetime(_) => 5,
    }
}

/// Sets (or, with `None`, removes) the value at a dotted path. Setting a key whose table is
/// missing creates the table (a `[cache.host_tier]` gaining one key); removing one leaves the
/// file as it was. A path through a value is left alone.
pub fn set(table: &mut toml::Table, path: &str, v: Option<Value>) {
    let mut parts: Vec<&str> = path.split('.').collect();
    let last = parts.pop().unwrap_or_default();
    let mut t = table;
    for p in parts {
        if v.is_some() && !t.contains_key(p) {
            t.insert(p.to_string(), Value::Table(toml::Table::new()));
        }
        t = match t.get_mut(p) {
            Some(Value::Table(inner)) => inner,
            _ => return,
        };
    }
    match v {
        Some(v) => {
            t.insert(last.to_string(), v);
        }
        None => {
            t.remove(last);
        }
    }
}
