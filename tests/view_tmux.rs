//! End to end: the real `memprof view` in a real terminal (tmux), driven with `send-keys` and
//! read with `capture-pane`, as a person would see it; the terminal must come back in its
//! normal mode after `q`, Ctrl-C, SIGTERM and SIGINT.

use crate::util::{fixture, have};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// A tmux server of our own (its own socket), killed when dropped.
pub struct Tmux {
    socket: String,
}

static SERVERS: AtomicUsize = AtomicUsize::new(0);

impl Tmux {
    /// Starts `command` in a detached `width` x `height` session; `None`, the test skipped
    /// saying so, without tmux.
    pub fn start(command: &str, width: u16, height: u16) -> Option<Tmux> {
        if !have("tmux") {
            return None;
        }
        let n = SERVERS.fetch_add(1, Ordering::SeqCst);
        let tmux = Tmux {
            socket: format!("memprof-test-{}-{n}", std::process::id()),
        };
        let (w, h) = (width.to_string(), height.to_string());
        let out = tmux.run(&["new-session", "-d", "-x", &w, "-y", &h, command]);
        assert!(out.status.success(), "tmux starts: {:?}", out);
        Some(tmux)
    }

    pub fn run(&self, args: &[&str]) -> Output {
        Command::new("tmux")
            .args(["-L", &self.socket, "-f", "/dev/null"])
            .args(args)
            .output()
            .expect("tmux is installed (the CI script installs it)")
    }

    pub fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys"];
        args.extend_from_slice(keys);
        assert!(self.run(&args).status.success());
    }

    pub fn screen(&self) -> String {
        String::from_utf8_lossy(&self.run(&["capture-pane", "-p"]).stdout).into_owned()
    }

    /// Waits until the screen satisfies `ok` and holds still (the same on a second look 40 ms
    /// later, so a frame is not caught half drawn), and returns it; fails after 20 s.
    pub fn wait_for(&self, what: &str, ok: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let screen = self.screen();
            if ok(&screen) {
                std::thread::sleep(Duration::from_millis(40));
                if self.screen() == screen {
                    return screen;
                }
            }
            assert!(
                Instant::now() < deadline,
                "waited for {what}; screen:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn wait_text(&self, text: &str) -> String {
        self.wait_for(text, |s| s.contains(text))
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        // Never a panic here: one while a failed test unwinds would abort the whole binary.
        let _ = Command::new("tmux")
            .args(["-L", &self.socket, "kill-server"])
            .output();
    }
}

/// A shell line that runs `view` on demo_oom, then prints its exit code and whether the
/// terminal is back in canonical (cooked) mode, then a marker, and waits.
fn view_then_report() -> String {
    format!(
        "sh -c '{} view {}; echo \"exit=$?\"; stty -a | tr \" ;\" \"\\n\\n\" | grep -x -e icanon -e -icanon; echo end-of-check; sleep 60'",
        env!("CARGO_BIN_EXE_memprof"),
        fixture("snapshots/demo_oom.pickle").display()
    )
}

#[test]
fn view_in_tmux_browses_resizes_and_quits_cleanly() {
    let Some(tmux) = Tmux::start(&view_then_report(), 100, 30) else {
        return;
    };
    let screen = tmux.wait_text("Memory over time");
    assert!(screen.contains("demo_oom.pickle"), "{screen}");
    assert!(
        screen.contains("entry 942 of 1649"),
        "opens at the peak:\n{screen}"
    );
    tmux.keys(&["o"]);
    let screen = tmux.wait_text("Out of memory");
    assert!(screen.contains("fragmentation"), "{screen}");
    assert!(screen.contains("request 4.03 GiB"), "{screen}");
    tmux.keys(&["?"]);
    tmux.wait_text("memprof view: keys");
    tmux.keys(&["x", "Home", "Tab"]);
    let screen = tmux.wait_text("entry 0 of 1649");
    assert!(
        !screen.contains("memprof view: keys"),
        "help closed:\n{screen}"
    );
    assert!(tmux
        .run(&["resize-window", "-x", "80", "-y", "24"])
        .status
        .success());
    // The whole 80x24 frame, not one caught while tmux is still drawing it.
    let screen = tmux.wait_for("an 80x24 frame at entry 0", |s| {
        let lines: Vec<&str> = s.lines().collect();
        lines.len() >= 24
            && lines[1].starts_with('┌')
            && lines[1].chars().count() == 80
            && lines[1].ends_with('┐')
            && s.contains("entry 0 of 1649")
    });
    assert!(screen.contains("entry 0 of 1649"), "{screen}");
    tmux.keys(&["q"]);
    let screen = tmux.wait_text("end-of-check");
    assert!(screen.contains("exit=0"), "{screen}");
    assert!(
        !screen.contains("Memory over time"),
        "left the alternate screen:\n{screen}"
    );
    assert!(
        screen.lines().any(|l| l == "icanon"),
        "raw mode is off:\n{screen}"
    );
}

