//! Where a run's files go before they are complete, and what may be replaced.
//!
//! A results folder is built in a temporary folder beside its target (`.NAME.tmp-PID-N`) and
//! renamed into place only when every file is written, so a reader never sees half a result. The
//! temporary folder is created before the run starts: a target that cannot be written (a regular
//! file, a folder that is not a results folder, an unwritable parent) is refused before any work.
//!
//! Every temporary folder alive is listed in one process-wide registry. An interrupt (SIGINT,
//! SIGTERM, SIGHUP) removes them all and exits with 128 + the signal number, as a shell reports a
//! killed process; the final renames take the registry's lock, so an interrupt either finds the
//! temporary folder (and removes it) or finds the result already in place — never half of a swap.
//!
//! The three signals are blocked in every thread and taken by one thread with `sigwait`, never
//! by a signal handler: NVRTC installs its own SIGINT and SIGTERM handlers (with `signal`, from
//! the first compiling thread) over the process's, and that handler ends the process with status
//! 4 through `exit` while other threads still compile — or crashes (SIGSEGV) or hangs in the
//! destructors `exit` runs. A blocked signal never reaches any handler, whoever installed it.
//! What blocking cannot keep: NVRTC also sets SIGINT to SIG_IGN for a moment as each compile
//! starts (and, when compiles overlap, can leave it there), and setting SIG_IGN discards a
//! pending SIGINT, blocked or not — a SIGINT that lands in that moment is lost and the run goes
//! on (a second one ends it). SIGTERM and SIGHUP are never set to SIG_IGN by NVRTC.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, Once};

#[cfg(test)]
use super::marker::MARKER;
use super::marker::{mark, not_replaceable, Kind};
use super::{io, ResultsError};

/// Temporary folders to remove if the process is interrupted.
static LIVE: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
static INTERRUPTED: AtomicBool = AtomicBool::new(false);
static INSTALLED: AtomicBool = AtomicBool::new(false);
static NEXT: AtomicU64 = AtomicU64::new(0);
static INSTALL: Once = Once::new();

fn live() -> MutexGuard<'static, Vec<PathBuf>> {
    // A panic while holding the lock leaves a usable list (pushes and removals are atomic).
    LIVE.lock().unwrap_or_else(|e| e.into_inner())
}

/// The signals that interrupt a run (and stop `kvbench serve`: `serve/signals.rs`).
pub(crate) fn interrupt_signals() -> libc::sigset_t {
    // SAFETY: sigemptyset initialises the set; sigaddset only adds valid signal numbers to it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, sig);
        }
        set
    }
}

/// Never runs while the signals are blocked; installed so that an inherited SIG_IGN (a shell's
/// background job ignores SIGINT) does not discard them before `sigwait` takes them.
extern "C" fn caught(_sig: libc::c_int) {}

/// Install the interrupt handling (once per process; later calls do nothing). Call it before
/// any other thread starts: threads inherit the blocked signals from the one that spawns them,
/// and a thread started earlier could still run a handler NVRTC installs.
pub fn install_interrupt_cleanup() -> std::io::Result<()> {
    let mut result = Ok(());
    INSTALL.call_once(|| result = install());
    result
}

fn install() -> std::io::Result<()> {
    let set = interrupt_signals();
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: a zeroed sigaction with a valid handler and an empty mask; the old one is not
        // wanted.
        let rc = unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = caught as extern "C" fn(libc::c_int) as libc::sighandler_t;
            libc::sigemptyset(&mut action.sa_mask);
            action.sa_flags = libc::SA_RESTART;
            libc::sigaction(sig, &action, std::ptr::null_mut())
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    // SAFETY: `set` is initialised; the old mask is not wanted.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(std::io::Error::from_raw_os_error(rc));
    }
    std::thread::Builder::new()
        .name("interrupt".into())
        .spawn(move || loop {
            let mut sig: libc::c_int = 0;
            // SAFETY: `set` is initialised and blocked in this thread (inherited); `sig` is a
            // valid out-pointer.
            if unsafe { libc::sigwait(&set, &mut sig) } == 0 {
                interrupted(sig);
            }
        })?;
    INSTALLED.store(true, Ordering::SeqCst);
    Ok(())
}

