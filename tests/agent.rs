//! `memprof agent` end to end: the binary on the fake NVML, scraped by a real Prometheus
//! server (Debian's `prometheus` package; skipped with a message when /usr/bin/prometheus is
//! absent), with the values read back through Prometheus's query API. Also the alert rules of
//! `contrib/prometheus/` through `promtool`. A workload running the shim gets driver-level
//! series from its live stream.

use crate::attach_shim::{nccl_workload, workload};
use crate::nvml_fake::{fake_nvml, scenario, GONE_PID};
use crate::util::{memprof, repo, skip, stderr, Scratch};
use memprof::agent::MAX_CONNECTIONS;
use memprof::source::gpu::ProcView;
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const PROMETHEUS: &str = "/usr/bin/prometheus";
const PROMTOOL: &str = "/usr/bin/promtool";

/// Kills the child when dropped, so a failing assertion leaves no process behind.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `memprof agent ARGS` on a free loopback port; returns it and its address.
fn start_agent(args: &[&str], env: &[(&str, &Path)]) -> (Killed, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_memprof"));
    cmd.args(["agent", "--listen", "127.0.0.1:0", "--host", "testhost"])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (key, value) in env {
        cmd.env(key, value);
    }
    let mut child = Killed(cmd.spawn().expect("memprof agent starts"));
    let stderr = child.0.stderr.take().expect("piped stderr");
    let mut stderr = BufReader::new(stderr);
    let mut line = String::new();
    stderr
        .read_line(&mut line)
        .expect("the agent says where it listens");
    // Keep reading, so the agent never writes into a closed pipe.
    std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_owned();
    (child, addr)
}

/// One HTTP/1.0 GET; returns the status code and the body.
fn get(addr: &str, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").expect("send");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read");
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    (status, body.to_owned())
}

fn url_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The instant vector of `query`, as (labels, value) pairs, from Prometheus's HTTP API.
fn query(prometheus: &str, query: &str) -> Vec<(Value, f64)> {
    let (status, body) = get(
        prometheus,
        &format!("/api/v1/query?query={}", url_encode(query)),
    );
    assert_eq!(status, 200, "{query}: {body}");
    let doc: Value = serde_json::from_str(&body).expect("the API answers JSON");
    doc["data"]["result"]
        .as_array()
        .expect("a vector")
        .iter()
        .map(|r| {
            let value = r["value"][1]
                .as_str()
                .and_then(|v| v.parse().ok())
                .expect("a number");
            (r["metric"].clone(), value)
        })
        .collect()
}

