//! Another local user against `memprof run` started as root: the test acts as that user
//! (`setpriv` to uid 65534, `nobody`) while the run waits, tries to swap the preloaded shim or
//! a folder on its path, and to append to the `--torch` start-up hook, then lets the job start
//! more programs; the attacker's code must never run. Skips (saying so) when this process is not
//! root or cannot switch user.

use crate::util::{have, skip, Scratch};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The unprivileged user the attacker runs as.
const NOBODY: u32 = 65534;

/// Whether the test can act as a second user; skips, saying why, when not.
fn second_user_possible() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        skip("needs root, to start memprof as root and act as a second user");
        return false;
    }
    let switched = Command::new("setpriv")
        .args(as_nobody_args())
        .args(["sh", "-c", "test \"$(id -u)\" = 65534"])
        .status()
        .is_ok_and(|s| s.success());
    if !switched {
        skip("cannot switch to uid 65534 with setpriv");
    }
    switched
}

fn as_nobody_args() -> [String; 3] {
    [
        format!("--reuid={NOBODY}"),
        format!("--regid={NOBODY}"),
        "--clear-groups".into(),
    ]
}

/// Runs the shell `script` as the second user, with `args` as `$1`...
fn as_nobody(script: &str, args: &[&Path]) -> Output {
    Command::new("setpriv")
        .args(as_nobody_args())
        .args(["sh", "-c", script, "attacker"])
        .args(args)
        .output()
        .expect("setpriv runs")
}

/// A scratch folder the second user may enter (the library and marker paths are in it).
fn open_scratch(name: &str) -> Scratch {
    let dir = Scratch::new(name);
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    dir
}

/// A library whose constructor creates `mark`: the attacker's code, seen to run when it exists.
fn evil_library(dir: &Path, mark: &Path) -> PathBuf {
    let src = dir.join("evil.c");
    std::fs::write(
        &src,
        format!(
            "#include <stdio.h>\n\
             static void __attribute__((constructor)) evil(void) {{\n\
             FILE *f = fopen(\"{}\", \"w\");\n\
             if (f) fclose(f);\n}}\n",
            mark.display()
        ),
    )
    .expect("write");
    let so = dir.join("evil.so");
    let built = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&so)
        .arg(&src)
        .output()
        .expect("cc runs");
    assert!(built.status.success(), "{built:?}");
    std::fs::set_permissions(&so, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    so
}

/// The attacker: puts its library at `$1` (the path in LD_PRELOAD) by replacing the file, or
/// else by moving aside the deepest folder on the way that it can, and making the path anew.
const SWAP: &str = r#"
t="$1"; evil="$2"
if rm -f "$t" 2>/dev/null && cp "$evil" "$t" 2>/dev/null; then echo "replaced $t"; exit 0; fi
d=$(dirname "$t")
while [ "$d" != / ]; do
  if mv "$d" "$d.gone" 2>/dev/null; then
    mkdir -p "$(dirname "$t")" && cp "$evil" "$t" && echo "swapped $d" && exit 0
  fi
  d=$(dirname "$d")
done
echo "no way in"; exit 1
"#;