/// Remove every live temporary and exit with 128 + `sig`; never returns.
fn interrupted(sig: libc::c_int) -> ! {
    INTERRUPTED.store(true, Ordering::SeqCst);
    // Held until exit: no rename can start after this point.
    let dirs = live();
    for d in dirs.iter() {
        if remove(d).is_ok() {
            eprintln!("interrupted: removed {}", d.display());
        }
    }
    // `_exit`, not `std::process::exit`: `exit` runs the C++ static destructors of loaded
    // libraries (NVRTC's) while other threads may still be compiling inside them, which crashed
    // an interrupted `doctor` or `kernel-bench` (SIGSEGV or `free(): invalid pointer`). Nothing
    // is left to flush: stderr is unbuffered and results are written by renames.
    // SAFETY: `_exit` has no preconditions.
    unsafe { libc::_exit(128 + sig) }
}

/// Remove a temporary folder or file.
fn remove(path: &Path) -> std::io::Result<()> {
    if path.is_dir() {
        std::fs::remove_dir_all(path)
    } else {
        std::fs::remove_file(path)
    }
}

/// Called by `main` before it returns, with or without an error. An interrupt that arrived
/// while the process was finishing is handled here rather than lost: one still pending is taken
/// and handled on this thread; one the interrupt thread has taken is waited for (its exit
/// status, not this one, is the process's). Without this a SIGTERM during the last
/// milliseconds of a run could end in status 0, and an I/O error caused by the handler removing
/// a folder could race it to an exit code of its own.
pub fn wait_if_interrupted() {
    if !INSTALLED.load(Ordering::SeqCst) {
        return;
    }
    let set = interrupt_signals();
    let now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `set` is initialised and blocked in this thread; a null info pointer is allowed.
    let sig = unsafe { libc::sigtimedwait(&set, std::ptr::null_mut(), &now) };
    if sig > 0 {
        interrupted(sig);
    }
    if INTERRUPTED.load(Ordering::SeqCst) {
        // The interrupt thread exits the process. Not its lock: taken here first, it would
        // keep that thread from ever reaching its exit.
        loop {
            std::thread::park();
        }
    }
}

/// May a results folder of `kind` be written at `out`? `replace`: an existing results folder of
/// that kind may be replaced. Never replaced, whatever `replace` says: a regular file or link, a
/// folder that is neither empty nor marked by kvbench as `kind`, or one holding a file kvbench
/// did not write.
pub fn check_target(out: &Path, kind: Kind, replace: bool) -> Result<(), ResultsError> {
    let meta = match std::fs::symlink_metadata(out) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io(out)(e)),
    };
    if !meta.is_dir() {
        return Err(ResultsError::NotAFolder(out.to_path_buf()));
    }
    if !replace {
        return Err(ResultsError::Exists(out.to_path_buf()));
    }
    if let Some(why) = not_replaceable(out, kind)? {
        return Err(ResultsError::NotResults {
            path: out.to_path_buf(),
            why,
        });
    }
    Ok(())
}

/// Remove `.NAME.tmp-PID-N` folders beside `out` left by a kvbench process that no longer exists
/// (SIGKILL, power loss: nothing ran its cleanup). Only this exact name pattern, only folders, and
/// only where `/proc` says the PID is gone — a live PID (even a reused one) keeps its folder.
/// Best effort: a folder that cannot be removed stays, as it would have anyway.
fn remove_stale(parent: &Path, name: &str) {
    if !Path::new("/proc/self").is_dir() {
        return; // no way to tell a dead PID from a live one here
    }
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    let prefix = format!(".{name}.tmp-");
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let Some(rest) = file_name.to_str().and_then(|f| f.strip_prefix(&prefix)) else {
            continue;
        };
        let Some((pid, n)) = rest.split_once('-') else {
            continue;
        };
        let (Ok(pid), Ok(_)) = (pid.parse::<u32>(), n.parse::<u64>()) else {
            continue;
        };
        let path = entry.path();
        let is_dir = std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir());
        if is_dir && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}

