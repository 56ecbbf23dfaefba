//! The `view` dashboard drawn into ratatui's `TestBackend` from real snapshot fixtures, at
//! several terminal sizes, after scripted keys; compared with insta snapshots
//! (`tests/snapshots/`). Styles are checked cell by cell where text cannot show them.

use crate::util::{fixture, screen};
use insta::assert_snapshot;
use memprof::account::{DeviceReport, Options};
use memprof::analysis::categories::CategoryRules;
use memprof::diagnose::Origin;
use memprof::model::Snapshot;
use memprof::source::torch_snapshot;
use memprof::tui::keys::Key;
use memprof::tui::theme::Theme;
use memprof::tui::view::{Prebuilt, ViewApp};
use memprof::tui::Dashboard;
use ratatui::backend::TestBackend;
use ratatui::style::{Color, Modifier};
use ratatui::Terminal;

fn load(name: &str) -> Snapshot {
    let file = std::fs::File::open(fixture(&format!("snapshots/{name}.pickle"))).expect("fixture");
    torch_snapshot::read(file).expect("parses").snapshot
}

/// What `memprof view` shows: the account of every device (as `analyze` builds it), with the
/// classifiers it kept.
fn analyses(snapshot: &Snapshot) -> (Vec<DeviceReport>, Prebuilt<'_>) {
    let rules = CategoryRules::default();
    let (account, classifiers) = memprof::account::build_keeping_classifiers(
        snapshot,
        &Options::new(10, &rules, Origin::TorchSnapshot),
    );
    let built = Prebuilt {
        classifiers,
        summaries: Vec::new(),
    };
    (account.devices, built)
}

/// Draws `app` on a `width` x `height` terminal after `keys`.
fn draw(app: &mut ViewApp, width: u16, height: u16, keys: &[Key]) -> Terminal<TestBackend> {
    app.on_resize(width, height);
    for &key in keys {
        app.on_key(key);
    }
    let mut terminal = Terminal::new(TestBackend::new(width, height)).expect("test terminal");
    terminal
        .draw(|f| app.render(f.area(), f.buffer_mut()))
        .expect("draws");
    terminal
}

fn app<'a>(name: &str, snapshot: &'a Snapshot, theme: Theme) -> ViewApp<'a> {
    let (reports, built) = analyses(snapshot);
    ViewApp::new(format!("{name}.pickle"), snapshot, reports, built, theme)
        .expect("the fixture has a device")
}

#[test]
fn view_demo_oom_at_several_sizes() {
    let snap = load("demo_oom");
    for (w, h) in [(80, 24), (120, 40), (200, 50)] {
        let mut a = app("demo_oom", &snap, Theme::colored());
        let t = draw(&mut a, w, h, &[]);
        assert_snapshot!(format!("view_demo_oom_{w}x{h}"), t.backend());
    }
}

#[test]
fn view_demo_oom_after_keys() {
    let snap = load("demo_oom");
    let cases: [(&str, &[Key]); 4] = [
        ("oom_panel", &[Key::Char('o')]),
        (
            "zoomed_blocks",
            &[
                Key::Char('z'),
                Key::Char('z'),
                Key::Char('z'),
                Key::Tab,
                Key::Down,
            ],
        ),
        ("help", &[Key::Char('?')]),
        ("start_of_trace", &[Key::Home, Key::Char('d')]),
    ];
    for (name, keys) in cases {
        let mut a = app("demo_oom", &snap, Theme::colored());
        let t = draw(&mut a, 80, 24, keys);
        assert_snapshot!(format!("view_demo_oom_{name}"), t.backend());
    }
}

#[test]
fn view_other_fixtures() {
    for name in ["segments_only", "multi_device", "expandable"] {
        let snap = load(name);
        let mut a = app(name, &snap, Theme::colored());
        let t = draw(&mut a, 100, 30, &[Key::Char('d')]);
        assert_snapshot!(format!("view_{name}"), t.backend());
    }
}

#[test]
fn the_block_selection_stops_at_the_last_block() {
    let snap = load("demo_oom");
    let mut a = app("demo_oom", &snap, Theme::plain());
    let blocks = a.at_cursor.largest.len();
    assert!(blocks > 2);
    for _ in 0..100 {
        a.on_key(Key::Down);
    }
    a.on_key(Key::Up);
    assert_eq!(a.state.selected_block, blocks - 2);
}

