//! Each NVRTC program is compiled at most once per process (about ten seconds per program on
//! the GPU box), and, where `KVBENCH_KERNEL_CACHE` names a folder, at most once across the
//! processes of one GPU check: the CUBIN and NVRTC's log are kept there, keyed by a hash of the
//! source, the options and NVRTC's version, so a changed kernel or library is never served a
//! stale binary. Only successes are kept; a failed compile is retried (and fails again).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use crate::nvrtc::{CompileError, Compiled};

/// Names the folder for compiled programs (the GPU check points it inside its output folder).
pub const CACHE_DIR_ENV: &str = "KVBENCH_KERNEL_CACHE";

type Slot = Arc<Mutex<Option<Compiled>>>;

/// Compiled programs by (program, arch, hash of source + options + NVRTC version).
#[derive(Default)]
pub struct ProgramCache {
    slots: Mutex<HashMap<(String, String, u64), Slot>>,
    compiles: AtomicUsize,
    disk_hits: AtomicUsize,
}

/// What identifies one compilation.
pub struct CacheKey<'a> {
    pub program: &'a str,
    pub arch: &'a str,
    pub source: &'a str,
    pub options: &'a [String],
    /// NVRTC's version as text ("13.0"); part of the hash.
    pub compiler: &'a str,
}

impl CacheKey<'_> {
    /// FNV-1a over every part, each followed by a separator byte.
    pub fn hash(&self) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut eat = |bytes: &[u8]| {
            for &b in bytes.iter().chain([0xffu8].iter()) {
                h ^= b as u64;
                h = h.wrapping_mul(0x0000_0100_0000_01b3);
            }
        };
        eat(self.program.as_bytes());
        eat(self.arch.as_bytes());
        eat(self.source.as_bytes());
        for o in self.options {
            eat(o.as_bytes());
        }
        eat(self.compiler.as_bytes());
        h
    }

    /// The CUBIN's file in `dir` (the log sits beside it with `.log`).
    pub fn file_in(&self, dir: &Path) -> PathBuf {
        let safe = |s: &str| -> String {
            s.chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '_' {
                        c
                    } else {
                        '-'
                    }
                })
                .collect()
        };
        dir.join(format!(
            "{}-{}-{:016x}.cubin",
            safe(self.program),
            safe(self.arch),
            self.hash()
        ))
    }
}

impl ProgramCache {
    /// The program compiled once: from memory, else from `dir`, else by `compile` (and then
    /// written to `dir`).
    pub fn get_or_compile(
        &self,
        key: &CacheKey<'_>,
        dir: Option<&Path>,
        compile: impl FnOnce() -> Result<Compiled, CompileError>,
    ) -> Result<Compiled, CompileError> {
        let slot: Slot = {
            let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
            slots
                .entry((key.program.to_string(), key.arch.to_string(), key.hash()))
                .or_default()
                .clone()
        };
        // Holding the slot while compiling: a second thread asking for the same program waits
        // for this compile instead of starting its own.
        let mut held = slot.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = held.as_ref() {
            return Ok(c.clone());
        }
        if let Some(c) = dir.and_then(|d| read(key, d)) {
            self.disk_hits.fetch_add(1, Ordering::Relaxed);
            *held = Some(c.clone());
            return Ok(c);
        }
        self.compiles.fetch_add(1, Ordering::Relaxed);
        let c = compile()?;
        if let Some(d) = dir {
            if let Err(e) = write(key, d, &c) {
                eprintln!(
                    "kernel cache: cannot write into {}: {e} (compiling again next time)",
                    d.display()
                );
            }
        }
        *held = Some(c.clone());
        Ok(c)
    }

    /// Compilations this cache started (memory and disk hits excluded).
    pub fn compiles(&self) -> usize {
        self.compiles.load(Ordering::Relaxed)
    }

    /// Programs read back from the folder.
    pub fn disk_hits(&self) -> usize {
        self.disk_hits.load(Ordering::Relaxed)
    }
}

/// The process-wide cache `nvrtc::compile` goes through.
pub fn global() -> &'static ProgramCache {
    static CACHE: OnceLock<ProgramCache> = OnceLock::new();
    CACHE.get_or_init(ProgramCache::default)
}