/// A results folder being written: a temporary folder that becomes `out` on [`Staging::commit`]
/// and is removed if dropped uncommitted.
#[derive(Debug)]
pub struct Staging {
    out: PathBuf,
    tmp: PathBuf,
    /// `None` for a collecting folder ([`Staging::begin_into`]), whose entries are runs.
    kind: Option<Kind>,
    replace: bool,
    done: bool,
}

impl Staging {
    /// Check `out` ([`check_target`]) and create the temporary folder beside it.
    pub fn begin(out: &Path, kind: Kind, replace: bool) -> Result<Staging, ResultsError> {
        check_target(out, kind, replace)?;
        Self::create(out, Some(kind), replace)
    }

    /// A temporary folder whose entries [`Staging::commit_into`] moves into `out`, a folder that
    /// collects results (a suite's output, `results/latest`) and may hold other things: `out`
    /// must be absent or a folder (never a file or a link).
    pub fn begin_into(out: &Path) -> Result<Staging, ResultsError> {
        match std::fs::symlink_metadata(out) {
            Ok(m) if !m.is_dir() => return Err(ResultsError::NotAFolder(out.to_path_buf())),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(out)(e)),
        }
        Self::create(out, None, true)
    }

    fn create(out: &Path, kind: Option<Kind>, replace: bool) -> Result<Staging, ResultsError> {
        let name = out
            .file_name()
            .ok_or_else(|| ResultsError::NotAFolder(out.to_path_buf()))?
            .to_string_lossy()
            .to_string();
        let parent = match out.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        std::fs::create_dir_all(&parent).map_err(io(&parent))?;
        remove_stale(&parent, &name);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let tmp = parent.join(format!(".{name}.tmp-{}-{n}", std::process::id()));
        let mut dirs = live();
        std::fs::create_dir(&tmp).map_err(io(&tmp))?;
        dirs.push(tmp.clone());
        Ok(Staging {
            out: out.to_path_buf(),
            tmp,
            kind,
            replace,
            done: false,
        })
    }

    /// The temporary folder to write into.
    pub fn dir(&self) -> &Path {
        &self.tmp
    }

    /// Put the finished folder in place (replacing a results folder there when allowed),
    /// marked with what it holds.
    pub fn commit(mut self) -> Result<(), ResultsError> {
        match self.kind {
            Some(kind) => {
                mark(&self.tmp, kind)?;
                // Something may have appeared at `out` while the run went on.
                check_target(&self.out, kind, self.replace)?;
            }
            // A collecting folder moves whole only where nothing is yet (`commit_into`).
            None if self.out.exists() => {
                return Err(ResultsError::Exists(self.out.clone()));
            }
            None => {}
        }
        let mut dirs = live();
        let result = if self.out.exists() {
            let mut old = self.tmp.clone().into_os_string();
            old.push(".old");
            let old = PathBuf::from(old);
            std::fs::rename(&self.out, &old)
                .map_err(io(&self.out))
                .and_then(|_| match std::fs::rename(&self.tmp, &self.out) {
                    Ok(()) => std::fs::remove_dir_all(&old).map_err(io(&old)),
                    Err(e) => {
                        // Put the previous results back rather than leave nothing.
                        let _ = std::fs::rename(&old, &self.out);
                        Err(io(&self.out)(e))
                    }
                })
        } else {
            std::fs::rename(&self.tmp, &self.out).map_err(io(&self.out))
        };
        if result.is_ok() {
            dirs.retain(|d| d != &self.tmp);
            self.done = true;
        }
        drop(dirs);
        result
    }
}

