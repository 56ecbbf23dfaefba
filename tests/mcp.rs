//! `memprof mcp` through a real MCP client: the `mcp` package from PyPI, in the virtualenv
//! that `MEMPROF_TEST_VENV` names (`.ci/run` makes one), drives `tests/mcp_client.py`, which
//! starts the server over stdio on the fixtures folder. The tools must return what the
//! commands print with `--json`, and refuse what lies outside the root with the commands'
//! one-line messages.

use crate::util::{fixture, memprof, repo, skip, stderr, stdout};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

/// The virtualenv's python, or `None` (the test skipped, saying so) without one.
fn venv_python() -> Option<PathBuf> {
    let Some(venv) = std::env::var_os("MEMPROF_TEST_VENV") else {
        skip("needs MEMPROF_TEST_VENV, a virtualenv with the `mcp` package (pip install mcp)");
        return None;
    };
    let python = PathBuf::from(venv).join("bin/python");
    assert!(
        python.is_file(),
        "MEMPROF_TEST_VENV has no {}",
        python.display()
    );
    Some(python)
}

/// Lists the tools and makes `calls` in one session; the client's report.
fn session(python: &PathBuf, calls: Value) -> Value {
    let mut child = Command::new(python)
        .arg(repo().join("tests/mcp_client.py"))
        .arg(env!("CARGO_BIN_EXE_memprof"))
        .arg(fixture(""))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the client starts");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(calls.to_string().as_bytes())
        .expect("calls written");
    // The client's output is read while it runs (a report larger than the pipe's buffer would
    // otherwise block it); the session gets 120 s.
    let pid = child.id();
    let (sent, received) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = sent.send(child.wait_with_output());
    });
    let out = match received.recv_timeout(Duration::from_secs(120)) {
        Ok(out) => out.expect("the client's output"),
        Err(_) => {
            let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
            panic!("the MCP session took over 120 s");
        }
    };
    assert!(out.status.success(), "client failed: {}", stderr(&out));
    serde_json::from_str(&stdout(&out)).expect("the client prints JSON")
}

/// The document `memprof ARGS` prints.
fn cli_json(args: &[&str]) -> Value {
    let out = memprof(args);
    serde_json::from_str(&stdout(&out))
        .unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {}", stderr(&out)))
}

/// A call's document, which must not be an error.
fn document(result: &Value) -> Value {
    assert_eq!(result["is_error"], false, "{result}");
    serde_json::from_str(result["text"].as_str().expect("text")).expect("JSON text")
}

/// A call's error message, which must be an error.
fn error(result: &Value) -> &str {
    assert_eq!(result["is_error"], true, "{result}");
    result["text"].as_str().expect("text")
}