#[test]
fn view_survives_tiny_terminals() {
    let snap = load("demo_oom");
    for (w, h) in [(1, 1), (10, 3), (30, 8), (79, 23)] {
        let mut a = app("demo_oom", &snap, Theme::colored());
        draw(&mut a, w, h, &[Key::Char('?')]);
        draw(&mut a, w, h, &[Key::Right, Key::Char('z'), Key::Tab]);
    }
}

#[test]
fn no_color_draws_without_colours_and_colour_never_sets_a_background() {
    let snap = load("demo_oom");
    let mut plain = app("demo_oom", &snap, Theme::plain());
    let t = draw(&mut plain, 120, 40, &[]);
    let cells = &t.backend().buffer().content;
    assert!(cells
        .iter()
        .all(|c| c.fg == Color::Reset && c.bg == Color::Reset));
    assert!(cells
        .iter()
        .any(|c| c.modifier.contains(Modifier::REVERSED)));
    let mut colored = app("demo_oom", &snap, Theme::colored());
    let t = draw(&mut colored, 120, 40, &[]);
    let cells = &t.backend().buffer().content;
    assert!(cells.iter().all(|c| c.bg == Color::Reset));
    assert!(cells.iter().any(|c| c.fg == Color::Blue));
}

#[test]
fn the_cursor_column_moves_with_the_keys() {
    let snap = load("demo_oom");
    let mut a = app("demo_oom", &snap, Theme::plain());
    let reversed_columns = |t: &Terminal<TestBackend>| -> Vec<u16> {
        let buf = t.backend().buffer();
        let mut xs: Vec<u16> = (2..9)
            .flat_map(|y| (0..buf.area.width).map(move |x| (x, y)))
            .filter(|&(x, y)| buf[(x, y)].modifier.contains(Modifier::REVERSED))
            .map(|(x, _)| x)
            .collect();
        xs.dedup();
        xs
    };
    let before = reversed_columns(&draw(&mut a, 100, 30, &[]));
    let after = reversed_columns(&draw(&mut a, 100, 30, &[Key::Left, Key::Left]));
    assert_eq!(before.len(), 1, "{before:?}");
    assert_eq!(after.len(), 1, "{after:?}");
    assert_eq!(after[0] + 2, before[0]);
}

/// `t` shows the tree of what is live at the cursor (the peak, where `view` opens): its root
/// holds the allocated bytes the cursor panel shows there (requested bytes at an entry where
/// they are not known), `Enter` opens and closes the selected frame, and the tree follows the
/// cursor.
#[test]
fn the_tree_pane_shows_what_is_live_at_the_cursor_and_folds() {
    let snap = load("demo_oom");
    let mut a = app("demo_oom", &snap, Theme::plain());
    let t = draw(&mut a, 100, 30, &[Key::Char('t')]);
    let text = screen(&t);
    assert!(text.contains("Live at the cursor, caller first"), "{text}");
    let (_, tree) = a.cursor_tree.as_ref().expect("built when shown");
    let root = &tree.root;
    let figures = a.device().account.figures_at(a.at_cursor.index);
    assert_eq!(
        Some(root.inclusive_bytes),
        figures.and_then(|f| f.allocated_bytes),
        "the root is what is allocated"
    );
    assert!(text.contains("allocated bytes, caller first"), "{text}");
    let rows = |a: &ViewApp| -> usize {
        let (_, tree) = a.cursor_tree.as_ref().expect("a tree");
        memprof::tui::view::tree::rows(&tree.root, &a.state.tree_open).len()
    };
    assert_eq!(
        rows(&a),
        1 + root.children.len(),
        "the root opens on its callers"
    );
    let opened = draw(&mut a, 100, 30, &[Key::Down, Key::Enter]);
    assert!(
        rows(&a)
            > 1 + a
                .cursor_tree
                .as_ref()
                .map_or(0, |t| t.1.root.children.len())
    );
    assert_snapshot!("view_demo_oom_tree", opened.backend());
    draw(&mut a, 100, 30, &[Key::Enter]);
    draw(&mut a, 100, 30, &[Key::Up, Key::Enter]);
    assert_eq!(rows(&a), 1, "the root closed");
    // The cursor moves: the tree is rebuilt at the new entry.
    draw(&mut a, 100, 30, &[Key::Home]);
    assert_eq!(a.cursor_tree.as_ref().map(|t| t.0), Some(Some(0)));
    assert_eq!(
        a.cursor_tree.as_ref().map(|t| t.1.root.inclusive_bytes),
        Some(a.at_cursor.allocated),
        "requested bytes where the allocated ones are not known"
    );
    draw(&mut a, 100, 30, &[Key::Char('t')]);
    assert!(a.cursor_tree.is_none(), "hidden again");
}