/// The single value of `q`, which must select exactly one series.
fn one(prometheus: &str, q: &str) -> f64 {
    let result = query(prometheus, q);
    assert_eq!(result.len(), 1, "{q}: {result:?}");
    result[0].1
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

fn temp(name: &str) -> Scratch {
    Scratch::new(&format!("agent-{name}"))
}

#[test]
fn prometheus_scrapes_the_fake_nvml_figures() {
    let dir = fake_nvml("agent");
    let own = std::process::id();
    let scenario = scenario(&dir, own);
    // A workload running the shim, waiting with b and c alive, for the driver-level series.
    let (shim_child, _go, runtime) = workload("agent-prometheus");
    // And one whose device and pinned memory a library playing NCCL holds, for the split by
    // library; both allocated everything before the agent connects.
    let (nccl_child, _nccl_go, _nccl_out, _nccl_build) =
        nccl_workload("agent-prometheus-nccl", Some(&runtime));
    let (_agent, addr) = start_agent(
        &["--interval", "0.2"],
        &[
            ("LD_LIBRARY_PATH", &dir),
            ("FAKE_NVML_SCENARIO", &scenario),
            ("XDG_RUNTIME_DIR", &runtime),
        ],
    );
    // The agent answers before Prometheus is involved.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !get(&addr, "/metrics")
        .1
        .contains("memprof_gpu_memory_total_bytes{")
    {
        assert!(Instant::now() < deadline, "no sample served");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(get(&addr, "/nope").0, 404);

    if !Path::new(PROMETHEUS).is_file() {
        skip(&format!(
            "needs {PROMETHEUS} (Debian package prometheus), absent here"
        ));
        return;
    }
    let work = temp("prometheus");
    let config = work.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             scrape_configs:\n  - job_name: memprof\n    static_configs:\n      - targets: ['{addr}']\n"
        ),
    )
    .expect("write the config");
    let web = format!("127.0.0.1:{}", free_port());
    let log = std::fs::File::create(work.join("prometheus.log")).expect("log file");
    let _prometheus = Killed(
        Command::new(PROMETHEUS)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                work.join("data").display()
            ))
            .arg(format!("--web.listen-address={web}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("prometheus starts"),
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let ready = TcpStream::connect(&web).is_ok()
            && !query(&web, "memprof_process_memory_used_bytes").is_empty();
        if ready {
            break;
        }
        let log = std::fs::read_to_string(work.join("prometheus.log")).unwrap_or_default();
        assert!(Instant::now() < deadline, "no scrape in 120 s:\n{log}");
        std::thread::sleep(Duration::from_millis(500));
    }

    // Devices: every figure as the scenario has it; the device without memory figures has no
    // memory series, the one without utilization no utilization series.
    let totals = query(&web, "memprof_gpu_memory_total_bytes");
    assert_eq!(totals.len(), 2, "{totals:?}");
    let gpu0 = r#"{gpu="0",host="testhost",uuid="GPU-0f2b2a34-8d1c-4e0a-9a57-1b2c3d4e5f60",name="NVIDIA H100 80GB HBM3",job="memprof"}"#;
    assert_eq!(
        one(&web, &format!("memprof_gpu_memory_total_bytes{gpu0}")),
        85_899_345_920.0
    );
    assert_eq!(
        one(&web, &format!("memprof_gpu_memory_used_bytes{gpu0}")),
        1_073_741_824.0
    );
    assert_eq!(
        one(&web, &format!("memprof_gpu_memory_free_bytes{gpu0}")),
        84_825_604_096.0
    );
    assert_eq!(
        one(&web, &format!("memprof_gpu_utilization_percent{gpu0}")),
        87.0
    );
    assert_eq!(
        one(
            &web,
            &format!("memprof_gpu_memory_utilization_percent{gpu0}")
        ),
        40.0
    );
    assert_eq!(
        one(
            &web,
            r#"memprof_gpu_memory_total_bytes{gpu="1",uuid="",name=""}"#
        ),
        25_769_803_776.0
    );
    assert_eq!(one(&web, r#"memprof_gpu_memory_used_bytes{gpu="1"}"#), 0.0);
    let utilization = query(&web, "memprof_gpu_utilization_percent");
    let gpus: Vec<&str> = utilization
        .iter()
        .filter_map(|(m, _)| m["gpu"].as_str())
        .collect();
    assert_eq!(gpus.len(), 2);
    assert!(gpus.contains(&"0") && gpus.contains(&"2"), "{gpus:?}");
    assert_eq!(
        one(
            &web,
            r#"memprof_gpu_utilization_percent{gpu="2",name="GRID A100-8C"}"#
        ),
        5.0
    );

    // The shim workload's driver-level figures, labelled like NVML's (device 0 of the fake NVML).
    let shim = format!(r#"{{pid="{}",gpu="0",host="testhost"}}"#, shim_child.0.id());
    let deadline = Instant::now() + Duration::from_secs(30);
    while query(
        &web,
        &format!("memprof_process_driver_reserved_bytes{shim}"),
    )
    .is_empty()
    {
        assert!(Instant::now() < deadline, "no shim series in Prometheus");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        one(
            &web,
            &format!("memprof_process_driver_reserved_bytes{shim}")
        ),
        500_000.0
    );
    assert_eq!(
        one(
            &web,
            &format!("memprof_process_driver_peak_reserved_bytes{shim}")
        ),
        500_000.0
    );
    assert_eq!(
        one(
            &web,
            &format!("memprof_process_driver_oom_events_total{shim}")
        ),
        0.0
    );
    // By library: b and c from the program itself; NCCL's buffers and pinned memory.
    let by_library = |pid: u32, library: &str| {
        format!(
            r#"memprof_process_driver_bytes{{pid="{pid}",gpu="0",host="testhost",library="{library}"}}"#
        )
    };
    assert_eq!(
        one(&web, &by_library(shim_child.0.id(), "peak_oom")),
        500_000.0
    );
    let nccl = nccl_child.0.id();
    let deadline = Instant::now() + Duration::from_secs(30);
    while query(&web, &by_library(nccl, "libfakenccl.so")).is_empty() {
        assert!(Instant::now() < deadline, "no NCCL series in Prometheus");
        std::thread::sleep(Duration::from_millis(200));
    }
    let series = query(
        &web,
        &format!(r#"memprof_process_driver_bytes{{pid="{nccl}"}}"#),
    );
    let mut split: Vec<(String, f64)> = (series.iter())
        .map(|(m, v)| (m["library"].as_str().unwrap_or_default().to_owned(), *v))
        .collect();
    split.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        split,
        [
            ("libfakenccl.so".to_owned(), 16.0 * 1_048_576.0),
            ("nccl_hold".to_owned(), 1_048_576.0),
        ]
    );
    let pinned = query(
        &web,
        &format!(r#"memprof_process_pinned_host_bytes{{pid="{nccl}"}}"#),
    );
    assert_eq!(pinned.len(), 1, "{pinned:?}");
    assert_eq!(pinned[0].0["library"], "libfakenccl.so");
    assert_eq!(pinned[0].0["host"], "testhost");
    assert_eq!(pinned[0].1, 3.0 * 1_048_576.0);

    // Processes: ours with its command line, the one NVML has no figure for absent, the
    // growing one growing.
    let processes = query(&web, "memprof_process_memory_used_bytes");
    assert_eq!(processes.len(), 2, "{processes:?}");
    let ours = processes
        .iter()
        .find(|(m, _)| m["pid"] == own.to_string().as_str())
        .expect("our process is listed");
    assert_eq!(ours.1, 536_870_912.0);
    assert_eq!(ours.0["gpu"], "0");
    assert_eq!(ours.0["uuid"], "GPU-0f2b2a34-8d1c-4e0a-9a57-1b2c3d4e5f60");
    if let Some(command) = ProcView::system().command(own) {
        assert_eq!(ours.0["command"].as_str(), Some(command.as_str()));
    }
    let growing = format!(
        r#"memprof_process_memory_used_bytes{{pid="{}",gpu="1"}}"#,
        GONE_PID + 1
    );
    let before = one(&web, &growing);
    assert!(
        before >= 1_048_576.0 && (before - 1_048_576.0) % 4096.0 == 0.0,
        "{before}"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while one(&web, &growing) <= before {
        assert!(
            Instant::now() < deadline,
            "the growing process did not grow in Prometheus"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let _ = std::fs::remove_dir_all(&work);
}

/// The value of the one series of `name` whose labels contain `pid="PID"`, when present.
fn series_of(body: &str, name: &str, pid: u32) -> Option<f64> {
    let pid = format!("pid=\"{pid}\"");
    body.lines()
        .find(|l| l.starts_with(&format!("{name}{{")) && l.contains(&pid))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

#[test]
fn a_shim_process_gets_driver_level_series_until_it_ends() {
    let nvml = fake_nvml("agent-shim");
    let scenario = scenario(&nvml, std::process::id());
    let (mut child, mut stdin, runtime) = workload("agent-shim");
    let pid = child.0.id();
    let (_agent, addr) = start_agent(
        &["--interval", "0.1"],
        &[
            ("LD_LIBRARY_PATH", &nvml),
            ("FAKE_NVML_SCENARIO", &scenario),
            ("XDG_RUNTIME_DIR", &runtime),
        ],
    );
    let reserved = "memprof_process_driver_reserved_bytes";
    let wait = |what: &str, ok: &dyn Fn(&str) -> bool| -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let (status, body) = get(&addr, "/metrics");
            // 503 until the first GPU sample is in.
            assert!(status == 200 || status == 503, "{status}: {body}");
            if status == 200 && ok(&body) {
                return body;
            }
            assert!(Instant::now() < deadline, "waited for {what}:\n{body}");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    // b and c are alive while the workload waits.
    let body = wait("the shim's figures", &|b| {
        series_of(b, reserved, pid) == Some(500_000.0)
    });
    let line = body
        .lines()
        .find(|l| l.starts_with(reserved))
        .expect("the series");
    assert!(line.contains("host=\"testhost\",gpu=\"0\""), "{line}");
    assert!(line.contains("command=\""), "{line}");
    assert!(line.contains("peak_oom wait\""), "{line}");
    assert_eq!(
        series_of(&body, "memprof_process_driver_allocations_total", pid),
        Some(0.0),
        "what was alive before the agent connected is not counted"
    );
    stdin.write_all(b"go\n").expect("written");
    drop(stdin);
    assert!(child.0.wait().expect("exits").success());
    // Once the process has ended its series go away (the socket is gone).
    wait("the series to go", &|b| {
        series_of(b, reserved, pid).is_none()
    });
}

#[test]
fn a_replay_feeds_the_agent_and_a_bad_line_is_counted() {
    let dir = temp("replay");
    let recording = dir.join("run.jsonl");
    std::fs::write(
        &recording,
        "{\"time_ms\":1000,\"devices\":[{\"index\":0,\"name\":null,\"uuid\":null,\"total\":100,\"used\":10,\"free\":90,\"utilization_gpu_percent\":null,\"utilization_memory_percent\":null}],\"processes\":[]}\n\
         not json\n\
         {\"time_ms\":2000,\"devices\":[{\"index\":0,\"name\":null,\"uuid\":null,\"total\":100,\"used\":20,\"free\":80,\"utilization_gpu_percent\":null,\"utilization_memory_percent\":null}],\"processes\":[]}\n",
    )
    .expect("write the recording");
    let recorded = dir.join("again.jsonl");
    let (_agent, addr) = start_agent(
        &[
            "--interval",
            "0.05",
            "--replay",
            &recording.display().to_string(),
            "--record",
            &recorded.display().to_string(),
        ],
        &[],
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, body) = get(&addr, "/metrics");
        // 503 until the first GPU sample is in.
        assert!(status == 200 || status == 503, "{status}: {body}");
        if body.contains("memprof_sample_time_seconds 2.0") {
            assert!(
                body.contains("memprof_gpu_memory_used_bytes{host=\"testhost\",gpu=\"0\"} 20"),
                "{body}"
            );
            assert!(body.contains("memprof_failed_samples_total 1"), "{body}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the replay's last sample never came:\n{body}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // --record wrote the good samples back, line by line as they were taken.
    let parse = |text: &str| -> Vec<Value> {
        text.lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    };
    let written = std::fs::read_to_string(&recorded).expect("the recording exists");
    let original = std::fs::read_to_string(&recording).expect("read");
    assert_eq!(written.lines().count(), 2, "{written}");
    assert_eq!(parse(&written), parse(&original));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn no_nvml_or_a_bad_address_is_one_line_and_exit_2() {
    let dir = fake_nvml("agent-fails");
    // The fake refuses to initialize without a scenario, as NVML does without a driver.
    let out = Command::new(env!("CARGO_BIN_EXE_memprof"))
        .args(["agent", "--listen", "127.0.0.1:0"])
        .env("LD_LIBRARY_PATH", &dir)
        .env_remove("FAKE_NVML_SCENARIO")
        .output()
        .expect("memprof runs");
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        "memprof: error: NVML is not available: the NVIDIA driver is not loaded"
    );
    let recording = dir.join("empty.jsonl");
    std::fs::write(&recording, "").expect("write");
    let out = memprof(&[
        "agent",
        "--listen",
        "not-an-address",
        "--replay",
        &recording.display().to_string(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).starts_with("memprof: error: cannot listen on not-an-address"),
        "{}",
        stderr(&out)
    );
    assert_eq!(stderr(&out).lines().count(), 1);
}

#[test]
fn the_alert_rules_pass_promtool_and_fire_as_documented() {
    if !Path::new(PROMTOOL).is_file() {
        skip(&format!(
            "needs {PROMTOOL} (Debian package prometheus), absent here"
        ));
        return;
    }
    let rules = repo().join("contrib/prometheus");
    for (what, file) in [("check", "alerts.yml"), ("test", "alerts_test.yml")] {
        let out = Command::new(PROMTOOL)
            .args([what, "rules"])
            .arg(rules.join(file))
            .output()
            .expect("promtool runs");
        assert!(
            out.status.success(),
            "promtool {what} rules {file}:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

// Hostile and broken clients (the agent may listen on 0.0.0.0). Every loop below is bounded in
// count and in time, and every client talks to the agent on loopback only.

/// How long a scrape may take in these tests before it counts as not answered. The target is
/// 10 ms (benches/agent_scrape.rs measures it); this leaves room for a busy test machine.
const ANSWER_WITHIN: Duration = Duration::from_secs(2);

/// The agent on the fake NVML, not following shims (no reader threads), serving figures.
fn serving_agent(name: &str) -> (Killed, String) {
    let dir = fake_nvml(name);
    let scenario = scenario(&dir, std::process::id());
    let (agent, addr) = start_agent(
        &["--interval", "0.2", "--no-shims"],
        &[("LD_LIBRARY_PATH", &dir), ("FAKE_NVML_SCENARIO", &scenario)],
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while get(&addr, "/metrics").0 != 200 {
        assert!(Instant::now() < deadline, "no sample served");
        std::thread::sleep(Duration::from_millis(50));
    }
    (agent, addr)
}

fn connect(addr: &str) -> TcpStream {
    let addr = addr.parse().expect("an IP address and port");
    let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
    stream
        .set_read_timeout(Some(ANSWER_WITHIN))
        .expect("read timeout");
    stream
        .set_write_timeout(Some(ANSWER_WITHIN))
        .expect("write timeout");
    stream
}

/// Sends `request` on a fresh connection and reads until the agent closes it; the status code
/// and how long that took, or what went wrong (no answer within `ANSWER_WITHIN`, a reset).
fn exchange(addr: &str, request: &[u8]) -> Result<(u16, Duration), String> {
    let start = Instant::now();
    let addr_parsed = addr.parse().map_err(|e| format!("{addr}: {e}"))?;
    let mut stream = TcpStream::connect_timeout(&addr_parsed, ANSWER_WITHIN)
        .map_err(|e| format!("connect: {e}"))?;
    for timeout in [
        stream.set_read_timeout(Some(ANSWER_WITHIN)),
        stream.set_write_timeout(Some(ANSWER_WITHIN)),
    ] {
        timeout.map_err(|e| format!("timeout: {e}"))?;
    }
    stream
        .write_all(request)
        .map_err(|e| format!("send: {e}"))?;
    let mut answer = Vec::new();
    stream
        .read_to_end(&mut answer)
        .map_err(|e| format!("no complete answer after {:?}: {e}", start.elapsed()))?;
    let took = start.elapsed();
    let status = String::from_utf8_lossy(&answer)
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("no status line in {} bytes", answer.len()))?;
    if took > ANSWER_WITHIN {
        return Err(format!("answered {status} only after {took:?}"));
    }
    Ok((status, took))
}

/// `count` scrapes of /metrics, one after the other, each answered 200 within `ANSWER_WITHIN`.
fn assert_scrapes_answered(addr: &str, count: usize, while_what: &str) {
    for i in 0..count {
        match exchange(addr, b"GET /metrics HTTP/1.0\r\nHost: scraper\r\n\r\n") {
            Ok((200, _)) => {}
            Ok((status, _)) => panic!("scrape {i} {while_what}: status {status}"),
            Err(e) => panic!("scrape {i} {while_what}: {e}"),
        }
    }
}

/// `Threads:` of /proc/PID/status.
fn threads(pid: u32) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the agent runs");
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("a Threads: line")
}

/// The sockets the process holds open (its listener and its connections).
fn sockets(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("the agent runs")
        .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
        .filter(|target| target.to_string_lossy().starts_with("socket:"))
        .count()
}

/// Waits up to `limit` for the agent to hold at most `count` sockets; false when it never did.
fn sockets_drop_to(pid: u32, count: usize, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while sockets(pid) > count {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    true
}

fn assert_alive(agent: &mut Killed) {
    let exited = agent.0.try_wait().expect("wait");
    assert!(exited.is_none(), "the agent died: {exited:?}");
}

#[test]
fn a_huge_content_length_is_refused_and_the_agent_lives() {
    let (mut agent, addr) = serving_agent("agent-huge-body");
    for (request, refused) in [
        (
            "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\n",
            413,
        ),
        (
            "GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\n",
            413,
        ),
        // Past what hyper counts a body length in: a header it will not take (431).
        (
            "PUT / HTTP/1.1\r\nHost: x\r\nContent-Length: 18446744073709551615\r\n\r\n",
            431,
        ),
    ] {
        let answer = exchange(&addr, request.as_bytes());
        assert!(
            matches!(answer, Ok((status, _)) if status == refused),
            "{request:?}: {answer:?}"
        );
        assert_alive(&mut agent);
        assert_scrapes_answered(&addr, 1, "after a huge Content-Length");
    }
}

#[test]
fn a_body_on_metrics_is_refused() {
    let (_agent, addr) = serving_agent("agent-body");
    for request in [
        "GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello",
        "GET /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        "HEAD /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx",
    ] {
        let answer = exchange(&addr, request.as_bytes());
        assert!(matches!(answer, Ok((413, _))), "{request:?}: {answer:?}");
    }
    // An empty body is no body.
    let answer = exchange(
        &addr,
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    );
    assert!(matches!(answer, Ok((200, _))), "{answer:?}");
}

#[test]
fn four_clients_announcing_a_body_they_never_send_do_not_stop_scrapes() {
    let (mut agent, addr) = serving_agent("agent-no-body");
    let pid = agent.0.id();
    let idle = sockets(pid);
    let mut hanging = Vec::new();
    for i in 0..4 {
        let mut stream = connect(&addr);
        let method = if i % 2 == 0 { "GET" } else { "POST" };
        write!(
            stream,
            "{method} /metrics HTTP/1.1\r\nHost: x{i}\r\nContent-Length: 1000\r\n\r\n"
        )
        .expect("send the head");
        hanging.push(stream);
    }
    std::thread::sleep(Duration::from_millis(300));
    assert_scrapes_answered(&addr, 20, "with 4 bodies never sent");
    // Each of them is told no, and let go, without the body.
    for (i, stream) in hanging.iter_mut().enumerate() {
        let mut answer = Vec::new();
        let read = stream.read_to_end(&mut answer);
        let text = String::from_utf8_lossy(&answer);
        assert!(
            read.is_ok() && text.starts_with("HTTP/1.1 413"),
            "client {i}: {read:?} {text:?}"
        );
    }
    assert!(sockets_drop_to(pid, idle, Duration::from_secs(10)));
    assert_alive(&mut agent);
}

#[test]
fn a_client_that_pipelines_and_never_reads_does_not_stop_scrapes() {
    let (mut agent, addr) = serving_agent("agent-pipeline");
    let pid = agent.0.id();
    let idle = sockets(pid);
    let mut pipe = connect(&addr);
    pipe.set_write_timeout(Some(Duration::from_millis(200)))
        .expect("write timeout");
    let request = b"GET /metrics HTTP/1.1\r\nHost: pipeline\r\n\r\n";
    // Requests until the agent stops taking them (its answers are not read), at most 5 s.
    let start = Instant::now();
    let mut sent = 0;
    while sent < 200_000 && start.elapsed() < Duration::from_secs(5) {
        if pipe.write_all(request).is_err() {
            break;
        }
        sent += 1;
    }
    assert!(sent >= 1_500, "only {sent} requests went out");
    assert_scrapes_answered(&addr, 20, &format!("with {sent} pipelined requests unread"));
    // The connection that does not read its answers is cut (the write timeout, 10 s).
    assert!(
        sockets_drop_to(pid, idle, Duration::from_secs(30)),
        "the pipelining client is still connected after 30 s ({sent} requests)"
    );
    assert_scrapes_answered(&addr, 1, "after the pipelining client was cut");
    assert_alive(&mut agent);
    drop(pipe);
}

#[test]
fn a_slowloris_is_cut_and_scrapes_go_on() {
    let (mut agent, addr) = serving_agent("agent-slowloris");
    let mut slow = connect(&addr);
    slow.set_read_timeout(Some(Duration::from_millis(1)))
        .expect("read timeout");
    slow.write_all(b"GET /metrics HTTP/1.1\r\nHost: slow\r\nX-Trickle: ")
        .expect("send the start");
    // One header byte every 250 ms, at most 15 s, with a scrape between bytes.
    let start = Instant::now();
    let mut cut = None;
    while cut.is_none() && start.elapsed() < Duration::from_secs(15) {
        std::thread::sleep(Duration::from_millis(250));
        let mut buf = [0u8; 4096];
        cut = match slow.read(&mut buf) {
            // Closed by the agent (it may say 408 first).
            Ok(_) => Some(start.elapsed()),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => Some(start.elapsed()),
            Err(_) => slow.write_all(b"a").err().map(|_| start.elapsed()),
        };
        assert_scrapes_answered(&addr, 1, "while a slowloris trickles its headers");
    }
    let cut = cut.expect("the slowloris is still connected after 15 s");
    assert!(cut >= Duration::from_secs(4), "cut too early: {cut:?}");
    assert_alive(&mut agent);
}

#[test]
fn a_thousand_idle_connections_keep_threads_and_sockets_bounded() {
    let (mut agent, addr) = serving_agent("agent-idle");
    let pid = agent.0.id();
    let before = threads(pid);
    let idle: Vec<TcpStream> = (0..1_000).map(|_| connect(&addr)).collect();
    // Let the agent take them all.
    std::thread::sleep(Duration::from_millis(500));
    assert_scrapes_answered(&addr, 20, "with 1,000 idle connections");
    let during = threads(pid);
    assert!(
        during <= before + 2 && during <= 16,
        "{during} threads with 1,000 idle connections ({before} before)"
    );
    // The agent holds at most MAX_CONNECTIONS connections (and its listener): the ones idle
    // the longest went.
    let held = sockets(pid);
    assert!(
        held <= MAX_CONNECTIONS + 1,
        "the agent holds {held} sockets"
    );
    assert_alive(&mut agent);
    drop(idle);
}