impl Staging {
    /// Move every entry of the finished temporary folder into `out` ([`Staging::begin_into`]):
    /// a folder replaces only a results folder ([`check_target`]), a file only a regular file.
    /// Everything is checked before the first move, and the moves run under the interrupt
    /// registry's lock, so an interrupt finds either nothing moved or everything; a suite never
    /// shows cells without its table.
    pub fn commit_into(mut self) -> Result<(), ResultsError> {
        for e in std::fs::read_dir(&self.tmp).map_err(io(&self.tmp))? {
            let e = e.map_err(io(&self.tmp))?;
            if e.file_type().map_err(io(&e.path()))?.is_dir() {
                mark(&e.path(), Kind::Run)?;
            }
        }
        if std::fs::symlink_metadata(&self.out).is_err() {
            // Nothing there yet: the whole folder moves at once.
            return self.commit();
        }
        if !std::fs::symlink_metadata(&self.out).is_ok_and(|m| m.is_dir()) {
            return Err(ResultsError::NotAFolder(self.out.clone()));
        }
        let mut entries: Vec<(std::ffi::OsString, bool)> = Vec::new();
        for e in std::fs::read_dir(&self.tmp).map_err(io(&self.tmp))? {
            let e = e.map_err(io(&self.tmp))?;
            let is_dir = e.file_type().map_err(io(&e.path()))?.is_dir();
            entries.push((e.file_name(), is_dir));
        }
        entries.sort();
        for (name, is_dir) in &entries {
            let target = self.out.join(name);
            if *is_dir {
                check_target(&target, Kind::Run, true)?;
            } else if std::fs::symlink_metadata(&target).is_ok_and(|m| !m.is_file()) {
                return Err(ResultsError::NotAFolder(target));
            }
        }
        let mut old = self.tmp.clone().into_os_string();
        old.push(".old");
        let old = PathBuf::from(old);
        let mut dirs = live();
        let result = (|| -> Result<(), ResultsError> {
            for (name, is_dir) in &entries {
                let (from, to) = (self.tmp.join(name), self.out.join(name));
                if *is_dir && to.exists() {
                    if !old.exists() {
                        std::fs::create_dir(&old).map_err(io(&old))?;
                    }
                    std::fs::rename(&to, old.join(name)).map_err(io(&to))?;
                }
                std::fs::rename(&from, &to).map_err(io(&to))?;
            }
            Ok(())
        })();
        if old.exists() {
            let _ = std::fs::remove_dir_all(&old);
        }
        if result.is_ok() {
            let _ = std::fs::remove_dir_all(&self.tmp);
            dirs.retain(|d| d != &self.tmp);
            self.done = true;
        }
        drop(dirs);
        result
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.done {
            let mut dirs = live();
            let _ = std::fs::remove_dir_all(&self.tmp);
            dirs.retain(|d| d != &self.tmp);
        }
    }
}