/// The anomalies panel (Tab from the sites) shows the account's anomaly lines as `analyze`
/// prints them.
#[test]
fn the_anomalies_panel_lists_stalls_leak_suspects_and_lifetimes() {
    let snap = load("pending_free");
    let mut a = app("pending_free", &snap, Theme::plain());
    let t = draw(&mut a, 100, 40, &[Key::Tab, Key::Tab, Key::Tab]);
    let text = screen(&t);
    assert!(text.contains("Anomalies over the trace"), "{text}");
    for line in [
        "pending-free stalls",
        "leak suspects",
        "freed blocks by lifetime",
    ] {
        assert!(text.contains(line), "{line}: {text}");
    }
}

/// The one stack line marked as the site's frame.
fn marked(screen: &str) -> &str {
    let lines: Vec<&str> = screen.lines().filter(|l| l.contains('▶')).collect();
    assert_eq!(lines.len(), 1, "{screen}");
    lines[0]
}

#[test]
fn a_real_stack_opens_on_the_users_frame_scrolls_and_shows_every_frame_on_f() {
    let Some(path) = crate::util::real_file("JasperSolt__EoR_NN__snapshot.pickle") else {
        return;
    };
    let file = std::fs::File::open(path).expect("the real snapshot");
    let snap = torch_snapshot::read(file).expect("parses").snapshot;
    let (reports, built) = analyses(&snap);
    let mut a = ViewApp::new("real.pickle".into(), &snap, reports, built, Theme::plain())
        .expect("a device");
    // The fifth largest block at the peak: allocated on the user's line 102, 13 filtered
    // frames down, past the 7 rows the panel has for its stack.
    let keys = [Key::Tab, Key::Down, Key::Down, Key::Down, Key::Down];
    let s = screen(&draw(&mut a, 100, 30, &keys));
    let user = "/oscar/home/jsolt/FourierNN/counterfactuals.py:102:generate_counterfactuals";
    assert!(marked(&s).contains(user), "{s}");
    assert!(s.contains("filtered stack, "), "{s}");
    assert!(!s.contains("unwind::unwind"), "{s}");
    // The first block: a backward pass, its site the autograd node.
    let s = screen(&draw(&mut a, 100, 30, &[Key::Up; 4]));
    assert!(
        marked(&s).contains("torch::autograd::generated::AddmmBackward0::apply"),
        "{s}"
    );
    // Every frame, still opened on the site.
    let s = screen(&draw(&mut a, 100, 30, &[Key::Char('f')]));
    assert!(s.contains("full stack, "), "{s}");
    assert!(marked(&s).contains("AddmmBackward0::apply("), "{s}");
    // Up to the top: the capture frames PyTorch records first.
    let s = screen(&draw(&mut a, 100, 30, &[Key::Char('['); 40]));
    assert!(s.contains("full stack, 1-7 of 27"), "{s}");
    assert!(s.contains("  torch::unwind::unwind()"), "{s}");
    // Down to the bottom, and no further.
    let s = screen(&draw(&mut a, 100, 30, &[Key::Char(']'); 40]));
    assert!(s.contains("full stack, 21-27 of 27"), "{s}");
    let s = screen(&draw(&mut a, 100, 30, &[Key::Char('[')]));
    assert!(s.contains("full stack, 20-26 of 27"), "{s}");
    // Back to the filtered stack, opened on the site again.
    let s = screen(&draw(&mut a, 100, 30, &[Key::Char('f')]));
    assert!(s.contains("filtered stack, "), "{s}");
    assert!(marked(&s).contains("AddmmBackward0::apply"), "{s}");
}