/// Waits until `path` exists, failing when `child` ends first or after a minute.
fn wait_for(path: &Path, child: &mut Child) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !path.exists() {
        if let Some(status) = child.try_wait().expect("wait") {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut err);
            }
            panic!("memprof ended ({status}) before {}: {err}", path.display());
        }
        assert!(Instant::now() < deadline, "{} never came", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `memprof run` as root with HOME, XDG_CACHE_HOME and XDG_RUNTIME_DIR all in folders the
/// attacker may write (as under `sudo -E` from a careless account). The job writes its
/// LD_PRELOAD, waits while the attacker works, then starts a program (which loads LD_PRELOAD
/// anew) that lists its mappings: the shim must still be preloaded, from a path the attacker
/// could not change, and the attacker's library never loaded.
#[test]
fn another_user_cannot_swap_the_shim_that_root_preloads() {
    if !second_user_possible() || !have("cc") {
        return;
    }
    let dir = open_scratch("second-user-shim");
    let mark = dir.join("attacker-code-ran");
    let evil = evil_library(&dir, &mark);
    let theirs = dir.join("home");
    for sub in ["", "/.cache", "/run"] {
        let path = PathBuf::from(format!("{}{sub}", theirs.display()));
        std::fs::create_dir_all(&path).expect("mkdir");
        std::os::unix::fs::chown(&path, Some(NOBODY), Some(NOBODY)).expect("chown");
    }

    // The attack works where it can: a folder of root's in the attacker's .cache is swapped.
    let probe = theirs.join(".cache/probe/lib.so");
    std::fs::create_dir_all(probe.parent().expect("a folder")).expect("mkdir");
    std::fs::write(&probe, b"root's").expect("write");
    let tried = as_nobody(SWAP, &[&probe, &evil]);
    assert!(
        String::from_utf8_lossy(&tried.stdout).contains("swapped"),
        "{tried:?}"
    );
    assert_eq!(
        std::fs::read(&probe).expect("read"),
        std::fs::read(&evil).expect("read")
    );

    let preload = dir.join("preload");
    let go = dir.join("go");
    let loaded = dir.join("loaded");
    let job = format!(
        "printf %s \"$LD_PRELOAD\" > {}; while [ ! -e {} ]; do sleep 0.05; done; \
         cat /proc/self/maps > {}",
        preload.display(),
        go.display(),
        loaded.display()
    );
    let mut run = Command::new(env!("CARGO_BIN_EXE_memprof"))
        .args(["run", "-o"])
        .arg(dir.join("rec.memprof"))
        .args(["--", "sh", "-c", &job])
        .env("HOME", &theirs)
        .env("XDG_CACHE_HOME", theirs.join(".cache"))
        .env("XDG_RUNTIME_DIR", theirs.join("run"))
        .env_remove("MEMPROF_SHIM")
        .env_remove("LD_PRELOAD")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("memprof runs");
    wait_for(&preload, &mut run);
    let shim = PathBuf::from(std::fs::read_to_string(&preload).expect("read"));
    let tried = as_nobody(SWAP, &[&shim, &evil]);
    std::fs::write(&go, b"").expect("write");
    let out = run.wait_with_output().expect("memprof ends");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !mark.exists(),
        "the attacker's library ran as root: {tried:?}"
    );
    assert_eq!(
        String::from_utf8_lossy(&tried.stdout).trim(),
        "no way in",
        "{} could be changed by another user",
        shim.display()
    );
    assert!(!shim.starts_with(&theirs), "{}", shim.display());
    let maps = std::fs::read_to_string(&loaded).expect("the job's last program ran");
    assert!(
        maps.contains(&*shim.to_string_lossy()),
        "a later program of the job still preloads the shim from {}",
        shim.display()
    );
}

/// `memprof run --torch` as root at umask 000: the attacker tries to append to the start-up
/// hook, and to swap its folder, while the job waits; then the job starts Python, which must
/// run the hook as memprof wrote it.
#[test]
fn another_user_cannot_append_to_the_torch_hook() {
    if !second_user_possible() || !have("python3") {
        return;
    }
    let dir = open_scratch("second-user-torch");
    let mark = dir.join("attacker-code-ran");
    let tmp = dir.join("tmp");
    std::fs::create_dir(&tmp).expect("mkdir");
    // As /tmp is: anyone may make a folder there, no one may move another's.
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
    let hook_dir = dir.join("hook-dir");
    let go = dir.join("go");
    let job = format!(
        "printf %s \"${{PYTHONPATH%%:*}}\" > {}; while [ ! -e {} ]; do sleep 0.05; done; \
         exec python3 -c pass",
        hook_dir.display(),
        go.display()
    );
    let memprof = env!("CARGO_BIN_EXE_memprof");
    let mut run = Command::new("sh")
        .args([
            "-c",
            "umask 000; exec \"$@\"",
            "sh",
            memprof,
            "run",
            "--torch",
        ])
        .arg("-o")
        .arg(dir.join("rec.memprof"))
        .args(["--", "sh", "-c", &job])
        .env("TMPDIR", &tmp)
        .env_remove("MEMPROF_SHIM")
        .env_remove("LD_PRELOAD")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("memprof runs");
    wait_for(&hook_dir, &mut run);
    let hook = PathBuf::from(std::fs::read_to_string(&hook_dir).expect("read"));
    assert!(hook.starts_with(&tmp), "{}", hook.display());
    let payload = format!("open({:?}, 'w').close()\n", mark.display().to_string());
    let append = r#"
h="$1"; code="$2"
if printf '%s' "$code" >> "$h/sitecustomize.py" 2>/dev/null; then echo appended; exit 0; fi
if mv "$h" "$h.gone" 2>/dev/null && mkdir "$h" && printf '%s' "$code" > "$h/sitecustomize.py"
then echo swapped; exit 0; fi
echo "no way in"; exit 1
"#;
    let tried = Command::new("setpriv")
        .args(as_nobody_args())
        .args(["sh", "-c", append, "attacker"])
        .arg(&hook)
        .arg(&payload)
        .output()
        .expect("setpriv runs");
    let meta = std::fs::metadata(&hook).expect("the hook's folder");
    let file = std::fs::metadata(hook.join("sitecustomize.py")).expect("the hook");
    std::fs::write(&go, b"").expect("write");
    let out = run.wait_with_output().expect("memprof ends");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!mark.exists(), "the attacker's code ran as root: {tried:?}");
    assert_eq!(String::from_utf8_lossy(&tried.stdout).trim(), "no way in");
    assert_eq!(meta.permissions().mode() & 0o7777, 0o700);
    assert_eq!(file.permissions().mode() & 0o7777, 0o600);
    assert!(!hook.exists(), "the hook's folder is removed after the run");
}