/// Write one file through a registered temporary file beside it (creating its folder), so an
/// interrupt leaves either the old file or the new one.
pub fn write_file_atomic(path: &Path, text: &str) -> Result<(), ResultsError> {
    if let Some(dir) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
    }
    let mut tmp = path.as_os_str().to_os_string();
    tmp.push(format!(".tmp-{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    live().push(tmp.clone());
    let result = std::fs::write(&tmp, text).map_err(io(&tmp)).and_then(|_| {
        let mut dirs = live();
        let r = std::fs::rename(&tmp, path).map_err(io(path));
        dirs.retain(|d| d != &tmp);
        r
    });
    if result.is_err() {
        let mut dirs = live();
        let _ = std::fs::remove_file(&tmp);
        dirs.retain(|d| d != &tmp);
    }
    result
}

/// A scenario's folder under `root`. The name comes from a scenario file, so it is checked here
/// as well as at load time: a slug of letters, digits, `-`, `_` and `.`, not `.` or `..` — never
/// an absolute path, a separator or a traversal.
pub fn scenario_folder(root: &Path, name: &str) -> Result<PathBuf, ResultsError> {
    let slug = !name.is_empty()
        && name.len() <= 255
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if slug {
        Ok(root.join(name))
    } else {
        Err(ResultsError::BadName(name.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_slugs_name_folders() {
        let root = Path::new("results/latest");
        for ok in ["quick-basic", "a.b_c-1", ".hidden", "..x"] {
            assert_eq!(scenario_folder(root, ok).expect(ok), root.join(ok));
        }
        let long = "a".repeat(256);
        for bad in [
            "",
            ".",
            "..",
            "../../x",
            "/etc",
            "a/b",
            "a\\b",
            "x\0",
            "caf\u{e9}",
            &long,
        ] {
            assert!(
                matches!(scenario_folder(root, bad), Err(ResultsError::BadName(_))),
                "{bad:?} accepted"
            );
        }
    }

    #[test]
    fn targets_that_are_not_results_folders_are_never_replaceable() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let p = tmp.path();
        assert!(check_target(&p.join("new"), Kind::Run, false).is_ok());
        std::fs::write(p.join("file"), "x").expect("write");
        for replace in [false, true] {
            assert!(matches!(
                check_target(&p.join("file"), Kind::Run, replace),
                Err(ResultsError::NotAFolder(_))
            ));
        }
        std::fs::create_dir(p.join("data")).expect("mkdir");
        std::fs::write(p.join("data/notes"), "x").expect("write");
        assert!(matches!(
            check_target(&p.join("data"), Kind::Run, true),
            Err(ResultsError::NotResults { .. })
        ));
        // A familiar file name is not a marker: this could be anyone's project folder.
        std::fs::create_dir(p.join("res")).expect("mkdir");
        std::fs::write(p.join("res/summary.json"), "{}").expect("write");
        assert!(matches!(
            check_target(&p.join("res"), Kind::Run, true),
            Err(ResultsError::NotResults { .. })
        ));
        mark(&p.join("res"), Kind::Run).expect("mark");
        assert!(matches!(
            check_target(&p.join("res"), Kind::Run, false),
            Err(ResultsError::Exists(_))
        ));
        assert!(check_target(&p.join("res"), Kind::Run, true).is_ok());
        // Another kind's folder is not replaced by this kind.
        let e = check_target(&p.join("res"), Kind::Tune, true).unwrap_err();
        assert!(
            e.to_string()
                .contains("a kvbench run folder, not a tune folder"),
            "{e}"
        );
        // A file kvbench did not write, anywhere in the folder, keeps it.
        std::fs::create_dir(p.join("res/plots")).expect("mkdir");
        std::fs::write(p.join("res/plots/mine.svg"), "x").expect("write");
        let e = check_target(&p.join("res"), Kind::Run, true).unwrap_err();
        assert!(e.to_string().contains("holds plots/mine.svg"), "{e}");
        assert!(matches!(
            check_target(&p.join("file/sub"), Kind::Run, true),
            Err(ResultsError::Io { .. })
        ));
    }

    #[test]
    fn a_dropped_staging_leaves_nothing_and_a_commit_replaces_a_results_folder() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let out = tmp.path().join("r");
        let s = Staging::begin(&out, Kind::Run, false).expect("begin");
        assert!(s.dir().is_dir());
        drop(s);
        assert_eq!(std::fs::read_dir(tmp.path()).expect("ls").count(), 0);

        let s = Staging::begin(&out, Kind::Run, false).expect("begin");
        std::fs::write(s.dir().join("summary.json"), "old").expect("write");
        s.commit().expect("commit");
        let marker = std::fs::read_to_string(out.join(MARKER)).expect("marker");
        assert!(marker.contains("\"summary.json\""), "{marker}");
        let s = Staging::begin(&out, Kind::Run, true).expect("begin");
        std::fs::write(s.dir().join("summary.json"), "new").expect("write");
        s.commit().expect("commit");
        assert_eq!(
            std::fs::read_to_string(out.join("summary.json")).expect("read"),
            "new"
        );
        let names: Vec<_> = std::fs::read_dir(tmp.path())
            .expect("ls")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, ["r"]);
    }

    /// A suite's folder collects other results: committing into it replaces its own entries
    /// (a results folder, a file) and leaves the rest; a folder that is not results refuses the
    /// commit before anything moves.
    #[test]
    fn commit_into_replaces_only_its_own_entries() {
        let root = tempfile::tempdir().expect("tempdir");
        let out = root.path().join("latest");
        std::fs::create_dir_all(out.join("cell")).expect("mkdir");
        std::fs::write(out.join("cell/summary.json"), "old").expect("write");
        mark(&out.join("cell"), Kind::Run).expect("mark");
        std::fs::write(out.join("notes.txt"), "mine").expect("write");
        let s = Staging::begin_into(&out).expect("begin");
        std::fs::create_dir(s.dir().join("cell")).expect("mkdir");
        std::fs::write(s.dir().join("cell/summary.json"), "new").expect("write");
        std::fs::write(s.dir().join("suite.csv"), "table").expect("write");
        s.commit_into().expect("commit");
        let read = |p: &str| std::fs::read_to_string(out.join(p)).expect(p);
        assert_eq!(read("cell/summary.json"), "new");
        assert_eq!(read("notes.txt"), "mine");
        assert_eq!(read("suite.csv"), "table");
        assert_eq!(std::fs::read_dir(root.path()).expect("ls").count(), 1);

        std::fs::create_dir(out.join("data")).expect("mkdir");
        std::fs::write(out.join("data/x"), "mine").expect("write");
        let s = Staging::begin_into(&out).expect("begin");
        std::fs::create_dir(s.dir().join("data")).expect("mkdir");
        std::fs::create_dir(s.dir().join("cell")).expect("mkdir");
        assert!(matches!(
            s.commit_into(),
            Err(ResultsError::NotResults { .. })
        ));
        assert_eq!(read("data/x"), "mine");
        assert_eq!(read("cell/summary.json"), "new");
        // A file someone put into a cell kvbench wrote keeps the cell, --force or not.
        std::fs::write(out.join("cell/notes.md"), "mine").expect("write");
        let s = Staging::begin_into(&out).expect("begin");
        std::fs::create_dir(s.dir().join("cell")).expect("mkdir");
        assert!(matches!(
            s.commit_into(),
            Err(ResultsError::NotResults { .. })
        ));
        assert_eq!(read("cell/notes.md"), "mine");
        assert_eq!(read("cell/summary.json"), "new");
        assert_eq!(std::fs::read_dir(root.path()).expect("ls").count(), 1);
        std::fs::write(root.path().join("file"), "x").expect("write");
        assert!(matches!(
            Staging::begin_into(&root.path().join("file")),
            Err(ResultsError::NotAFolder(_))
        ));
    }

    /// A SIGKILLed run leaves its temporary folder; the next run beside it removes it when its
    /// PID is gone, and never touches a live process's folder or a look-alike name.
    #[test]
    fn a_dead_process_temporary_folder_is_removed_by_the_next_run() {
        let root = tempfile::tempdir().unwrap();
        let dead = root.path().join(".res.tmp-999999999-0"); // above any Linux pid_max
        let alive = root
            .path()
            .join(format!(".res.tmp-{}-77", std::process::id()));
        let other = root.path().join(".res.tmp-999999999-x");
        let other_name = root.path().join(".other.tmp-999999999-0");
        for d in [&dead, &alive, &other, &other_name] {
            std::fs::create_dir(d).unwrap();
            std::fs::write(d.join("requests.csv"), "partial").unwrap();
        }
        let staging = Staging::begin(&root.path().join("res"), Kind::Run, false).unwrap();
        drop(staging);
        assert!(!dead.exists(), "the dead process's folder stays");
        assert!(alive.exists(), "a live process's folder was removed");
        assert!(
            other.exists() && other_name.exists(),
            "a look-alike was removed"
        );
    }
}