mod top {
    use insta::assert_snapshot;
    use memprof::model::Bytes;
    use memprof::source::gpu::{DeviceSample, FixedClock, ProcessSample, Sample, Scripted};
    use memprof::tui::keys::Key;
    use memprof::tui::theme::Theme;
    use memprof::tui::top::TopApp;
    use memprof::tui::Dashboard;
    use ratatui::backend::TestBackend;
    use ratatui::Terminal;
    use std::time::Duration;

    const GIB: u64 = 1 << 30;
    /// 2026-11-30 10:20:00 UTC.
    const NOW_MS: u64 = 1_796_034_000_000;

    fn gpu(index: u32, used: Option<u64>) -> DeviceSample {
        DeviceSample {
            index,
            name: Some("NVIDIA H100 80GB HBM3".into()),
            uuid: Some(format!("GPU-{index}")),
            total: Some(Bytes(80 * GIB)),
            used: used.map(Bytes),
            free: used.map(|u| Bytes(80 * GIB - u)),
            utilization_gpu_percent: used.map(|_| 37),
            utilization_memory_percent: None,
        }
    }

    fn process(pid: u32, device: u32, used: Option<u64>, command: Option<&str>) -> ProcessSample {
        ProcessSample {
            pid,
            device,
            used: used.map(Bytes),
            command: command.map(str::to_string),
        }
    }

    /// Two samples: the trainer grows past the server between them.
    fn script() -> Scripted {
        let first = Sample {
            time_ms: 0,
            devices: vec![gpu(0, Some(61 * GIB)), gpu(1, None)],
            processes: vec![
                process(4242, 0, Some(20 * GIB), Some("python train.py --bs 32")),
                process(777, 0, Some(40 * GIB), Some("vllm serve llama-3-8b")),
                process(9, 1, None, None),
            ],
        };
        let mut second = first.clone();
        second.processes[0].used = Some(Bytes(45 * GIB));
        Scripted::new(vec![first, second])
    }

    fn draw(app: &TopApp, width: u16, height: u16) -> Terminal<TestBackend> {
        let mut terminal = Terminal::new(TestBackend::new(width, height)).expect("terminal");
        terminal
            .draw(|f| app.render(f.area(), f.buffer_mut()))
            .expect("draws");
        terminal
    }

    #[test]
    fn top_with_the_scripted_sampler_and_a_fixed_clock() {
        let clock = FixedClock(NOW_MS);
        let mut app = TopApp::new(
            Box::new(script()),
            &clock,
            Duration::from_secs(1),
            Theme::colored(),
        );
        for (w, h) in [(80, 24), (200, 50)] {
            assert_snapshot!(format!("top_{w}x{h}"), draw(&app, w, h).backend());
        }
        app.on_key(Key::Down);
        app.on_tick();
        let t = draw(&app, 80, 24);
        let screen = t.backend().to_string();
        assert!(screen.contains("10:20:00 UTC"), "{screen}");
        let trainer = screen.find("python train.py").expect("trainer row");
        let server = screen.find("vllm serve").expect("server row");
        assert!(trainer < server, "resorted by memory:\n{screen}");
        assert_snapshot!("top_after_second_sample", t.backend());
        app.on_key(Key::Char('?'));
        assert_snapshot!("top_help", draw(&app, 80, 24).backend());
        for (w, h) in [(1, 1), (20, 4)] {
            draw(&app, w, h);
        }
    }
}

mod attach {
    use insta::assert_snapshot;
    use memprof::model::Bytes;
    use memprof::source::gpu::{Clock, FixedClock, ProcessSample, Sample, Scripted};
    use memprof::source::live::LiveEvent;
    use memprof::source::live_feed::LiveFeed;
    use memprof::tui::attach::{AttachApp, Feed};
    use memprof::tui::keys::Key;
    use memprof::tui::theme::Theme;
    use memprof::tui::top::TopApp;
    use memprof::tui::{Dashboard, Flow};
    use memprof_wire::{Kind, Record, CUDA_ERROR_OUT_OF_MEMORY, FLAG_SNAPSHOT};
    use ratatui::backend::TestBackend;
    use ratatui::Terminal;
    use std::cell::Cell;
    use std::sync::mpsc::Sender;
    use std::time::Duration;