#[test]
fn view_in_tmux_ctrl_c_restores_the_terminal() {
    let Some(tmux) = Tmux::start(&view_then_report(), 90, 26) else {
        return;
    };
    tmux.wait_text("Memory over time");
    tmux.keys(&["C-c"]);
    let screen = tmux.wait_text("end-of-check");
    assert!(screen.contains("exit=0"), "{screen}");
    assert!(!screen.contains("Memory over time"), "{screen}");
    assert!(screen.lines().any(|l| l == "icanon"), "{screen}");
}

/// The PID of the pane's `memprof` (the child of the pane's shell).
fn memprof_pid(tmux: &Tmux) -> u32 {
    let out = tmux.run(&["display", "-p", "#{pane_pid}"]);
    let shell = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let children = std::fs::read_dir("/proc").expect("/proc").filter_map(|e| {
        let stat = std::fs::read_to_string(e.ok()?.path().join("stat")).ok()?;
        let (pid, rest) = stat.split_once(" (")?;
        let (comm, fields) = rest.rsplit_once(") ")?;
        let ppid = fields.split(' ').nth(1)?;
        (comm == "memprof" && ppid == shell).then(|| pid.parse().ok())?
    });
    children
        .into_iter()
        .next()
        .expect("memprof runs in the pane")
}

/// `kill -SIGNAL` on the pane's memprof: the terminal comes back and memprof exits 128 + signal.
fn signal_restores_the_terminal(signal: &str, exit: u32) {
    let Some(tmux) = Tmux::start(&view_then_report(), 90, 26) else {
        return;
    };
    tmux.wait_text("Memory over time");
    let pid = memprof_pid(&tmux).to_string();
    let killed = Command::new("kill")
        .args([format!("-{signal}"), pid])
        .status()
        .expect("kill");
    assert!(killed.success());
    let screen = tmux.wait_text("end-of-check");
    assert!(
        screen.contains(&format!("exit={exit}")),
        "128 + SIG{signal}:\n{screen}"
    );
    assert!(!screen.contains("Memory over time"), "{screen}");
    assert!(screen.lines().any(|l| l == "icanon"), "{screen}");
}

#[test]
fn view_in_tmux_sigterm_restores_the_terminal() {
    signal_restores_the_terminal("TERM", 143);
}

/// SIGINT sent from outside (a supervisor, `timeout -s INT`), not Ctrl-C typed in raw mode.
#[test]
fn view_in_tmux_sigint_from_outside_restores_the_terminal() {
    signal_restores_the_terminal("INT", 130);
}

#[test]
fn view_refuses_a_bad_file_with_one_line_and_exit_2() {
    let Some(tmux) = Tmux::start(
        &format!(
            "sh -c '{} view /nonexistent.pickle; echo \"exit=$?\"; sleep 60'",
            env!("CARGO_BIN_EXE_memprof")
        ),
        100,
        10,
    ) else {
        return;
    };
    let screen = tmux.wait_text("exit=");
    assert!(screen.contains("exit=2"), "{screen}");
    assert!(
        screen.contains("memprof: error: /nonexistent.pickle"),
        "{screen}"
    );
    assert!(!screen.contains("panicked"), "{screen}");
}

