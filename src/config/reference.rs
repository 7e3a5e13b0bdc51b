//! docs/configuration.md, written from the configuration's own types: every key with its type,
//! its default, its environment variable and its doc comment. The test fails when the page
//! and the code differ; `UPDATE_DOCS=1` rewrites the page.

use serde_json::{Map, Value};

use super::{Config, ENV_PREFIX};

/// What the page says before the tables.
const INTRODUCTION: &str = "\
# Configuration reference

payrecon reads its configuration in layers, each later one winning: the built-in defaults, the
TOML file (`--config FILE`, `PAYRECON_CONFIG`, else `./payrecon.toml` if it exists), then
`PAYRECON_<KEY>` environment variables, then the command line's `--database-url`. Any key can
be set from the environment: a nested key's parts are joined by `__`
(`PAYRECON_HTTP__LISTEN=0.0.0.0:8080`, `PAYRECON_NETWORKS__LITECOIN__XPUB=…`), and the value is
read as a TOML value (`true`, `3`, `[\"btc\", \"ltc\"]`, else a string; a string that reads
as a number or `true` is quoted: `PAYRECON_BOOKS__XERO_TAX_RATE='\"2024\"'`). `PAYRECON_LOG` and
`PAYRECON_CONFIG` belong to the command line, not to the file. An unknown key in the file is
refused at start, naming it.

`payrecon.example.toml` is a commented example to start from; deploy.md says how to choose each
value. This page is written from the configuration's own types and doc comments:
`cargo test -p payrecon --lib configuration_reference` fails when the two differ, and
`UPDATE_DOCS=1` with the same command rewrites it.
";

/// The page, from the configuration's JSON schema.
pub(super) fn configuration_reference() -> String {
    let schema = serde_json::to_value(schemars::schema_for!(Config)).expect("a schema serializes");
    let defs = schema["$defs"].as_object().cloned().unwrap_or_default();
    let defaults = serde_json::to_value(Config::default()).expect("the defaults serialize");
    let mut page = String::from(INTRODUCTION);
    section(&mut page, &defs, &schema, &[], "Top level", &defaults);
    page
}