    const MIB: u64 = 1 << 20;
    /// 2026-11-30 10:20:00 UTC.
    const NOW_MS: u64 = 1_796_034_000_000;

    fn draw(app: &dyn Dashboard, width: u16, height: u16) -> String {
        let mut terminal = Terminal::new(TestBackend::new(width, height)).expect("terminal");
        terminal
            .draw(|f| app.render(f.area(), f.buffer_mut()))
            .expect("draws");
        terminal.backend().to_string()
    }

    fn record(kind: Kind, ptr: u64, size: u64, device: i32) -> LiveEvent {
        LiveEvent::Record(Record {
            ptr,
            size,
            device,
            ..Record::new(kind)
        })
    }

    fn send(to: &Sender<Result<LiveEvent, String>>, events: &[LiveEvent]) {
        for e in events {
            to.send(Ok(e.clone())).expect("the view listens");
        }
    }

    /// A clock that moves on by one second at every reading.
    struct Ticking(Cell<u64>);

    impl Clock for Ticking {
        fn now_ms(&self) -> u64 {
            self.0.replace(self.0.get() + 1000)
        }
    }

    #[test]
    fn attach_in_torch_mode_shows_pytorchs_figures_and_what_sits_outside() {
        use memprof::source::attach::figures::TorchDevice;
        use memprof::tui::attach::render;
        use memprof::tui::attach::state::{AttachState, Mode};
        let mut state = AttachState::new(
            77,
            Some("python train.py".into()),
            Mode::Torch {
                source: "PyTorch (memprof agent in the job) and NVML".into(),
            },
        );
        let device = |device: u32, nvml: Option<u64>| TorchDevice {
            device,
            allocated: Some(Bytes(3 * 1024 * MIB)),
            allocated_peak: Some(Bytes(5 * 1024 * MIB)),
            reserved: Some(Bytes(4 * 1024 * MIB)),
            reserved_peak: Some(Bytes(6 * 1024 * MIB)),
            active: Some(Bytes(3 * 1024 * MIB + 512 * MIB)),
            active_peak: None,
            inactive_split: Some(Bytes(200 * MIB)),
            num_alloc_retries: Some(2),
            num_ooms: Some(0),
            nvml_used: nvml.map(Bytes),
        };
        state.tick_torch(
            NOW_MS,
            vec![device(0, Some(4 * 1024 * MIB + 600 * MIB)), device(1, None)],
        );
        let mut terminal = Terminal::new(TestBackend::new(160, 30)).expect("terminal");
        terminal
            .draw(|f| render::render(&state, &Theme::plain(), f.area(), f.buffer_mut()))
            .expect("draws");
        let screen = terminal.backend().to_string();
        for want in [
            "PyTorch (memprof agent in the job) and NVML",
            "GPU 0  allocated 3.00 GiB (peak 5.00 GiB)  reserved 4.00 GiB (peak 6.00 GiB)  active 3.50 GiB",
            "inactive split 200.00 MiB  alloc retries 2  OOMs 0",
            "NVML 4.59 GiB: outside PyTorch 600.00 MiB (CUDA context, NCCL, cuBLAS)",
            "GPU 1  allocated 3.00 GiB",
            "NVML: not available",
        ] {
            assert!(screen.contains(want), "{want:?} in {screen}");
        }
    }

