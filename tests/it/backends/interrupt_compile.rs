//! A SIGTERM (or SIGHUP) while NVRTC compiles (`kvbench doctor` compiles every program on several threads)
//! ends in exactly 128 + the signal, every time: never NVRTC's status 4, never a crash (SIGSEGV,
//! `free(): invalid pointer`), never a hang, never a run that carries on to status 0.
//!
//! NVRTC installs its own SIGINT and SIGTERM handlers for the front-end part of each compile and
//! puts the previous ones back after (concurrent compiles can leave its handler in place for good);
//! that handler ends the process with status 4 through `exit`, whose destructors can crash under
//! the threads still compiling. kvbench blocks the signals in every thread and takes them with
//! `sigwait` (`results/staging.rs`), so no handler runs. The first second of a compile is where
//! NVRTC's handler is most often installed, hence the short delays.
//!
//! Needs NVRTC, not a GPU; where it is absent the test prints SKIP, unless
//! `KVBENCH_REQUIRE_NVRTC=1` makes absence a failure.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Longer than any interrupted doctor needs to exit; past it the run counts as hung.
const HANG_AFTER_S: u64 = 120;

fn nvrtc_or_skip() -> bool {
    kvbench_cuda::libs::nvrtc_or_skip()
        .unwrap_or_else(|e| panic!("KVBENCH_REQUIRE_NVRTC=1 but {e}"))
}

/// When the signal is sent.
#[derive(Debug, Clone, Copy)]
enum Moment {
    /// As soon as doctor prints its first line: libraries are being probed, nothing compiles.
    Probing,
    /// This long after doctor says it starts compiling.
    Compiling(Duration),
}

struct Outcome {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

/// Waits for `child` at most [`HANG_AFTER_S`]; a child still running then is killed (SIGKILL)
/// and the test fails, naming what it was interrupted with.
fn wait_or_fail(child: &mut Child, what: &str) -> ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(HANG_AFTER_S);
    loop {
        match child.try_wait().expect("try_wait on doctor") {
            Some(status) => return status,
            None if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{what}: doctor still running {HANG_AFTER_S} s after the signal (hung)");
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Starts `kvbench doctor` (no kernel cache, so every program really compiles), sends `signal`
/// at `moment` and returns how it ended.
fn interrupt_doctor(signal: libc::c_int, moment: Moment, what: &str) -> Outcome {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvbench"))
        .arg("doctor")
        .env_remove(kvbench_cuda::nvrtc_cache::CACHE_DIR_ENV)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn kvbench doctor");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let mut seen: Vec<String> = Vec::new();
    let marker = match moment {
        Moment::Probing => "cpu:",
        Moment::Compiling(_) => "kernels (NVRTC",
    };
    for line in lines.by_ref().map_while(Result::ok) {
        let found = line.contains(marker);
        seen.push(line);
        if found {
            break;
        }
    }
    assert!(
        seen.last().is_some_and(|l| l.contains(marker)),
        "{what}: doctor never printed {marker:?}; stdout:\n{}",
        seen.join("\n")
    );
    // Keep draining stdout so the child never blocks on a full pipe.
    let drain = std::thread::spawn(move || lines.map_while(Result::ok).collect::<Vec<_>>());
    if let Moment::Compiling(delay) = moment {
        std::thread::sleep(delay);
    }
    let pid = libc::pid_t::try_from(child.id()).expect("pid fits pid_t");
    // SAFETY: `pid` is our own child, not yet waited for, so it cannot have been reused.
    let sent = unsafe { libc::kill(pid, signal) };
    assert_eq!(sent, 0, "{what}: kill failed");
    let status = wait_or_fail(&mut child, what);
    seen.extend(drain.join().unwrap_or_default());
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut stderr);
    }
    Outcome {
        status,
        stdout: seen.join("\n"),
        stderr,
    }
}

fn check(signal: libc::c_int, name: &str, moment: Moment) {
    let what = format!("SIG{name} {moment:?}");
    let out = interrupt_doctor(signal, moment, &what);
    eprintln!(
        "{what}: exit {:?}, signal {:?}",
        out.status.code(),
        out.status.signal()
    );
    let context = format!("stdout:\n{}\nstderr:\n{}", out.stdout, out.stderr);
    assert_eq!(
        out.status.signal(),
        None,
        "{what}: kvbench was killed by a signal (a crash, or the signal's default action \
         because no one took it); {context}"
    );
    assert!(
        !out.stdout.contains("cuda backend:"),
        "{what}: doctor ran to its end instead of stopping at the signal (exit {:?}); {context}",
        out.status.code()
    );
    assert_eq!(
        out.status.code(),
        Some(128 + signal),
        "{what}: not 128 + the signal (4 is NVRTC's own handler's status); {context}"
    );
    for bad in ["invalid pointer", "panicked", "double free", "corrupted"] {
        assert!(!out.stderr.contains(bad), "{what}: {bad:?}; {context}");
    }
}

#[test]
fn a_sigterm_or_sighup_while_nvrtc_compiles_exits_128_plus_the_signal_every_time() {
    if !nvrtc_or_skip() {
        return;
    }
    check(libc::SIGTERM, "TERM", Moment::Probing);
    for ms in [0u64, 20, 50, 100, 250, 500, 1000, 2000] {
        check(
            libc::SIGTERM,
            "TERM",
            Moment::Compiling(Duration::from_millis(ms)),
        );
    }
    // SIGHUP, which NVRTC leaves alone, the same way. Not SIGINT: NVRTC sets SIGINT to SIG_IGN
    // for a moment at the start of each compile (and can leave it there when compiles overlap),
    // and setting SIG_IGN discards a pending SIGINT, blocked or not (POSIX) — one that arrives
    // then is lost before the interrupt thread takes it, and the run carries on.
    check(
        libc::SIGHUP,
        "HUP",
        Moment::Compiling(Duration::from_millis(250)),
    );
}