/// On a real snapshot: the stack panel opens on the user's frame, `f` shows every frame and
/// `[` scrolls up to the capture frames PyTorch records first.
#[test]
fn view_in_tmux_opens_a_real_stack_on_the_users_frame() {
    let Some(path) = crate::util::real_file("JasperSolt__EoR_NN__snapshot.pickle") else {
        return;
    };
    let command = format!(
        "sh -c '{} view {}; sleep 60'",
        env!("CARGO_BIN_EXE_memprof"),
        path.display()
    );
    let Some(tmux) = Tmux::start(&command, 100, 30) else {
        return;
    };
    tmux.wait_text("Memory over time");
    tmux.keys(&["Tab", "j", "j", "j", "j"]);
    let user = "▶ /oscar/home/jsolt/FourierNN/counterfactuals.py:102:generate_counterfactuals";
    let screen = tmux.wait_text(user);
    assert!(screen.contains("filtered stack, "), "{screen}");
    assert!(!screen.contains("unwind::unwind"), "{screen}");
    tmux.keys(&["f"]);
    let screen = tmux.wait_text("full stack, ");
    assert!(screen.contains(user), "{screen}");
    tmux.keys(&["?"]);
    let screen = tmux.wait_text("memprof view: keys");
    assert!(screen.contains("scroll the stack up / down"), "{screen}");
    tmux.keys(&["x"]);
    tmux.keys(&["["; 30]);
    let screen = tmux.wait_text("  torch::unwind::unwind()");
    assert!(screen.contains("full stack, 1-7 of "), "{screen}");
    tmux.keys(&["q"]);
}

/// demo_oom with its trace played `times` over, as a PyTorch snapshot pickle in `dir`: a file
/// of over a megabyte, segments first, as PyTorch writes them.
fn long_demo(dir: &std::path::Path, times: usize) -> std::path::PathBuf {
    use memprof::model::{Snapshot, Timeline};
    let file = std::fs::File::open(fixture("snapshots/demo_oom.pickle")).expect("fixture");
    let demo = memprof::source::torch_snapshot::read(file)
        .expect("parses")
        .snapshot;
    let one = demo.timeline.device(0);
    let entries: Vec<_> = (0..times).flat_map(|_| one.iter().copied()).collect();
    let n = entries.len();
    let mut timeline = Timeline::new(entries, std::iter::once(0..n).collect());
    timeline.set_streams(demo.timeline.streams().to_vec());
    timeline.set_pools(demo.timeline.pools().to_vec());
    let long = Snapshot {
        timeline,
        annotations: Vec::new(),
        ..demo
    };
    let path = dir.join("long_demo.pickle");
    crate::util::write_snapshot(&long, &path);
    path
}

/// A shell line that runs `view` on `file` read through a pipe that stops for `pause` seconds
/// after its first `head` bytes (a slow disk or network), then reports as `view_then_report`.
fn view_paused_then_report(file: &std::path::Path, head: u64, pause: u32) -> String {
    let f = file.display();
    format!(
        "bash -c '{} view <(head -c {head} {f}; sleep {pause}; tail -c +{} {f}); echo \"exit=$?\"; stty -a | tr \" ;\" \"\\n\\n\" | grep -x -e icanon -e -icanon; echo end-of-check; sleep 60'",
        env!("CARGO_BIN_EXE_memprof"),
        head + 1
    )
}

/// The loading screen comes first, with the dump's figures once the segments are read, and
/// the dashboard replaces it when the whole file is read.
#[test]
fn view_in_tmux_shows_the_loading_screen_then_the_dashboard() {
    if !have("bash") {
        return;
    }
    let scratch = crate::util::Scratch::new("view-loading");
    let file = long_demo(&scratch, 40);
    let size = std::fs::metadata(&file).expect("written").len();
    // Past the first megabyte the reader hands on, well before the end.
    assert!(size > 1_500_000, "{size} bytes");
    let Some(tmux) = Tmux::start(&view_paused_then_report(&file, 1_200_000, 4), 100, 30) else {
        return;
    };
    let screen = tmux.wait_text("At the dump, from the segments");
    assert!(screen.contains("│ a stream │ loading"), "{screen}");
    assert!(screen.contains("q quit"), "{screen}");
    let screen = tmux.wait_text("device 0: ");
    assert!(screen.contains("reserved"), "{screen}");
    assert!(screen.contains("so far"), "{screen}");
    assert!(!screen.contains("Memory over time"), "{screen}");
    tmux.keys(&["?"]);
    tmux.wait_text("memprof view: keys");
    tmux.keys(&["x"]);
    let screen = tmux.wait_text("Memory over time");
    assert!(!screen.contains("loading"), "{screen}");
    tmux.keys(&["q"]);
    let screen = tmux.wait_text("end-of-check");
    assert!(screen.contains("exit=0"), "{screen}");
    assert!(screen.lines().any(|l| l == "icanon"), "{screen}");
}