    #[test]
    fn attach_in_shim_mode_follows_the_stream_until_the_process_ends() {
        let clock = Ticking(Cell::new(NOW_MS));
        let (to, feed) = LiveFeed::manual();
        // What was alive at connection (flagged snapshot), then the stream.
        let mut alive = Record {
            ptr: 0x7f00_0000_0000,
            size: 512 * MIB,
            device: 0,
            ..Record::new(Kind::Alloc)
        };
        alive.flags = FLAG_SNAPSHOT;
        send(&to, &[LiveEvent::Record(alive)]);
        let mut app = AttachApp::new(
            4242,
            Some("python train.py --bs 32".into()),
            Feed::Shim(feed),
            &clock,
            Duration::from_secs(1),
            Theme::colored(),
            "",
        );
        // The libraries: NCCL's, and one whose file name would drive the terminal if shown raw.
        let mapping = |start: u64, path: &str| {
            LiveEvent::Mapping(memprof_wire::Mapping {
                start,
                len: 0x1000,
                file_offset: 0,
                path: path.as_bytes().to_vec(),
            })
        };
        let stack = |id: u32, frame: u64| LiveEvent::Stack {
            id,
            frames: vec![frame],
        };
        let with_stack = |event: LiveEvent, id: u32| match event {
            LiveEvent::Record(r) => LiveEvent::Record(Record { stack: id, ..r }),
            other => other,
        };
        send(
            &to,
            &[
                mapping(0x5000, "/opt/nccl/lib/libnccl.so.2"),
                mapping(0x9000, "/tmp/ext\x1b[31m.so"),
                stack(1, 0x5010),
                stack(2, 0x9010),
                with_stack(record(Kind::Alloc, 0x7f10_0000_0000, 2048 * MIB, 0), 1),
                with_stack(record(Kind::Alloc, 0x7f20_0000_0000, 256 * MIB, 1), 2),
                record(Kind::Alloc, 0x7f30_0000_0000, 64 * MIB, 0),
                record(Kind::Free, 0x7f30_0000_0000, 0, 0),
                with_stack(record(Kind::HostAlloc, 0x5555_0000, 3 * MIB, -1), 1),
            ],
        );
        let mut info = Record {
            size: 80 * 1024 * MIB,
            aux: 70 * 1024 * MIB,
            device: 0,
            ..Record::new(Kind::MemGetInfo)
        };
        app.on_tick();
        info.ts_ns = 1;
        let mut oom = Record {
            size: 16 * 1024 * MIB,
            device: 0,
            ..Record::new(Kind::Alloc)
        };
        oom.result = CUDA_ERROR_OUT_OF_MEMORY;
        send(&to, &[LiveEvent::Record(info), LiveEvent::Record(oom)]);
        app.on_tick();
        let screen = draw(&app, 100, 30);
        assert!(screen.contains("held 2.50 GiB  peak 2.56 GiB"), "{screen}");
        assert!(
            screen.contains("allocations 3  frees 1  alive 3  OOM 1"),
            "the snapshot is alive but not counted:\n{screen}"
        );
        assert!(screen.contains("events/s 2.0  records 8"), "{screen}");
        assert!(
            screen.contains("GPU 0       2.00 GiB     2.00 GiB  libnccl.so.2"),
            "{screen}"
        );
        assert!(screen.contains("pinned      3.00 MiB     3.00 MiB  libnccl.so.2"));
        assert!(screen.contains("ext\\x1b[31m.so"), "escaped:\n{screen}");
        assert_snapshot!("attach_shim_100x30", screen);
        send(&to, &[LiveEvent::End { dropped: 0 }]);
        drop(to);
        app.on_tick();
        let screen = draw(&app, 100, 30);
        assert!(
            screen.contains("process 4242 has ended; its last state stays on screen"),
            "{screen}"
        );
        assert!(screen.contains("dropped by the shim 0"), "{screen}");
        assert!(
            screen.contains("held 2.50 GiB"),
            "the last state stays:\n{screen}"
        );
        assert_snapshot!("attach_shim_ended", screen);
        for (w, h) in [(1, 1), (20, 4), (200, 60)] {
            draw(&app, w, h);
        }
        assert_eq!(app.on_key(Key::Char('?')), Flow::Continue);
        assert_eq!(
            app.on_key(Key::Char('x')),
            Flow::Continue,
            "closes the help"
        );
        assert_eq!(app.on_key(Key::Char('q')), Flow::Quit);
    }

    #[test]
    fn attach_with_eight_devices_keeps_every_device_and_the_counts_on_an_80x24_screen() {
        let clock = FixedClock(NOW_MS);
        let (to, feed) = LiveFeed::manual();
        for d in 0..8u64 {
            send(
                &to,
                &[record(
                    Kind::Alloc,
                    0x1000 * (d + 1),
                    (d + 1) * MIB,
                    d as i32,
                )],
            );
        }
        let app = AttachApp::new(
            1,
            None,
            Feed::Shim(feed),
            &clock,
            Duration::from_secs(1),
            Theme::plain(),
            "",
        );
        let screen = draw(&app, 80, 24);
        assert!(screen.contains("GPU 7  held 8.00 MiB"), "{screen}");
        assert!(screen.contains("allocations 8"), "{screen}");
    }

