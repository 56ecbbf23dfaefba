//! The documentation kept true. Every example command of `README.md` and `docs/**/*.md` (a line
//! of a ```` ```sh ```` block that starts with `memprof `) runs with the built binary, by the
//! rules `docs/README.md` states: each page's commands in order, in a fresh folder holding the
//! repository's `fixtures/` and shipped stand-ins for the user's own files; exit 0 unless the
//! comment starts with `exit N`; not run when it starts with `needs `. No link of those pages
//! leaves the repository, the README stays short, and `scripts/try-without-gpu.sh` records and
//! analyzes its demo job from a copy of the checkout elsewhere.

use crate::shim_preload::shim;
use crate::util::{memprof, repo, stderr};
use serde_json::Value;
use std::fs::File;
use std::path::{Component, Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Names the docs use for a user's own files, and the shipped file each example runs on.
const STAND_INS: [(&str, &str); 3] = [
    ("snapshot.pickle", "snapshots/demo_oom.pickle"),
    ("step.pickle", "snapshots/v2_1_basic.pickle"),
    ("train.memprof", "recordings/ledger.memprof"),
];

/// How long one example may take (debug build, loaded machine).
const EXAMPLE_TIMEOUT: Duration = Duration::from_secs(120);

/// README.md and every Markdown page under docs/, in a fixed order.
fn pages() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
            .expect("docs/ is readable")
            .map(|e| e.expect("a directory entry").path())
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    let mut out = vec![repo().join("README.md")];
    walk(&repo().join("docs"), &mut out);
    out
}

/// What the test does with an example.
#[derive(Debug, PartialEq)]
enum Expect {
    Exit(i32),
    Skip,
}

#[derive(Debug)]
struct Example {
    /// The line of the page it starts on, from 1.
    line: usize,
    command: String,
    expect: Expect,
}

/// The comment of a shell line: what follows the first `#` that starts a word outside quotes.
fn comment(command: &str) -> Option<&str> {
    let mut quote = None;
    let mut previous = ' ';
    for (i, c) in command.char_indices() {
        match (quote, c) {
            (None, '\'' | '"') => quote = Some(c),
            (Some(q), _) if c == q => quote = None,
            (None, '#') if previous.is_whitespace() => return Some(command[i + 1..].trim()),
            _ => {}
        }
        previous = c;
    }
    None
}

fn expectation(command: &str) -> Expect {
    let Some(comment) = comment(command) else {
        return Expect::Exit(0);
    };
    if comment.starts_with("needs ") {
        return Expect::Skip;
    }
    let code = comment.strip_prefix("exit ").map(|rest| {
        rest.split(|c: char| !c.is_ascii_digit())
            .next()
            .unwrap_or("")
    });
    match code.map(str::parse::<i32>) {
        Some(Ok(code)) => Expect::Exit(code),
        _ => Expect::Exit(0),
    }
}

/// The `memprof` commands of a page's ```` ```sh ```` (or ```` ```bash ````) blocks, with
/// continued lines (ending in `\`) joined.
fn examples(text: &str) -> Vec<Example> {
    let mut out = Vec::new();
    let mut in_shell = false;
    let mut pending: Option<(usize, String)> = None;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim();
        if let Some(fence) = trimmed.strip_prefix("```") {
            in_shell = !in_shell && matches!(fence.trim(), "sh" | "bash");
            pending = None;
            continue;
        }
        if !in_shell {
            continue;
        }
        let (start, mut command) = pending.take().unwrap_or((i + 1, String::new()));
        match trimmed.strip_suffix('\\') {
            Some(head) => {
                command.push_str(head);
                command.push(' ');
                pending = Some((start, command));
            }
            None => {
                command.push_str(trimmed);
                if command.starts_with("memprof ") {
                    let expect = expectation(&command);
                    out.push(Example {
                        line: start,
                        command,
                        expect,
                    });
                }
            }
        }
    }
    out
}

/// A fresh folder for one page's examples: `fixtures/`, the stand-ins and `bin/memprof`.
fn workspace(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("doc-examples-{}", std::process::id()))
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("bin")).expect("a temporary directory");
    let link = |target: &Path, at: &Path| {
        std::os::unix::fs::symlink(target, at).expect("a symbolic link");
    };
    link(&repo().join("fixtures"), &dir.join("fixtures"));
    for (name, fixture) in STAND_INS {
        link(&repo().join("fixtures").join(fixture), &dir.join(name));
    }
    link(
        Path::new(env!("CARGO_BIN_EXE_memprof")),
        &dir.join("bin/memprof"),
    );
    dir
}