#[test]
fn mcp_tools_return_what_the_commands_print_with_json() {
    let Some(python) = venv_python() else { return };
    let demo = fixture("snapshots/demo_oom.pickle")
        .canonicalize()
        .expect("the fixture");
    let demo = demo.to_str().expect("a UTF-8 path");
    let before = fixture("snapshots/v2_1_basic.pickle")
        .canonicalize()
        .expect("fixture");
    let after = fixture("snapshots/v2_11_full.pickle")
        .canonicalize()
        .expect("fixture");
    let (before, after) = (
        before.to_str().expect("UTF-8"),
        after.to_str().expect("UTF-8"),
    );
    let report = session(
        &python,
        json!([
            {"tool": "diagnose", "arguments": {"path": "snapshots/demo_oom.pickle"}},
            {"tool": "analyze", "arguments": {"path": demo, "top": 3, "device": 0}},
            {"tool": "simulate", "arguments": {"path": demo, "alloc_conf": "expandable_segments:True"}},
            {"tool": "diff", "arguments": {"before": before, "after": after, "max_increase": "10%"}},
            {"tool": "plan_kv", "arguments": {"model": "llama-3-8b", "gpu_memory": "80GiB", "tp": 2}},
            {"tool": "view_state", "arguments": {"path": demo, "top": 3}},
            {"tool": "plan_train", "arguments": {
                "model": "llama-3-8b", "gpus": 8, "gpu_memory": "80GiB", "seq_len": 4096,
                "micro_batch": 1, "top": 2, "zero": 3,
            }},
        ]),
    );
    assert_eq!(report["server"], "memprof");
    let tools = report["tools"].as_array().expect("tools");
    let names: Vec<&str> = tools.iter().filter_map(|t| t["name"].as_str()).collect();
    assert_eq!(
        names,
        [
            "analyze",
            "diagnose",
            "simulate",
            "diff",
            "plan_train",
            "plan_kv",
            "view_state"
        ]
    );
    for tool in tools {
        let properties = tool["input_schema"]["properties"]
            .as_object()
            .expect("properties");
        assert!(!properties.contains_key("json"), "{}", tool["name"]);
        for (name, schema) in properties {
            assert!(schema["description"].is_string(), "{}.{name}", tool["name"]);
        }
    }
    let schema = |name: &str| &tools[names.iter().position(|n| *n == name).expect("tool")];
    assert_eq!(
        schema("simulate")["input_schema"]["properties"]["alloc_conf"]["type"],
        "string"
    );
    assert_eq!(
        schema("analyze")["input_schema"]["properties"]["top"]["type"],
        "integer"
    );
    assert_eq!(
        schema("analyze")["input_schema"]["properties"]["top"]["default"],
        10
    );
    assert_eq!(
        schema("diff")["input_schema"]["required"],
        json!(["before", "after"])
    );
    assert!(
        schema("plan_train")["input_schema"]["properties"]["precision"]["enum"]
            .as_array()
            .is_some_and(|e| e.contains(&json!("bf16")))
    );

    let results = report["results"].as_array().expect("results");
    let shipped = fixture("snapshots/demo_oom.pickle");
    let shipped = shipped.to_str().expect("UTF-8");
    assert_eq!(
        document(&results[0]),
        cli_json(&["diagnose", "--json", shipped])
    );
    assert_eq!(
        document(&results[1]),
        cli_json(&["analyze", "--json", "--top", "3", "--device", "0", demo])
    );
    assert_eq!(
        document(&results[2]),
        cli_json(&[
            "simulate",
            "--json",
            "--alloc-conf",
            "expandable_segments:True",
            demo
        ])
    );
    assert_eq!(
        document(&results[3]),
        cli_json(&["diff", "--json", "--max-increase", "10%", before, after])
    );
    assert_eq!(
        document(&results[4]),
        cli_json(&[
            "plan",
            "kv",
            "--json",
            "--model",
            "llama-3-8b",
            "--gpu-memory",
            "80GiB",
            "--tp",
            "2"
        ])
    );
    assert_eq!(
        document(&results[6]),
        cli_json(&[
            "plan",
            "train",
            "--json",
            "--model",
            "llama-3-8b",
            "--gpus",
            "8",
            "--gpu-memory",
            "80GiB",
            "--seq-len",
            "4096",
            "--micro-batch",
            "1",
            "--top",
            "2",
            "--zero",
            "3"
        ])
    );
    let kv = &schema("plan_kv")["input_schema"]["properties"];
    assert_eq!(kv["gpu_memory"]["type"], json!(["string", "integer"]));
    assert_eq!(kv["cuda_context"]["default"], "1GiB");
    // The state at the peak: what `analyze` reports of the peak.
    let state = document(&results[5]);
    let analyzed = &document(&results[1])["inputs"][0]["devices"][0];
    assert_eq!(state["kind"], "memprof_view_state");
    assert_eq!(state["index"], analyzed["trace"]["peak_entry_index"]);
    assert_eq!(
        state["figures"]["requested_bytes"],
        analyzed["trace"]["peak_active_bytes"]
    );
    assert_eq!(state["top_sites"], analyzed["top_sites"]);
    let segments = state["segments"].as_array().expect("segments");
    assert_eq!(json!(segments.len()), state["segment_count"]);
    let reserved: u64 = segments
        .iter()
        .filter_map(|s| s["size_bytes"].as_u64())
        .sum();
    assert_eq!(json!(reserved), state["reserved_bytes"]);
    let largest_free = &state["largest_free_blocks"][0]["size_bytes"];
    assert_eq!(largest_free, &state["largest_free_bytes"]);
    assert_eq!(
        state["largest_allocations"].as_array().map(Vec::len),
        Some(3)
    );
    let mut seen = BTreeSet::new();
    keys(&state, &mut seen);
    let missing: Vec<String> = view_state_fields().difference(&seen).cloned().collect();
    assert!(
        missing.is_empty(),
        "docs/mcp.md documents fields view_state lacks: {missing:?}"
    );
}

/// The fields the `view_state` table of docs/mcp.md documents: the backticked names of its
/// first column, and those after a colon in the second (`segments`' own fields and others).
fn view_state_fields() -> BTreeSet<String> {
    let page = std::fs::read_to_string(repo().join("docs/mcp.md")).expect("docs/mcp.md");
    let table = page
        .split("## view_state")
        .nth(1)
        .expect("a view_state section");
    let mut names = BTreeSet::new();
    for row in table.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = row.split('|').collect();
        let nested = cells
            .get(2)
            .and_then(|c| c.split_once(": "))
            .map(|(_, n)| n);
        for text in std::iter::once(cells[1]).chain(nested) {
            let quoted = text.split('`').skip(1).step_by(2);
            names.extend(quoted.map(String::from));
        }
    }
    names
}

/// Every object key anywhere in `v`.
fn keys(v: &Value, out: &mut BTreeSet<String>) {
    match v {
        Value::Object(map) => map.iter().for_each(|(k, v)| {
            out.insert(k.clone());
            keys(v, out);
        }),
        Value::Array(items) => items.iter().for_each(|v| keys(v, out)),
        _ => {}
    }
}