/// `q` while the file is still being read ends `view` at once, with the terminal restored.
#[test]
fn view_in_tmux_quits_while_loading() {
    if !have("bash") {
        return;
    }
    let scratch = crate::util::Scratch::new("view-loading-quit");
    let file = long_demo(&scratch, 40);
    let Some(tmux) = Tmux::start(&view_paused_then_report(&file, 1_200_000, 600), 100, 30) else {
        return;
    };
    tmux.wait_text("device 0: ");
    let asked = Instant::now();
    tmux.keys(&["q"]);
    let screen = tmux.wait_text("end-of-check");
    let took = asked.elapsed();
    assert!(screen.contains("exit=0"), "{screen}");
    assert!(!screen.contains("At the dump"), "{screen}");
    assert!(screen.lines().any(|l| l == "icanon"), "{screen}");
    assert!(took < Duration::from_secs(3), "quit took {took:?}");
}

/// A file that fails half way through its load: the terminal comes back, then the same one
/// line as `analyze` prints, and exit code 2.
#[test]
fn view_in_tmux_reports_a_file_cut_short_after_restoring_the_terminal() {
    let scratch = crate::util::Scratch::new("view-cut");
    let demo = std::fs::read(fixture("snapshots/demo_oom.pickle")).expect("fixture");
    let cut = scratch.join("cut.pickle");
    std::fs::write(&cut, &demo[..demo.len() / 2]).expect("writable");
    let analyze = crate::util::memprof(&["analyze", &cut.display().to_string()]);
    let line = crate::util::stderr(&analyze);
    let line = line.trim_end();
    assert!(line.starts_with("memprof: error: "), "{line}");
    let command = format!(
        "sh -c '{} view {}; echo \"exit=$?\"; stty -a | tr \" ;\" \"\\n\\n\" | grep -x -e icanon -e -icanon; echo end-of-check; sleep 60'",
        env!("CARGO_BIN_EXE_memprof"),
        cut.display()
    );
    let Some(tmux) = Tmux::start(&command, 200, 20) else {
        return;
    };
    let screen = tmux.wait_text("end-of-check");
    assert!(screen.contains("exit=2"), "{screen}");
    assert!(screen.lines().any(|l| l == line), "{line}:\n{screen}");
    assert!(screen.lines().any(|l| l == "icanon"), "{screen}");
    assert!(!screen.contains("panicked"), "{screen}");
}

/// A snapshot with nothing in it: the terminal comes back, then one line and exit code 2.
#[test]
fn view_in_tmux_refuses_an_empty_snapshot_after_restoring_the_terminal() {
    let scratch = crate::util::Scratch::new("view-empty");
    let empty = scratch.join("empty.pickle");
    // pickle.dumps({'segments': [], 'device_traces': []}, protocol=2)
    let bytes = b"\x80\x02}q\x00(X\x08\x00\x00\x00segmentsq\x01]q\x02X\r\x00\x00\x00device_tracesq\x03]q\x04u.";
    std::fs::write(&empty, bytes).expect("writable");
    let command = format!(
        "sh -c '{} view {}; echo \"exit=$?\"; stty -a | tr \" ;\" \"\\n\\n\" | grep -x -e icanon -e -icanon; echo end-of-check; sleep 60'",
        env!("CARGO_BIN_EXE_memprof"),
        empty.display()
    );
    let Some(tmux) = Tmux::start(&command, 200, 20) else {
        return;
    };
    let screen = tmux.wait_text("end-of-check");
    assert!(screen.contains("exit=2"), "{screen}");
    let line = format!(
        "memprof: error: {}: the snapshot has no segments and no trace entries: nothing to view",
        empty.display()
    );
    assert!(screen.lines().any(|l| l == line), "{screen}");
    assert!(screen.lines().any(|l| l == "icanon"), "{screen}");
}
