//! Suites: the cells `kvbench suite` runs — one per (scenario, block size, host-tier capacity,
//! seed) — their
//! deterministic split into shards, the combined table (`suite.csv`, `suite.md`), and
//! `suite.json`, the metadata that lets `kvbench merge` combine shard folders run on different
//! machines into the suite an unsharded run would have written.
//!
//! A shard `K/N` (0-based, so a Kubernetes completion index or a Slurm array index from 0 maps
//! straight onto it) runs the cells whose plan index is `K mod N`: round-robin over the plan, so
//! the seeds of one scenario spread across shards. `suite.json` records the whole plan, its hash
//! (scenarios after overrides, seeds, block sizes, run options, backend), the build's revision and
//! each cell's table rows; merging checks plan and revision agree, that no cell ran twice and none
//! is missing, and lays the rows out in plan order, so the merged table equals the unsharded one
//! byte for byte.

mod merge;

use std::io::Read;
use std::path::Path;

use serde::{Deserialize, Serialize};

pub use merge::{merge, MergeError};

use super::plot::data::{file_error, FileError};

pub const FORMAT: u32 = 1;

/// One unit of a suite: a scenario at one block size, one host-tier capacity and one seed,
/// written to `dir`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cell {
    pub index: usize,
    pub scenario: String,
    pub block_size: u32,
    /// The host tier's capacity as the scenario writes it (`"16 GiB"`); absent without a host
    /// tier (and in suite.json files written before capacities were cells).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_capacity: Option<String>,
    pub seed: u64,
    /// Its results folder, relative to the suite folder.
    pub dir: String,
}

/// What to run of one scenario: its name, block sizes, host-tier capacities (empty without a
/// host tier) and seeds.
#[derive(Debug, Clone)]
pub struct PlanItem {
    pub scenario: String,
    pub block_sizes: Vec<u32>,
    pub host_capacities: Vec<String>,
    pub seeds: Vec<u64>,
}

impl PlanItem {
    /// The capacities a cell may take: one `None` without a host tier.
    fn capacity_choices(&self) -> Vec<Option<String>> {
        if self.host_capacities.is_empty() {
            vec![None]
        } else {
            self.host_capacities.iter().cloned().map(Some).collect()
        }
    }
}

/// A capacity as a folder-name part: `"16 GiB"` → `16GiB` (ASCII letters, digits and `.` only).
pub fn capacity_tag(capacity: &str) -> String {
    capacity
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '.')
        .collect()
}

/// Shard `index` of `count` (0-based).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shard {
    pub index: u32,
    pub count: u32,
}

impl Shard {
    pub fn owns(&self, cell: &Cell) -> bool {
        cell.index % self.count as usize == self.index as usize
    }
}

impl std::fmt::Display for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

impl std::str::FromStr for Shard {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("{s:?}: expected K/N with 0 <= K < N (e.g. 0/4), K 0-based");
        let (k, n) = s.split_once('/').ok_or_else(bad)?;
        let (index, count): (u32, u32) = (
            k.trim().parse().map_err(|_| bad())?,
            n.trim().parse().map_err(|_| bad())?,
        );
        if count == 0 || index >= count {
            return Err(bad());
        }
        Ok(Shard { index, count })
    }
}

/// Every cell of the plan, in order: scenarios as given, then block sizes, then host-tier
/// capacities, then seeds. A folder name gains `-bs<B>` only when its scenario lists several
/// block sizes, `-host<CAP>` only when it lists several capacities and `-seed<S>` only with
/// several seeds, so a one-seed suite keeps its folders named after the scenarios.
pub fn plan(items: &[PlanItem]) -> Result<Vec<Cell>, String> {
    cell_count(items.iter().map(|it| {
        (
            it.block_sizes.len() as u64,
            it.host_capacities.len().max(1) as u64,
            it.seeds.len() as u64,
        )
    }))?;
    let mut cells: Vec<Cell> = Vec::new();
    let mut dirs: std::collections::BTreeMap<String, String> = std::collections::BTreeMap::new();
    for it in items {
        for &b in &it.block_sizes {
            for cap in it.capacity_choices() {
                for &seed in &it.seeds {
                    let mut dir = it.scenario.clone();
                    if it.block_sizes.len() > 1 {
                        dir.push_str(&format!("-bs{b}"));
                    }
                    if let (Some(c), true) = (&cap, it.host_capacities.len() > 1) {
                        dir.push_str(&format!("-host{}", capacity_tag(c)));
                    }
                    if it.seeds.len() > 1 {
                        dir.push_str(&format!("-seed{seed}"));
                    }
                    if let Some(c) = dirs.insert(dir.clone(), it.scenario.clone()) {
                        return Err(format!(
                            "two cells would write {dir:?} (scenario {c:?} appears twice, or two capacities name one size?)"
                        ));
                    }
                    cells.push(Cell {
                        index: cells.len(),
                        scenario: it.scenario.clone(),
                        block_size: b,
                        host_capacity: cap.clone(),
                        seed,
                        dir,
                    });
                }
            }
        }
    }
    Ok(cells)
}