#[test]
fn mcp_refuses_paths_outside_the_root_with_the_commands_messages() {
    let Some(python) = venv_python() else { return };
    let outside = repo().join("Cargo.toml");
    let outside = outside.to_str().expect("UTF-8");
    let report = session(
        &python,
        json!([
            {"tool": "diagnose", "arguments": {"path": outside}},
            {"tool": "analyze", "arguments": {"path": "../Cargo.toml"}},
            {"tool": "diagnose", "arguments": {"path": "snapshots/missing.pickle"}},
            {"tool": "simulate", "arguments": {"path": "snapshots/demo_oom.pickle", "alloc_conf": "roundup_power2_divisions:3"}},
            {"tool": "analyze", "arguments": {"path": "snapshots"}},
            {"tool": "analyze", "arguments": {"path": "snapshots/demo_oom.pickle", "plot": "x.png"}},
            {"tool": "plan_kv", "arguments": {"model": outside}},
            {"tool": "plan_train", "arguments": {"model": "llama-3-8b", "gpus": 8}},
            {"tool": "analyze", "arguments": {"path": "snapshots/demo_oom.pickle", "top": "many"}},
        ]),
    );
    let results = report["results"].as_array().expect("results");
    let root = fixture("").canonicalize().expect("the fixtures");
    assert_eq!(
        error(&results[0]),
        format!(
            "{outside}: outside the folders this server may read ({}); start it with --root \
             for that folder",
            root.display()
        )
    );
    assert_eq!(
        error(&results[1]),
        "../Cargo.toml: `..` is not allowed in a path; give it from the root"
    );
    // The message the command prints for the same path.
    let cli_error = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_memprof"))
            .args(args)
            .current_dir(fixture(""))
            .output()
            .expect("memprof runs");
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let text = stderr(&out);
        text.trim_end()
            .strip_prefix("memprof: error: ")
            .unwrap_or_else(|| panic!("{args:?}: {text}"))
            .to_string()
    };
    assert_eq!(
        error(&results[2]),
        cli_error(&["diagnose", "--json", "snapshots/missing.pickle"])
    );
    assert!(!error(&results[2]).contains('\n'));
    assert_eq!(
        error(&results[3]),
        cli_error(&[
            "simulate",
            "--json",
            "--alloc-conf",
            "roundup_power2_divisions:3",
            "snapshots/demo_oom.pickle"
        ])
    );
    assert_eq!(error(&results[4]), "snapshots: not a regular file");
    assert_eq!(error(&results[5]), "plot: not an argument of this tool");
    assert!(
        error(&results[6]).contains("outside the folders"),
        "{}",
        results[6]
    );
    // clap's own messages, on one line.
    assert_eq!(
        error(&results[7]),
        "the following required arguments were not provided: --gpu-memory <SIZE> --seq-len \
         <SEQ_LEN> --micro-batch <MICRO_BATCH>"
    );
    assert_eq!(
        error(&results[8]),
        "invalid value 'many' for '--top <K>': invalid digit found in string"
    );
}

/// A line that is not a message gets the JSON-RPC error reply the spec names, and the session
/// goes on: text that is not JSON (-32700, id null), a path with a lone UTF-16 surrogate
/// (-32700, with the call's id, so the client's call ends), an id that is neither an integer
/// nor a string (-32600, id null). Spoken raw over stdio, no client library needed.
#[test]
fn mcp_answers_protocol_errors_with_the_json_rpc_error() {
    use std::io::{BufRead, BufReader};
    let mut child = Command::new(env!("CARGO_BIN_EXE_memprof"))
        .args(["mcp", "--root"])
        .arg(fixture(""))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the server starts");
    let mut input = child.stdin.take().expect("stdin");
    let (tx, rx) = std::sync::mpsc::channel();
    let output = child.stdout.take().expect("stdout");
    std::thread::spawn(move || {
        for line in BufReader::new(output).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut send = |line: &str| {
        input.write_all(line.as_bytes()).expect("written");
        input.write_all(b"\n").expect("written");
        input.flush().expect("flushed");
    };
    let next = || -> Value {
        let line = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("a reply within 30 s");
        serde_json::from_str(&line).expect("a JSON reply")
    };
    send(
        r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}"#,
    );
    assert_eq!(next()["id"], 0);
    send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);

    send(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list""#);
    let reply = next();
    assert_eq!(reply["error"]["code"], -32700, "{reply}");
    assert_eq!(reply["id"], Value::Null, "{reply}");

    send(
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"analyze","arguments":{"paths":["oom\ud800.pickle"]}}}"#,
    );
    let reply = next();
    assert_eq!(reply["error"]["code"], -32700, "{reply}");
    assert_eq!(reply["id"], 2, "{reply}");

    for id in ["1.5", "{\"a\":1}", "true"] {
        send(&format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/list"}}"#
        ));
        let reply = next();
        assert_eq!(reply["error"]["code"], -32600, "id {id}: {reply}");
        assert_eq!(reply["id"], Value::Null, "id {id}: {reply}");
    }

    // The session is still served.
    send(r#"{"jsonrpc":"2.0","id":3,"method":"tools/list"}"#);
    let reply = next();
    assert_eq!(reply["id"], 3, "{reply}");
    assert!(reply["result"]["tools"].is_array(), "{reply}");
    drop(input);
    let _ = child.wait();
}