/// The folder named by `KVBENCH_KERNEL_CACHE`, if set and not empty.
pub fn dir_from_env() -> Option<PathBuf> {
    std::env::var_os(CACHE_DIR_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

fn read(key: &CacheKey<'_>, dir: &Path) -> Option<Compiled> {
    let t = Instant::now();
    let path = key.file_in(dir);
    let cubin = std::fs::read(&path).ok().filter(|c| !c.is_empty())?;
    let log = std::fs::read_to_string(path.with_extension("log")).ok()?;
    let warnings = crate::nvrtc::warning_lines(&log);
    Some(Compiled {
        program: key.program.to_string(),
        arch: key.arch.to_string(),
        cubin,
        log,
        warnings,
        seconds: t.elapsed().as_secs_f64(),
    })
}

/// Writes the log first and the CUBIN last, each through a temporary name and a rename, so a
/// reader sees a complete pair or no CUBIN at all.
fn write(key: &CacheKey<'_>, dir: &Path, c: &Compiled) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let path = key.file_in(dir);
    let tmp = |p: &Path| p.with_extension(format!("tmp{}", std::process::id()));
    let log = path.with_extension("log");
    std::fs::write(tmp(&log), &c.log)?;
    std::fs::rename(tmp(&log), &log)?;
    std::fs::write(tmp(&path), &c.cubin)?;
    std::fs::rename(tmp(&path), &path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake(program: &str, arch: &str, bytes: u8) -> Compiled {
        Compiled {
            program: program.into(),
            arch: arch.into(),
            cubin: vec![bytes; 64],
            log: "ptxas info: ok\nwarning: a spill".into(),
            warnings: vec!["warning: a spill".into()],
            seconds: 1.0,
        }
    }

    fn key<'a>(
        program: &'a str,
        arch: &'a str,
        source: &'a str,
        opts: &'a [String],
    ) -> CacheKey<'a> {
        CacheKey {
            program,
            arch,
            source,
            options: opts,
            compiler: "13.0",
        }
    }

    fn tmp_dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("kvbench-kcache-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn a_program_is_compiled_once_even_when_asked_for_by_many_threads() {
        let cache = ProgramCache::default();
        let opts = vec!["--std=c++17".to_string()];
        let calls = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    let c = cache
                        .get_or_compile(&key("kv_ops", "sm_90", "src", &opts), None, || {
                            calls.fetch_add(1, Ordering::SeqCst);
                            std::thread::sleep(std::time::Duration::from_millis(20));
                            Ok(fake("kv_ops", "sm_90", 7))
                        })
                        .expect("compiled");
                    assert_eq!(c.cubin, vec![7u8; 64]);
                });
            }
        });
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!(cache.compiles(), 1);
        // Another arch or another source is another compilation.
        for (arch, src) in [("sm_80", "src"), ("sm_90", "src2")] {
            cache
                .get_or_compile(&key("kv_ops", arch, src, &opts), None, || {
                    Ok(fake("kv_ops", arch, 1))
                })
                .expect("compiled");
        }
        assert_eq!(cache.compiles(), 3);
    }

    #[test]
    fn failures_are_not_kept() {
        let cache = ProgramCache::default();
        let opts: Vec<String> = vec![];
        let k = key("broken", "sm_90", "x", &opts);
        let fail = || {
            Err(CompileError::Failed {
                program: "broken".into(),
                arch: "sm_90".into(),
                status: "bad".into(),
                log: String::new(),
            })
        };
        assert!(cache.get_or_compile(&k, None, fail).is_err());
        assert!(cache.get_or_compile(&k, None, fail).is_err());
        assert_eq!(cache.compiles(), 2);
    }

    #[test]
    fn the_folder_serves_a_later_process_and_only_for_the_same_compiler() {
        let dir = tmp_dir("disk");
        let opts = vec!["-lineinfo".to_string()];
        let first = ProgramCache::default();
        first
            .get_or_compile(
                &key("attention_f32", "sm_90", "s", &opts),
                Some(&dir),
                || Ok(fake("attention_f32", "sm_90", 9)),
            )
            .expect("compiled");
        // Everything it wrote is inside the folder: one CUBIN and its log, no temporaries.
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .expect("dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names.len(), 2, "{names:?}");
        assert!(
            names[0].ends_with(".cubin") && names[1].ends_with(".log"),
            "{names:?}"
        );

        // A new process (a new cache) reads it back without compiling, warnings included.
        let second = ProgramCache::default();
        let c = second
            .get_or_compile(
                &key("attention_f32", "sm_90", "s", &opts),
                Some(&dir),
                || panic!("must come from the folder"),
            )
            .expect("read");
        assert_eq!((c.cubin, c.warnings.len()), (vec![9u8; 64], 1));
        assert_eq!((second.compiles(), second.disk_hits()), (0, 1));

        // Another NVRTC version misses.
        let mut k = key("attention_f32", "sm_90", "s", &opts);
        k.compiler = "12.8";
        let c = second
            .get_or_compile(&k, Some(&dir), || Ok(fake("attention_f32", "sm_90", 3)))
            .expect("compiled");
        assert_eq!(c.cubin, vec![3u8; 64]);
        assert_eq!(second.compiles(), 1);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