/// The most cells one suite may plan. Each cell is a full run with its own folder; a plan past
/// this is a typo (`--seeds 1000000000`), refused before anything is allocated for it.
pub const MAX_CELLS: u64 = 100_000;

/// The number of cells of per-scenario (block sizes, host-tier capacities, seeds) counts, refused
/// past [`MAX_CELLS`] (checked arithmetic: a product of counts cannot wrap into a small number).
pub fn cell_count(per_scenario: impl IntoIterator<Item = (u64, u64, u64)>) -> Result<u64, String> {
    let mut total: u64 = 0;
    for (block_sizes, capacities, seeds) in per_scenario {
        total = block_sizes
            .checked_mul(capacities)
            .and_then(|n| n.checked_mul(seeds))
            .and_then(|n| total.checked_add(n))
            .filter(|&n| n <= MAX_CELLS)
            .ok_or_else(|| {
                format!(
                    "the suite would run more than {MAX_CELLS} cells (scenarios × block sizes × capacities × seeds); run fewer seeds, or split it into several suites"
                )
            })?;
    }
    Ok(total)
}

/// A hash of everything that decides a suite's results besides the code: the plan's cells,
/// each cell's scenario as loaded (overrides applied), the backend and the run options.
pub fn plan_hash(
    cells: &[Cell],
    scenarios_json: &[String],
    backend: &str,
    options: &str,
) -> String {
    let mut h = blake3::Hasher::new();
    let mut field = |s: &str| {
        h.update(&(s.len() as u64).to_le_bytes());
        h.update(s.as_bytes());
    };
    field(backend);
    field(options);
    for c in cells {
        // A cell without a host tier hashes as it did before capacities were cells.
        let cap = c
            .host_capacity
            .as_ref()
            .map_or(String::new(), |h| format!("|host={h}"));
        field(&format!(
            "{}|{}|{}|{}|{}{cap}",
            c.index, c.scenario, c.block_size, c.seed, c.dir
        ));
    }
    for s in scenarios_json {
        field(s);
    }
    h.finalize().to_hex().to_string()
}

/// The build that ran a suite: `KVBENCH_REVISION` when set (declare two builds of one commit
/// the same, e.g. to the git commit or a container image digest), else the package version and a
/// hash of the running executable — shards merge only when this agrees, so a shard run by other
/// code is refused rather than mixed in.
pub fn revision() -> String {
    if let Ok(r) = std::env::var("KVBENCH_REVISION") {
        if !r.trim().is_empty() {
            return r.trim().to_string();
        }
    }
    let exe_hash = std::env::current_exe()
        .and_then(std::fs::File::open)
        .and_then(|mut f| {
            let mut h = blake3::Hasher::new();
            let mut buf = vec![0u8; 1 << 20];
            loop {
                let n = f.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                h.update(&buf[..n]);
            }
            Ok(h.finalize().to_hex()[..16].to_string())
        })
        .unwrap_or_else(|_| "unknown-executable".into());
    format!("kvbench {} exe {exe_hash}", env!("CARGO_PKG_VERSION"))
}

/// The table rows and check failures of one cell that ran.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellResult {
    pub index: usize,
    pub rows: Vec<Vec<String>>,
    pub failures: Vec<String>,
}

