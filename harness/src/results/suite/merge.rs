//! `kvbench merge`: shard folders into one suite folder. Refuses (bad input, nothing written)
//! shards of different builds or different plans, a cell that two shards ran, and a cell no
//! shard ran; otherwise copies each cell's folder from its shard and writes the table in plan
//! order, atomically (a temporary folder renamed into place, removed on an error or an
//! interrupt). The output is replaced only with `--force` and only when it is a results folder
//! or empty (`staging::check_target`): never someone's other folder, never a file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::{read, write, SuiteMeta};
use crate::results::html;
use crate::results::plot::data::{file_error, FileError};
use crate::results::Staging;

#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    #[error(transparent)]
    File(#[from] FileError),
    #[error("no shard folders to merge")]
    Empty,
    #[error("mixed revisions: {} ran {a:?}, {} ran {b:?} (set KVBENCH_REVISION on both if they are one build)", a_dir.display(), b_dir.display())]
    MixedRevision {
        a_dir: PathBuf,
        a: String,
        b_dir: PathBuf,
        b: String,
    },
    #[error("{} and {} are shards of different suites (plan hash {a} vs {b}: other scenarios, overrides, seeds, backend or options)", a_dir.display(), b_dir.display())]
    DifferentPlan {
        a_dir: PathBuf,
        a: String,
        b_dir: PathBuf,
        b: String,
    },
    #[error("cell {cell:?} is in both {} and {}", a.display(), b.display())]
    Overlap {
        cell: String,
        a: PathBuf,
        b: PathBuf,
    },
    #[error("the shards do not cover the suite: {} of {total} cells missing ({})", missing.len(), missing.join(", "))]
    Missing { missing: Vec<String>, total: usize },
    #[error(transparent)]
    Output(#[from] crate::results::ResultsError),
    #[error(transparent)]
    Report(#[from] html::ReportError),
}

/// Copy a cell's folder: folders and regular files only (a link inside a shard is not followed,
/// so nothing outside the shard is read).
fn copy_tree(from: &Path, to: &Path) -> Result<(), FileError> {
    if !std::fs::symlink_metadata(from)
        .map_err(|e| file_error(from, e))?
        .is_dir()
    {
        return Err(file_error(from, "not a folder (a file or a link)"));
    }
    std::fs::create_dir_all(to).map_err(|e| file_error(to, e))?;
    for entry in std::fs::read_dir(from).map_err(|e| file_error(from, e))? {
        let entry = entry.map_err(|e| file_error(from, e))?;
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        let ty = entry.file_type().map_err(|e| file_error(&src, e))?;
        if ty.is_dir() {
            copy_tree(&src, &dst)?;
        } else if ty.is_file() {
            std::fs::copy(&src, &dst).map_err(|e| file_error(&src, e))?;
        }
    }
    Ok(())
}

/// Check the shards against each other and return the merged metadata with, per cell index,
/// the shard folder holding it.
pub fn combine(shards: &[PathBuf]) -> Result<(SuiteMeta, BTreeMap<usize, PathBuf>), MergeError> {
    let metas: Vec<(PathBuf, SuiteMeta)> = shards
        .iter()
        .map(|d| read(d).map(|m| (d.clone(), m)))
        .collect::<Result<_, _>>()?;
    let (first_dir, first) = metas.first().ok_or(MergeError::Empty)?;
    let mut owner: BTreeMap<usize, PathBuf> = BTreeMap::new();
    let mut merged = SuiteMeta {
        shard: None,
        merged_from: Vec::new(),
        results: Vec::new(),
        ..first.clone()
    };
    for (dir, m) in &metas {
        if m.revision != first.revision {
            return Err(MergeError::MixedRevision {
                a_dir: first_dir.clone(),
                a: first.revision.clone(),
                b_dir: dir.clone(),
                b: m.revision.clone(),
            });
        }
        if m.plan_hash != first.plan_hash || m.plan != first.plan || m.header != first.header {
            return Err(MergeError::DifferentPlan {
                a_dir: first_dir.clone(),
                a: first.plan_hash.clone(),
                b_dir: dir.clone(),
                b: m.plan_hash.clone(),
            });
        }
        merged.merged_from.extend(m.shard);
        merged.merged_from.extend(m.merged_from.iter().copied());
        for r in &m.results {
            if let Some(prev) = owner.insert(r.index, dir.clone()) {
                let cell = m
                    .plan
                    .get(r.index)
                    .map_or_else(|| r.index.to_string(), |c| c.dir.clone());
                return Err(MergeError::Overlap {
                    cell,
                    a: prev,
                    b: dir.clone(),
                });
            }
            merged.results.push(r.clone());
        }
    }
    let missing: Vec<String> = merged
        .plan
        .iter()
        .filter(|c| !owner.contains_key(&c.index))
        .map(|c| c.dir.clone())
        .collect();
    if !missing.is_empty() {
        return Err(MergeError::Missing {
            missing,
            total: merged.plan.len(),
        });
    }
    merged.results.sort_by_key(|r| r.index);
    merged.merged_from.sort_by_key(|s| (s.count, s.index));
    Ok((merged, owner))
}

/// Merge `shards` into `out` (replaced only with `force`, and only a results folder or an empty
/// one); returns the merged metadata.
pub fn merge(shards: &[PathBuf], out: &Path, force: bool) -> Result<SuiteMeta, MergeError> {
    let (meta, owner) = combine(shards)?;
    let staging = Staging::begin(out, crate::results::marker::Kind::Suite, force)?;
    for cell in &meta.plan {
        if let Some(shard) = owner.get(&cell.index) {
            // `cell.dir` is a slug (checked by `read`): both paths stay in their folders.
            copy_tree(&shard.join(&cell.dir), &staging.dir().join(&cell.dir))?;
        }
    }
    write(staging.dir(), &meta)?;
    html::write_suite_report(staging.dir())?;
    staging.commit()?;
    Ok(meta)
}