/// Runs `command` with `sh` in `dir`, `memprof` first on the PATH; the exit code (None when
/// killed or past the timeout) and what it wrote to stderr.
fn run(dir: &Path, command: &str) -> (Option<i32>, String) {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut paths = vec![dir.join("bin")];
    paths.extend(std::env::split_paths(&path));
    let err = dir.join("stderr.txt");
    let mut child = Command::new("sh")
        .args(["-c", command])
        .current_dir(dir)
        .env("PATH", std::env::join_paths(paths).expect("a PATH"))
        .stdin(Stdio::null())
        .stdout(File::create(dir.join("stdout.txt")).expect("stdout file"))
        .stderr(File::create(&err).expect("stderr file"))
        .spawn()
        .expect("sh runs");
    let start = Instant::now();
    let code = loop {
        if let Some(status) = child.try_wait().expect("waits") {
            break status.code();
        }
        if start.elapsed() > EXAMPLE_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (code, std::fs::read_to_string(&err).unwrap_or_default())
}

#[test]
fn the_example_parser_follows_the_rules_of_docs_readme() {
    let page = "text\n```sh\nmemprof analyze a.pickle   # a comment\nmemprof gate x \\\n    --limit 1MiB   # exit 1: over\nmemprof view a   # needs a terminal\nmemprof plan kv --model 'a # b'\ncargo build\n```\n```python\nmemprof analyze not-shell\n```\n```\nmemprof analyze plain-fence\n```\n";
    let found = examples(page);
    let summary: Vec<(usize, &str, &Expect)> = found
        .iter()
        .map(|e| (e.line, e.command.as_str(), &e.expect))
        .collect();
    assert_eq!(
        summary,
        [
            (
                3,
                "memprof analyze a.pickle   # a comment",
                &Expect::Exit(0)
            ),
            (
                4,
                "memprof gate x  --limit 1MiB   # exit 1: over",
                &Expect::Exit(1)
            ),
            (6, "memprof view a   # needs a terminal", &Expect::Skip),
            (7, "memprof plan kv --model 'a # b'", &Expect::Exit(0)),
        ]
    );
}

#[test]
fn every_example_command_in_the_docs_runs() {
    let mut failures = Vec::new();
    let mut ran = 0;
    let mut ran_in_readme = 0;
    for page in pages() {
        let text = std::fs::read_to_string(&page).expect("the page");
        let found = examples(&text);
        if found.iter().all(|e| e.expect == Expect::Skip) {
            continue;
        }
        let rel = page
            .strip_prefix(repo())
            .expect("under the repository")
            .display()
            .to_string();
        let dir = workspace(&rel.replace('/', "_"));
        for example in found {
            let Expect::Exit(want) = example.expect else {
                continue;
            };
            let (code, err) = run(&dir, &example.command);
            ran += 1;
            if rel == "README.md" {
                ran_in_readme += 1;
            }
            if code != Some(want) {
                failures.push(format!(
                    "{rel}:{}: `{}` exited {code:?}, expected {want}; stderr: {err}",
                    example.line, example.command
                ));
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // The README shows analyze, diagnose, report and the gate; the docs every command.
    assert!(
        ran_in_readme >= 5,
        "only {ran_in_readme} README examples ran"
    );
    assert!(ran >= 50, "only {ran} examples ran");
}

/// The targets of a page's Markdown links, `[text](target)`.
fn links(text: &str) -> Vec<String> {
    text.split("](")
        .skip(1)
        .filter_map(|rest| rest.split_once(')').map(|(target, _)| target.to_string()))
        .collect()
}

#[test]
fn no_link_leaves_the_repository() {
    let mut bad = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).expect("the page");
        let rel = page.strip_prefix(repo()).expect("under the repository");
        if text.contains("../shared") {
            bad.push(format!("{}: names ../shared", rel.display()));
        }
        for target in links(&text) {
            let path = target.split('#').next().unwrap_or_default();
            if target.contains("://") || target.starts_with("mailto:") || path.starts_with('/') {
                bad.push(format!("{}: links to {target}", rel.display()));
                continue;
            }
            // Resolved by hand: the target need not exist for `..` to be counted.
            let mut depth = rel.components().count() - 1;
            for part in Path::new(path).components() {
                match part {
                    Component::ParentDir if depth == 0 => {
                        bad.push(format!("{}: {target} leaves the repository", rel.display()));
                        break;
                    }
                    Component::ParentDir => depth -= 1,
                    Component::Normal(_) => depth += 1,
                    _ => {}
                }
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
    assert_eq!(
        links("see [a](docs/a.md#x) and [b](../../b.md)"),
        ["docs/a.md#x", "../../b.md"]
    );
}

#[test]
fn the_readme_fits_in_150_lines_and_starts_with_what_ci_runs() {
    let text = std::fs::read_to_string(repo().join("README.md")).expect("README.md");
    let lines = text.lines().count();
    assert!(lines <= 150, "README.md has {lines} lines");
    // `.ci/run` relies on the README's first two commands: the first shell block's first lines.
    let commands: Vec<&str> = text
        .lines()
        .map(str::trim)
        .skip_while(|l| *l != "```sh")
        .skip(1)
        .take(2)
        .collect();
    assert_eq!(commands.len(), 2, "{commands:?}");
    assert!(
        commands[0]
            .starts_with("cargo run --release -- analyze fixtures/snapshots/demo_oom.pickle"),
        "{}",
        commands[0]
    );
    assert!(
        commands[1].starts_with("cargo test --workspace"),
        "{}",
        commands[1]
    );
}

/// Copies the files the script needs into `to`, keeping their paths.
fn copy_checkout(to: &Path) {
    for rel in [
        "scripts/try-without-gpu.sh",
        "kernels/cuda_driver.h",
        "kernels/fake_cuda/fake_cuda.c",
        "kernels/workloads/try_train.c",
    ] {
        let dest = to.join(rel);
        std::fs::create_dir_all(dest.parent().expect("a folder")).expect("mkdir");
        std::fs::copy(repo().join(rel), &dest).expect("copy");
    }
}

#[test]
fn try_without_gpu_records_the_demo_job_and_ends_with_its_analysis() {
    let base = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("try-without-gpu-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let checkout = base.join("some checkout");
    copy_checkout(&checkout);
    let out_dir = base.join("out");
    // From another folder, stdout a file (not a terminal: no dashboard), the binary and shim
    // named by the variables the script documents.
    let out = Command::new("bash")
        .arg(checkout.join("scripts/try-without-gpu.sh"))
        .arg(&out_dir)
        .current_dir(&base)
        .env("MEMPROF", env!("CARGO_BIN_EXE_memprof"))
        .env("MEMPROF_SHIM", shim())
        .stdin(Stdio::null())
        .output()
        .expect("bash runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(0), "{text}\n{}", stderr(&out));
    assert!(text.contains("step 12: out of memory in forward"), "{text}");
    assert!(
        !text.contains("== memprof view"),
        "no dashboard off a terminal: {text}"
    );
    let analysis = text
        .split("== memprof analyze")
        .nth(1)
        .expect("the analysis comes last");
    assert!(
        !analysis.contains("== "),
        "nothing after the analysis: {analysis}"
    );
    let site = |name: &str| {
        analysis
            .lines()
            .find(|l| l.contains("try_train.c:") && l.ends_with(name))
            .unwrap_or_else(|| panic!("{name} is a top site: {analysis}"))
            .to_string()
    };
    assert!(
        site("load_weights").contains("256.00 MiB      4 allocs"),
        "{analysis}"
    );
    assert!(
        site("keep_history").contains("160.00 MiB     10 allocs"),
        "{analysis}"
    );
    assert!(analysis.contains("OUT OF MEMORY"), "{analysis}");

    // The recording itself: the peak of step 11 and the failed 32 MiB request of step 12.
    let recording = out_dir.join("train.memprof");
    let json = memprof(&["analyze", "--json", &recording.display().to_string()]);
    assert_eq!(json.status.code(), Some(0), "{}", stderr(&json));
    let doc: Value = serde_json::from_slice(&json.stdout).expect("JSON");
    let device = &doc["inputs"][0]["devices"][0];
    const MIB: u64 = 1 << 20;
    assert_eq!(device["trace"]["peak_active_bytes"], 512 * MIB, "{device}");
    assert_eq!(device["oom"]["request_bytes"], 32 * MIB, "{device}");
    assert_eq!(device["oom"]["device_free_bytes"], 16 * MIB, "{device}");
    let _ = std::fs::remove_dir_all(&base);
}