    fn ours(time_ms: u64, used: Option<u64>) -> Sample {
        Sample {
            time_ms,
            devices: Vec::new(),
            processes: vec![
                ProcessSample {
                    pid: 4242,
                    device: 0,
                    used: used.map(Bytes),
                    ..ProcessSample::default()
                },
                ProcessSample {
                    pid: 1,
                    device: 0,
                    used: Some(Bytes(999 * MIB)),
                    ..ProcessSample::default()
                },
            ],
        }
    }

    #[test]
    fn attach_in_nvml_mode_shows_the_pid_only_and_what_nvml_cannot_see() {
        let clock = FixedClock(NOW_MS);
        let alive = std::rc::Rc::new(Cell::new(true));
        let still = std::rc::Rc::clone(&alive);
        let sampler = Scripted::new(vec![
            ours(NOW_MS, Some(100 * MIB)),
            ours(NOW_MS + 1000, Some(300 * MIB)),
            ours(NOW_MS + 2000, Some(200 * MIB)),
        ]);
        let mut app = AttachApp::new(
            4242,
            None,
            Feed::Nvml {
                sampler: Box::new(sampler),
                alive: Box::new(move || still.get()),
            },
            &clock,
            Duration::from_secs(1),
            Theme::plain(),
            "no memprof shim in PID 4242",
        );
        app.on_tick();
        app.on_tick();
        let screen = draw(&app, 100, 24);
        assert!(
            screen.contains("GPU 0  now 200.00 MiB  peak 300.00 MiB"),
            "{screen}"
        );
        assert!(
            !screen.contains("999"),
            "another process's memory:\n{screen}"
        );
        assert!(screen.contains("What NVML cannot see"), "{screen}");
        assert_snapshot!("attach_nvml_100x24", screen);
        alive.set(false);
        app.on_tick();
        assert!(app.state.gone);
        assert_eq!(app.state.series.get(&0).map(Vec::len), Some(3));
    }