/// One table's keys as a table of their own, then each nested table's.
fn section(
    page: &mut String,
    defs: &Map<String, Value>,
    table: &Value,
    path: &[String],
    title: &str,
    parent_default: &Value,
) {
    let required: Vec<&str> = table["required"]
        .as_array()
        .map(|keys| keys.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let properties = table["properties"].as_object().cloned().unwrap_or_default();
    let mut rows = Vec::new();
    let mut nested = Vec::new();
    for (key, property) in &properties {
        let mut key_path = path.to_vec();
        key_path.push(key.clone());
        let default = property
            .get("default")
            .cloned()
            .unwrap_or_else(|| parent_default.get(key).cloned().unwrap_or(Value::Null));
        let target = resolved(defs, property);
        if target.get("properties").is_some() {
            nested.push((
                key_path,
                target,
                format!("[{}]", path_text(path, key)),
                default,
            ));
            continue;
        }
        if let Some(items) = target.get("items").map(|items| resolved(defs, items))
            && items.get("properties").is_some()
        {
            nested.push((
                key_path,
                items,
                format!("[[{}]]", path_text(path, key)),
                Value::Null,
            ));
            continue;
        }
        let shown_default = if required.contains(&key.as_str()) && parent_default.get(key).is_none()
        {
            "required".to_owned()
        } else {
            default_text(&default)
        };
        let in_array = title.starts_with("[[");
        let variable = if in_array {
            "in the file".to_owned()
        } else {
            format!("`{ENV_PREFIX}{}`", key_path.join("__").to_uppercase())
        };
        rows.push(format!(
            "| `{key}` | {} | {shown_default} | {variable} | {} |",
            type_text(defs, &target),
            description(property)
        ));
    }
    if !rows.is_empty() {
        page.push_str(&format!("\n## {title}\n\n"));
        if let Some(about) = table.get("description").and_then(Value::as_str)
            && !path.is_empty()
        {
            page.push_str(&format!("{}\n\n", one_paragraph(about)));
        }
        page.push_str("| key | type | default | environment | meaning |\n|---|---|---|---|---|\n");
        for row in rows {
            page.push_str(&row);
            page.push('\n');
        }
    }
    for (key_path, target, title, default) in nested {
        let mut described = target.clone();
        if let Some(about) = properties[key_path.last().expect("a key")].get("description") {
            described["description"] = about.clone();
        }
        section(page, defs, &described, &key_path, &title, &default);
    }
}

/// A property's schema with its `$ref` and its `Option`'s null alternative taken away.
fn resolved(defs: &Map<String, Value>, property: &Value) -> Value {
    if let Some(reference) = property.get("$ref").and_then(Value::as_str) {
        let name = reference.trim_start_matches("#/$defs/");
        return resolved(defs, &defs[name]);
    }
    if let Some(choices) = property.get("anyOf").and_then(Value::as_array) {
        let not_null: Vec<&Value> = choices.iter().filter(|c| c["type"] != "null").collect();
        if let [only] = not_null.as_slice() {
            return resolved(defs, only);
        }
    }
    property.clone()
}

fn path_text(path: &[String], key: &str) -> String {
    path.iter()
        .map(String::as_str)
        .chain([key])
        .collect::<Vec<_>>()
        .join(".")
}

/// A key's type for people: `string`, `integer`, `list of strings`, one of the enum's values.
fn type_text(defs: &Map<String, Value>, schema: &Value) -> String {
    let values: Vec<String> = match (schema.get("enum"), schema.get("oneOf")) {
        (Some(Value::Array(values)), _) => values.iter().map(default_text).collect(),
        (_, Some(Value::Array(choices))) => choices
            .iter()
            .filter_map(|choice| choice.get("const").map(default_text))
            .collect(),
        _ => Vec::new(),
    };
    if !values.is_empty() {
        return format!("one of {}", values.join(", "));
    }
    let kinds: Vec<&str> = match &schema["type"] {
        Value::String(kind) => vec![kind.as_str()],
        Value::Array(kinds) => kinds
            .iter()
            .filter_map(Value::as_str)
            .filter(|k| *k != "null")
            .collect(),
        _ => Vec::new(),
    };
    match kinds.first().copied() {
        Some("array") => format!(
            "list of {}",
            plural(&type_text(defs, &resolved(defs, &schema["items"])))
        ),
        Some("object") => match schema.get("additionalProperties") {
            Some(values) if values.is_object() => {
                format!(
                    "table of {}",
                    plural(&type_text(defs, &resolved(defs, values)))
                )
            }
            _ => "table".to_owned(),
        },
        Some(kind) => kind.to_owned(),
        None => "value".to_owned(),
    }
}

fn plural(kind: &str) -> String {
    match kind {
        "table" => "tables".to_owned(),
        kind if kind.starts_with("one of") => format!("values, each {kind}"),
        kind if kind.starts_with("list of") || kind.starts_with("table of") => kind.to_owned(),
        kind => format!("{kind}s"),
    }
}

/// A default as it is written in TOML; a large table by its size.
fn default_text(value: &Value) -> String {
    match value {
        Value::Null => "none".to_owned(),
        Value::String(text) => format!("`\"{text}\"`"),
        Value::Object(table) if table.is_empty() => "`{}`".to_owned(),
        Value::Object(table) if table.len() == 1 => "1 entry".to_owned(),
        Value::Object(table) => format!("{} entries", table.len()),
        Value::Array(items) if items.iter().any(Value::is_object) => {
            format!("{} tables", items.len())
        }
        other => format!("`{}`", other.to_string().replace(',', ", ")),
    }
}

fn description(property: &Value) -> String {
    property
        .get("description")
        .and_then(Value::as_str)
        .map(one_paragraph)
        .unwrap_or_default()
        .replace('|', "\\|")
}

/// A doc comment as one line of Markdown: rustdoc's links (`` [`Durability`] ``) as code.
fn one_paragraph(text: &str) -> String {
    let link = regex::Regex::new(r"\[(`[^`]+`)\](\([^)]*\))?").expect("the pattern compiles");
    link.replace_all(&text.split_whitespace().collect::<Vec<_>>().join(" "), "$1")
        .into_owned()
}

#[test]
fn configuration_reference_is_the_code() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/configuration.md");
    let written = configuration_reference();
    if std::env::var_os("UPDATE_DOCS").is_some() {
        std::fs::write(path, &written).expect("docs/configuration.md is writable");
    }
    let page = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        page == written,
        "docs/configuration.md differs from the configuration's types: \
         UPDATE_DOCS=1 cargo test -p payrecon --lib configuration_reference rewrites it"
    );
}
