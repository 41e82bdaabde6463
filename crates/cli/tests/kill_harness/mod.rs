//! The kill harness of crash_safe.rs (issue 34): a writer killed with SIGKILL after a random
//! delay, over and over, and every final name checked after each kill. Shared by the
//! writers' tests so that each file stays readable.

use minfer_testkit::rng::Rng;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub fn minfer() -> Command {
    Command::new(env!("CARGO_BIN_EXE_minfer"))
}

pub fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("minfer-crash-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

pub fn runs() -> usize {
    std::env::var("MINFER_KILL_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100)
}

pub fn seed(name: &str) -> u64 {
    let s = std::env::var("MINFER_KILL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    eprintln!("{name}: MINFER_KILL_SEED={s}");
    s
}

pub fn run_ok(c: impl std::borrow::BorrowMut<Command>) {
    let mut c = c;
    let c = c.borrow_mut();
    let o = c.output().unwrap();
    assert!(o.status.success(), "{c:?}: {o:?}");
}

/// Files under `dir` (recursively) whose name ends with a temporary's suffix (the shared
/// writer's `.partial`; a download's `.part` and its `.part.json` record).
pub fn temporaries(dir: &Path) -> Vec<PathBuf> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            v.extend(temporaries(&p));
        } else if [".partial", ".part", ".part.json"]
            .iter()
            .any(|t| p.to_string_lossy().ends_with(t))
        {
            v.push(p);
        }
    }
    v
}

/// What one final name may hold after a kill.
pub struct Expect {
    pub path: PathBuf,
    /// The states allowed besides the new file: the old bytes, or None for "absent".
    pub old: Option<Vec<u8>>,
    pub new: Vec<u8>,
    /// More complete states (a chat saves after every turn: each turn's file is whole).
    pub also: Vec<Vec<u8>>,
}

/// How the kills landed, so a run can show they hit the write and not only start-up.
#[derive(Default, Debug)]
pub struct Tally {
    pub old: usize,
    pub new: usize,
    pub other_whole: usize,
    /// Kills that left a temporary: they landed while a file was being written.
    pub mid_write: usize,
}

/// Restores the old state, runs `cmd`, kills it after a random delay in [0, 1.2 × the
/// uninterrupted run's time], and checks every final name (temporaries are looked for in
/// `dir`, recursively).
pub fn kill_loop(
    name: &str,
    dir: &Path,
    expects: &[Expect],
    full: Duration,
    mut cmd: impl FnMut() -> Command,
) {
    let mut rng = Rng::splitmix64(seed(name));
    let mut tally = Tally::default();
    let max_us = (full.as_micros() as u64 * 6 / 5).max(1);
    let t0 = Instant::now();
    for run in 0..runs() {
        for e in expects {
            match &e.old {
                Some(b) => std::fs::write(&e.path, b).unwrap(),
                None => {
                    let _ = std::fs::remove_file(&e.path);
                }
            }
        }
        let delay = Duration::from_micros(rng.next_u64() % max_us);
        let mut child = cmd()
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(delay);
        // SIGKILL: no destructor, no signal handler runs in the writer.
        let _ = child.kill();
        child.wait().unwrap();
        if !temporaries(dir).is_empty() {
            tally.mid_write += 1;
        }
        for e in expects {
            let got = std::fs::read(&e.path).ok();
            if got.as_deref() == Some(&e.new[..]) {
                tally.new += 1;
            } else if got == e.old {
                tally.old += 1;
            } else if got.as_ref().is_some_and(|g| e.also.contains(g)) {
                tally.other_whole += 1;
            } else {
                let len = got.as_ref().map(|g| g.len());
                let prefix = got.as_ref().is_some_and(|g| e.new.starts_with(g));
                panic!(
                    "{name} run {run} (killed after {delay:?}): {} holds {len:?} bytes, neither \
                     the old file nor the complete new one ({} bytes){}",
                    e.path.display(),
                    e.new.len(),
                    if prefix {
                        ": a prefix of the new file"
                    } else {
                        ""
                    }
                );
            }
        }
    }
    eprintln!(
        "{name}: {} kills in {:.1} s (run {full:?} uninterrupted): {tally:?}",
        runs(),
        t0.elapsed().as_secs_f64()
    );
}

/// Runs `cmd` to completion: its time, and no temporary left in `dir`.
pub fn reference(dir: &Path, mut cmd: Command) -> Duration {
    let t = Instant::now();
    run_ok(cmd.stdin(Stdio::null()));
    let full = t.elapsed();
    assert_eq!(temporaries(dir), Vec::<PathBuf>::new(), "{cmd:?}");
    full
}