/// `suite.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SuiteMeta {
    pub format: u32,
    pub revision: String,
    pub backend: String,
    pub plan_hash: String,
    /// The shard this folder holds; `null` for a whole (or merged) suite.
    pub shard: Option<Shard>,
    /// For a merged suite, the shards it was merged from.
    #[serde(default)]
    pub merged_from: Vec<Shard>,
    /// The header of `suite.csv`.
    pub header: Vec<String>,
    /// Every cell of the whole suite, whether or not this folder ran it.
    pub plan: Vec<Cell>,
    /// The cells this folder holds, in plan order.
    pub results: Vec<CellResult>,
}

impl SuiteMeta {
    /// The table rows in plan order.
    pub fn rows(&self) -> Vec<Vec<String>> {
        let mut r: Vec<&CellResult> = self.results.iter().collect();
        r.sort_by_key(|c| c.index);
        r.into_iter().flat_map(|c| c.rows.iter().cloned()).collect()
    }

    /// The cells of the plan this folder holds.
    pub fn ran(&self) -> Vec<&Cell> {
        self.plan
            .iter()
            .filter(|c| self.results.iter().any(|r| r.index == c.index))
            .collect()
    }

    pub fn failures(&self) -> Vec<String> {
        self.results
            .iter()
            .flat_map(|r| {
                let dir = self.plan.get(r.index).map_or("?", |c| c.dir.as_str());
                r.failures.iter().map(move |f| format!("{dir}: {f}"))
            })
            .collect()
    }
}

pub fn csv(header: &[String], rows: &[Vec<String>]) -> String {
    let mut s = format!("{}\n", header.join(","));
    for r in rows {
        s.push_str(&r.join(","));
        s.push('\n');
    }
    s
}

pub fn markdown(header: &[String], rows: &[Vec<String>]) -> String {
    let mut md = format!(
        "# kvbench suite\n\n| {} |\n|{}\n",
        header.join(" | "),
        " --- |".repeat(header.len())
    );
    for r in rows {
        md.push_str(&format!("| {} |\n", r.join(" | ")));
    }
    md
}

fn write_atomic(path: &Path, text: &str) -> Result<(), FileError> {
    let name = path
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().to_string());
    let tmp = path.with_file_name(format!(".{name}.tmp-{}", std::process::id()));
    std::fs::write(&tmp, text).map_err(|e| file_error(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        file_error(path, e)
    })
}

/// Write `suite.csv`, `suite.md` and `suite.json` into `dir`; returns the markdown.
pub fn write(dir: &Path, meta: &SuiteMeta) -> Result<String, FileError> {
    std::fs::create_dir_all(dir).map_err(|e| file_error(dir, e))?;
    let rows = meta.rows();
    let md = markdown(&meta.header, &rows);
    write_atomic(&dir.join("suite.csv"), &csv(&meta.header, &rows))?;
    write_atomic(&dir.join("suite.md"), &md)?;
    let json =
        serde_json::to_string_pretty(meta).map_err(|e| file_error(&dir.join("suite.json"), e))?;
    write_atomic(&dir.join("suite.json"), &format!("{json}\n"))?;
    Ok(md)
}

/// `dir/suite.json`, read as the input it is: size-capped, parsed strictly, and checked so that
/// nothing in it can point outside `dir` — every cell's `dir` is a slug (letters, digits, `-`,
/// `_`, `.`; never absolute, `..` or holding a separator), unique, and every index is its
/// position in the plan.
pub fn read(dir: &Path) -> Result<SuiteMeta, FileError> {
    let path = dir.join("suite.json");
    let text = super::plot::data::read_capped(&path, super::plot::data::MAX_READ_WHOLE_BYTES)?;
    let meta: SuiteMeta = serde_json::from_str(&text).map_err(|e| file_error(&path, e))?;
    if meta.format != FORMAT {
        return Err(file_error(
            &path,
            format!("format: {} is not the supported {FORMAT}", meta.format),
        ));
    }
    check(&meta).map_err(|m| file_error(&path, m))?;
    Ok(meta)
}