    #[test]
    fn top_marks_shim_processes_and_enter_opens_the_attach_view_or_menu() {
        use memprof::tui::top::menu::AttachChoice;
        let clock = FixedClock(NOW_MS);
        // PID 9 is another user's: whether it runs the shim is unknown.
        let mut sample = ours(NOW_MS, Some(100 * MIB));
        sample.processes.push(ProcessSample {
            pid: 9,
            device: 0,
            used: Some(Bytes(MIB)),
            ..ProcessSample::default()
        });
        let sampler = Scripted::new(vec![sample]);
        let senders = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
        let keep = std::rc::Rc::clone(&senders);
        let running = std::rc::Rc::new(Cell::new(true));
        let check = std::rc::Rc::clone(&running);
        let mut app = TopApp::new(
            Box::new(sampler),
            &clock,
            Duration::from_secs(1),
            Theme::plain(),
        )
        .with_liveness(std::rc::Rc::new(move |pid| pid != 1 || check.get()))
        .with_shims(
            Box::new(|pids: &[u32]| {
                pids.iter()
                    .filter(|&&p| p != 9)
                    .map(|&p| (p, p == 4242))
                    .collect()
            }),
            Box::new(move |pid| {
                assert_eq!(pid, 4242);
                let (to, feed) = LiveFeed::manual();
                send(&to, &[record(Kind::Alloc, 0x1000, 300 * MIB, 0)]);
                keep.borrow_mut().push(to);
                Ok(feed)
            }),
        );
        let screen = draw(&app, 80, 24);
        let row = |pid: &str| {
            screen
                .lines()
                .find(|l| l.trim_start_matches(['"', '│', ' ']).starts_with(pid))
                .map(|l| l.split_whitespace().nth(5).unwrap_or_default().to_owned())
        };
        assert_eq!(row("4242 ").as_deref(), Some("yes"), "{screen}");
        assert_eq!(row("1 ").as_deref(), Some("no"), "{screen}");
        assert_eq!(row("9 ").as_deref(), Some("?"), "{screen}");
        // The first row has no shim: Enter offers the attach modes; the first is top's own
        // samples, filtered to it.
        app.on_key(Key::Enter);
        let menu = draw(&app, 100, 30);
        for want in [
            "attach to PID 1",
            "PID 1 does not run the memprof shim",
            "1 watch its memory here",
            "2 snapshot PyTorch's allocator to a file",
            "memprof attach 1 --snapshot memprof-attach-1.pickle",
            "3 record a window of allocations with stacks",
            "memprof attach 1 --record 30 --snapshot memprof-record-1.pickle",
            "4 arm the OOM observer",
            "memprof attach 1 --on-oom memprof-oom-1.pickle",
        ] {
            assert!(menu.contains(want), "{want:?} in {menu}");
        }
        assert_eq!(app.on_key(Key::Esc), Flow::Continue);
        assert!(
            app.menu.is_none() && app.attached.is_none(),
            "Esc closes it"
        );
        app.on_key(Key::Enter);
        app.on_key(Key::Down);
        app.on_key(Key::Down);
        assert_eq!(
            app.on_key(Key::Enter),
            Flow::Quit,
            "a mode leaves top to run"
        );
        assert_eq!(
            app.chosen,
            Some((
                1,
                AttachChoice::Record {
                    seconds: 30,
                    file: "memprof-record-1.pickle".into()
                }
            ))
        );
        app.chosen = None;
        app.on_key(Key::Enter);
        assert_eq!(app.on_key(Key::Char('4')), Flow::Quit);
        assert_eq!(
            app.chosen.take(),
            Some((1, AttachChoice::OnOom("memprof-oom-1.pickle".into())))
        );
        app.on_key(Key::Enter);
        assert_eq!(app.on_key(Key::Enter), Flow::Continue, "watch stays in top");
        app.on_tick();
        let screen = draw(&app, 80, 24);
        assert!(screen.contains("memprof attach 1 "), "{screen}");
        assert!(
            screen.contains("PID 1 does not run the memprof shim"),
            "{screen}"
        );
        assert!(screen.contains("now 999.00 MiB"), "{screen}");
        assert!(!screen.contains("100.00 MiB"), "{screen}");
        running.set(false);
        app.on_tick();
        let screen = draw(&app, 80, 24);
        assert!(screen.contains("process 1 has ended"), "{screen}");
        assert_eq!(app.on_key(Key::Esc), Flow::Continue);
        assert!(draw(&app, 80, 24).contains("memprof top"));
        app.on_key(Key::Down);
        app.on_key(Key::Enter);
        let screen = draw(&app, 80, 24);
        assert!(screen.contains("memprof attach 4242"), "{screen}");
        assert!(screen.contains("held 300.00 MiB"), "{screen}");
        assert_eq!(
            app.on_key(Key::Char('q')),
            Flow::Continue,
            "q comes back too"
        );
        assert!(draw(&app, 80, 24).contains("memprof top"));
        assert_eq!(app.on_key(Key::Char('q')), Flow::Quit);
        assert_eq!(senders.borrow().len(), 1);
    }
}

/// demo_oom's OOM moved to device 1, with device 0 holding the same segments and no trace:
/// the layout of a multi-GPU file whose second GPU ran out of memory.
fn oom_on_device_one() -> Snapshot {
    let mut snap = load("demo_oom");
    let entries = snap.timeline.device(0).to_vec();
    let n = entries.len();
    let moved: Vec<_> = snap
        .segments
        .iter()
        .cloned()
        .map(|mut s| {
            s.device = 1;
            s
        })
        .collect();
    snap.segments.extend(moved);
    let streams: Vec<u64> = snap.timeline.streams().to_vec();
    snap.timeline = memprof::model::Timeline::new(entries, vec![0..0, 0..n]);
    snap.timeline.set_streams(streams);
    snap
}

#[test]
fn view_opens_on_the_device_that_ran_out_of_memory() {
    let snap = oom_on_device_one();
    let mut a = app("two_gpus", &snap, Theme::plain());
    assert_eq!(a.state.device, 1, "opens on the OOM's device");
    assert!(a.state.oom.is_some());
    // From device 0, `o` jumps to device 1's OOM.
    a.on_key(Key::Char('d'));
    assert_eq!(a.state.device, 0);
    a.on_key(Key::Char('o'));
    assert_eq!(a.state.device, 1);
    assert_eq!(a.state.cursor, a.state.oom.expect("an OOM"));
}
