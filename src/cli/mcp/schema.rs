//! A tool's input schema and its command line, both from the command's clap definition: each
//! long flag is a property of the same name (`alloc-conf` as `alloc_conf`) with the flag's
//! help as its description, so the tools take exactly what the command does.

use clap::{Arg, ArgAction};
use serde_json::{json, Map, Value};
use std::any::TypeId;

/// Property name of a flag or positional argument.
pub fn property(arg: &Arg) -> String {
    match arg.get_long() {
        Some(long) => long.replace('-', "_"),
        None => arg.get_id().as_str().to_string(),
    }
}

/// The JSON type of an argument's values (`integer_or_units`: a string or an integer).
fn json_type(arg: &Arg) -> &'static str {
    if matches!(arg.get_action(), ArgAction::SetTrue) {
        return "boolean";
    }
    let parser = arg.get_value_parser().type_id();
    if [
        TypeId::of::<u64>(),
        TypeId::of::<u32>(),
        TypeId::of::<u8>(),
        TypeId::of::<usize>(),
    ]
    .iter()
    .any(|t| parser == *t)
    {
        // Sizes (`80GiB`) and parameter counts (`7B`) take units as well as plain numbers.
        let units = arg
            .get_value_names()
            .is_some_and(|names| names.iter().any(|n| *n == "SIZE" || *n == "COUNT"));
        if units {
            "integer_or_units"
        } else {
            "integer"
        }
    } else if parser == TypeId::of::<f64>() {
        "number"
    } else {
        "string"
    }
}

/// The schema of one argument.
fn arg_schema(arg: &Arg, description: Option<&str>) -> Value {
    let kind = json_type(arg);
    let mut schema = Map::new();
    match kind {
        "integer_or_units" => schema.insert("type".into(), json!(["string", "integer"])),
        _ => schema.insert("type".into(), json!(kind)),
    };
    let help = arg
        .get_long_help()
        .or(arg.get_help())
        .map(|h| h.to_string());
    if let Some(text) = description.map(str::to_string).or(help) {
        schema.insert("description".into(), json!(text));
    }
    let choices: Vec<String> = arg
        .get_possible_values()
        .iter()
        .filter(|v| !v.is_hide_set())
        .map(|v| v.get_name().to_string())
        .collect();
    if kind == "string" && !choices.is_empty() {
        schema.insert("enum".into(), json!(choices));
    }
    if let Some(default) = arg.get_default_values().first() {
        let text = default.to_string_lossy();
        let value = match kind {
            "integer" => text.parse::<u64>().map(Value::from).ok(),
            "integer_or_units" => Some(json!(text)),
            "number" => text.parse::<f64>().ok().map(Value::from),
            "boolean" => None,
            _ => Some(json!(text)),
        };
        if let Some(v) = value {
            schema.insert("default".into(), v);
        }
    }
    Value::Object(schema)
}

/// What a tool takes beyond its command's flags.
pub struct Shape<'a> {
    /// Flags the tool leaves out (`json` always: the tool returns the document).
    pub hidden: &'a [&'a str],
    /// Positional arguments by id, with the property that gives each and its description.
    pub positionals: &'a [(&'a str, &'a str, &'a str)],
}

/// The input schema of a tool over `command`.
pub fn input_schema(command: &clap::Command, shape: &Shape) -> Map<String, Value> {
    let mut properties = Map::new();
    let mut required = Vec::new();
    for arg in command.get_arguments() {
        let id = arg.get_id().as_str();
        if arg.is_positional() {
            if let Some((_, name, text)) = shape.positionals.iter().find(|p| p.0 == id) {
                let mut schema = arg_schema(arg, Some(text));
                schema["type"] = json!("string");
                properties.insert(name.to_string(), schema);
                if arg.is_required_set() {
                    required.push(name.to_string());
                }
            }
            continue;
        }
        if arg.get_long().is_none() || id == "json" || id == "help" || shape.hidden.contains(&id) {
            continue;
        }
        let name = property(arg);
        properties.insert(name.clone(), arg_schema(arg, None));
        if arg.is_required_set() {
            required.push(name);
        }
    }
    let mut schema = Map::new();
    schema.insert("type".into(), json!("object"));
    schema.insert("properties".into(), Value::Object(properties));
    schema.insert("required".into(), json!(required));
    schema.insert("additionalProperties".into(), json!(false));
    schema
}

/// The command line for `arguments`: `--json`, then `--flag=VALUE`
/// per property, `--flag` for a true boolean, and the positional properties last. An error
/// names a property the tool does not take or a value of the wrong type.
pub fn command_line(
    command: &clap::Command,
    shape: &Shape,
    arguments: &Map<String, Value>,
) -> Result<Vec<String>, String> {
    let mut argv = vec![command.get_name().to_string()];
    if command.get_arguments().any(|a| a.get_id() == "json") {
        argv.push("--json".into());
    }
    let mut positionals = Vec::new();
    for (name, value) in arguments {
        let positional = shape.positionals.iter().find(|p| p.1 == name);
        let flag = command.get_arguments().find(|a| {
            a.get_long().is_some()
                && !a.is_positional()
                && &property(a) == name
                && a.get_id() != "json"
                && !shape.hidden.contains(&a.get_id().as_str())
        });
        let text = match value {
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            Value::Bool(_) if flag.is_some_and(|f| json_type(f) == "boolean") => {
                if value == &Value::Bool(true) {
                    argv.push(format!("--{}", flag.and_then(Arg::get_long).unwrap_or("")));
                }
                continue;
            }
            Value::Null => continue,
            _ => {
                return Err(format!(
                    "{name}: expected a string or a number, got {value}"
                ))
            }
        };
        match (positional, flag) {
            (Some((id, _, _)), _) => positionals.push((*id, text)),
            (None, Some(f)) if json_type(f) == "boolean" => {
                return Err(format!("{name}: expected true or false, got {value}"))
            }
            (None, Some(f)) => argv.push(format!("--{}={text}", f.get_long().unwrap_or(""))),
            (None, None) => return Err(format!("{name}: not an argument of this tool")),
        }
    }
    // Positionals in the order the command declares them.
    positionals.sort_by_key(|(id, _)| shape.positionals.iter().position(|p| p.0 == *id));
    if !positionals.is_empty() {
        argv.push("--".into());
        argv.extend(positionals.into_iter().map(|(_, text)| text));
    }
    Ok(argv)
}