/// What [`read`] refuses in a `suite.json` (module doc of `read`).
fn check(meta: &SuiteMeta) -> Result<(), String> {
    let mut dirs = std::collections::BTreeSet::new();
    for (i, c) in meta.plan.iter().enumerate() {
        if c.index != i {
            return Err(format!(
                "plan[{i}].index: {} is not its position {i}",
                c.index
            ));
        }
        super::staging::scenario_folder(Path::new(""), &c.dir).map_err(|_| {
            format!(
                "plan[{i}].dir: {:?} is not a folder name (a slug of letters, digits, '-', '_' and '.'; never absolute, '..' or a path)",
                c.dir
            )
        })?;
        if !dirs.insert(c.dir.as_str()) {
            return Err(format!("plan[{i}].dir: {:?} appears twice", c.dir));
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    for (i, r) in meta.results.iter().enumerate() {
        if r.index >= meta.plan.len() {
            return Err(format!(
                "results[{i}].index: {} is not a cell of the {}-cell plan",
                r.index,
                meta.plan.len()
            ));
        }
        if !seen.insert(r.index) {
            return Err(format!(
                "results[{i}].index: cell {} appears twice",
                r.index
            ));
        }
    }
    if let Some(s) = meta.shard {
        if s.count == 0 || s.index >= s.count {
            return Err(format!("shard: {}/{} is not a shard", s.index, s.count));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn items() -> Vec<PlanItem> {
        vec![
            PlanItem {
                scenario: "a".into(),
                block_sizes: vec![16],
                host_capacities: Vec::new(),
                seeds: vec![1, 2, 3],
            },
            PlanItem {
                scenario: "b".into(),
                block_sizes: vec![8, 32],
                host_capacities: Vec::new(),
                seeds: vec![7],
            },
        ]
    }

    #[test]
    fn plan_names_folders_and_shards_partition_it() {
        let cells = plan(&items()).expect("plan");
        let dirs: Vec<&str> = cells.iter().map(|c| c.dir.as_str()).collect();
        assert_eq!(dirs, ["a-seed1", "a-seed2", "a-seed3", "b-bs8", "b-bs32"]);
        for n in 1..=6u32 {
            let mut owners = vec![0; cells.len()];
            for k in 0..n {
                let s = Shard { index: k, count: n };
                for c in cells.iter().filter(|c| s.owns(c)) {
                    owners[c.index] += 1;
                }
            }
            assert!(owners.iter().all(|&o| o == 1), "N={n}: {owners:?}");
        }
    }

    #[test]
    fn one_seed_one_block_size_keeps_the_scenario_name() {
        let cells = plan(&[PlanItem {
            scenario: "x".into(),
            block_sizes: vec![16],
            host_capacities: Vec::new(),
            seeds: vec![5],
        }])
        .expect("plan");
        assert_eq!(cells[0].dir, "x");
    }

    #[test]
    fn capacity_lists_make_cells_and_a_single_capacity_keeps_the_name() {
        let caps = |v: &[&str]| v.iter().map(|c| c.to_string()).collect::<Vec<_>>();
        let cells = plan(&[
            PlanItem {
                scenario: "t".into(),
                block_sizes: vec![8, 16],
                host_capacities: caps(&["4 GiB", "16 GiB"]),
                seeds: vec![1, 2],
            },
            PlanItem {
                scenario: "u".into(),
                block_sizes: vec![16],
                host_capacities: caps(&["1.5 GiB"]),
                seeds: vec![3],
            },
        ])
        .expect("plan");
        let dirs: Vec<&str> = cells.iter().map(|c| c.dir.as_str()).collect();
        assert_eq!(
            dirs,
            [
                "t-bs8-host4GiB-seed1",
                "t-bs8-host4GiB-seed2",
                "t-bs8-host16GiB-seed1",
                "t-bs8-host16GiB-seed2",
                "t-bs16-host4GiB-seed1",
                "t-bs16-host4GiB-seed2",
                "t-bs16-host16GiB-seed1",
                "t-bs16-host16GiB-seed2",
                "u",
            ]
        );
        assert_eq!(cells[2].host_capacity.as_deref(), Some("16 GiB"));
        assert_eq!(cells[8].host_capacity.as_deref(), Some("1.5 GiB"));
        // Two spellings of one folder name are refused, not overwritten.
        assert!(plan(&[PlanItem {
            scenario: "v".into(),
            block_sizes: vec![16],
            host_capacities: caps(&["4 GiB", "4GiB"]),
            seeds: vec![1],
        }])
        .is_err());
    }

    #[test]
    fn a_cell_without_capacity_reads_from_an_older_suite_json() {
        let c: Cell = serde_json::from_str(
            r#"{"index":0,"scenario":"a","block_size":16,"seed":1,"dir":"a"}"#,
        )
        .expect("old cell");
        assert_eq!(c.host_capacity, None);
        let back = serde_json::to_string(&c).expect("json");
        assert!(!back.contains("host_capacity"), "{back}");
    }

    #[test]
    fn a_scenario_twice_is_refused() {
        let it = PlanItem {
            scenario: "x".into(),
            block_sizes: vec![16],
            host_capacities: Vec::new(),
            seeds: vec![5],
        };
        assert!(plan(&[it.clone(), it]).is_err());
    }

    #[test]
    fn shard_parsing() {
        assert_eq!("1/4".parse::<Shard>(), Ok(Shard { index: 1, count: 4 }));
        assert!("4/4".parse::<Shard>().is_err());
        assert!("0/0".parse::<Shard>().is_err());
        assert!("x".parse::<Shard>().is_err());
    }

    #[test]
    fn cell_counts_are_checked_before_anything_is_allocated() {
        assert_eq!(cell_count([(3, 1, 4), (1, 3, 2)]), Ok(18));
        assert_eq!(cell_count([(1, 1, MAX_CELLS)]), Ok(MAX_CELLS));
        for bad in [
            vec![(1, 1, MAX_CELLS + 1)],
            vec![(1, 1, MAX_CELLS), (1, 1, 1)],
            vec![(u64::MAX, 1, 2)],
            vec![(1, 1 << 32, 1 << 32)],
            vec![(1 << 22, 1 << 21, 1 << 21)],
        ] {
            assert!(cell_count(bad.clone()).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_suite_json_pointing_outside_its_folder_is_refused() {
        let cells = plan(&items()).expect("plan");
        let meta = SuiteMeta {
            format: FORMAT,
            revision: "r".into(),
            backend: "sim".into(),
            plan_hash: "h".into(),
            shard: None,
            merged_from: Vec::new(),
            header: vec!["scenario".into()],
            plan: cells,
            results: vec![CellResult {
                index: 0,
                rows: Vec::new(),
                failures: Vec::new(),
            }],
        };
        assert_eq!(check(&meta), Ok(()));
        for bad in ["../x", "/etc", "a/b", "..", "", "a\\b"] {
            let mut m = meta.clone();
            m.plan[1].dir = bad.into();
            let err = check(&m).expect_err(bad);
            assert!(err.starts_with("plan[1].dir"), "{bad:?}: {err}");
        }
        let mut m = meta.clone();
        m.plan[2].dir = m.plan[0].dir.clone();
        assert!(check(&m).expect_err("twice").contains("appears twice"));
        let mut m = meta.clone();
        m.plan[1].index = 7;
        assert!(check(&m).is_err());
        let mut m = meta.clone();
        m.results[0].index = 99;
        assert!(check(&m).is_err());
        let mut m = meta;
        m.shard = Some(Shard { index: 0, count: 0 });
        assert!(check(&m).is_err());
    }

    #[test]
    fn plan_hash_changes_with_any_input() {
        let cells = plan(&items()).expect("plan");
        let h = plan_hash(&cells, &["{}".into()], "sim", "o");
        assert_eq!(h, plan_hash(&cells, &["{}".into()], "sim", "o"));
        assert_ne!(h, plan_hash(&cells, &["{ }".into()], "sim", "o"));
        assert_ne!(h, plan_hash(&cells, &["{}".into()], "cpu", "o"));
        assert_ne!(h, plan_hash(&cells[1..], &["{}".into()], "sim", "o"));
        let mut c = cells.clone();
        c[0].host_capacity = Some("4 GiB".into());
        assert_ne!(h, plan_hash(&c, &["{}".into()], "sim", "o"));
    }
}
