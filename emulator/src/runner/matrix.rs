//! Matrices for CI systems (`arfsnic matrix`, docs/ci.md "Matrices"): kernels ×
//! scenarios × profiles from a TOML file (configs/matrices/default.toml), listed as numbered
//! cells, run one shard at a time (`--shard I/N`: the cells whose number is I modulo N),
//! each cell's report written as `SCENARIO@KERNEL@PROFILE.json`. A CI system fans the
//! shards out as jobs; `arfsnic compare --merge` joins their reports
//! ([`crate::report::merge`]). arfsnic owns the format and the merge, not a scheduler.

use super::env::KERNEL_NAMES;
use super::scenario::Scenario;
use super::{resolve_profile, run_scenario, RunOptions};
use anyhow::{bail, Context};
use serde::Deserialize;
use std::path::{Path, PathBuf};

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Matrix {
    /// Kernel names (`arfsnic run --kernel`).
    pub kernels: Vec<String>,
    /// Scenario names in configs/scenarios/ or paths (relative to the repository).
    pub scenarios: Vec<String>,
    /// NIC profile names in configs/ or paths; each replaces the scenario's `profile`.
    pub profiles: Vec<String>,
}

/// One cell: 1-based `index` of `total`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cell {
    pub index: usize,
    pub total: usize,
    pub kernel: String,
    pub scenario: String,
    pub profile: String,
}

impl Cell {
    /// `SCENARIO@KERNEL@PROFILE`: the report's file stem and its row prefix in the merge.
    pub fn name(&self) -> String {
        // Names stay as they are (`debian-7.3`); a path gives its file stem.
        let stem = |s: &str| {
            if !s.contains('/') && !s.ends_with(".toml") {
                return s.to_string();
            }
            Path::new(s).file_stem().map_or_else(|| s.to_string(), |f| f.to_string_lossy().into())
        };
        format!("{}@{}@{}", stem(&self.scenario), stem(&self.kernel), stem(&self.profile))
    }
}

/// The scenario file a matrix entry names.
pub fn scenario_path(root: &Path, spec: &str) -> PathBuf {
    if spec.contains('/') || spec.ends_with(".toml") {
        root.join(spec)
    } else {
        root.join("configs/scenarios").join(format!("{spec}.toml"))
    }
}

impl Matrix {
    /// Load and check every entry; errors name the file and the field.
    pub fn load(path: &Path, root: &Path) -> anyhow::Result<Matrix> {
        let text = std::fs::read_to_string(path).with_context(|| format!("--matrix {}", path.display()))?;
        let m: Matrix = toml::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {}", path.display(), e.message()))?;
        let f = path.display();
        for (field, v) in [("kernels", &m.kernels), ("scenarios", &m.scenarios), ("profiles", &m.profiles)] {
            if v.is_empty() {
                bail!("{f}: {field}: empty (at least one entry)");
            }
        }
        for (i, k) in m.kernels.iter().enumerate() {
            let is_path = k.contains('/') && root.join(k).is_file();
            if !KERNEL_NAMES.contains(&k.as_str()) && !is_path {
                bail!("{f}: kernels[{i}]: {k:?} is not a kernel name ({}) or a bzImage path", KERNEL_NAMES.join(", "));
            }
        }
        for (i, s) in m.scenarios.iter().enumerate() {
            let p = scenario_path(root, s);
            if !p.is_file() {
                bail!("{f}: scenarios[{i}]: {s:?}: no {} (names are files in configs/scenarios/)", p.display());
            }
            Scenario::load(&p).map_err(|e| anyhow::anyhow!("{f}: scenarios[{i}]: {e}"))?;
        }
        for (i, p) in m.profiles.iter().enumerate() {
            resolve_profile(p, root, root).map_err(|e| anyhow::anyhow!("{f}: profiles[{i}]: {e}"))?;
        }
        Ok(m)
    }

    /// Every cell, kernels outermost, profiles innermost.
    pub fn cells(&self) -> Vec<Cell> {
        let total = self.kernels.len() * self.scenarios.len() * self.profiles.len();
        let mut v = Vec::with_capacity(total);
        for k in &self.kernels {
            for s in &self.scenarios {
                for p in &self.profiles {
                    v.push(Cell {
                        index: v.len() + 1,
                        total,
                        kernel: k.clone(),
                        scenario: s.clone(),
                        profile: p.clone(),
                    });
                }
            }
        }
        v
    }
}

/// `I/N` with 1 ≤ I ≤ N.
pub fn parse_shard(s: &str) -> Result<(usize, usize), String> {
    let bad = || format!("{s:?} is not I/N with 1 <= I <= N (e.g. 2/4: the second of four shards)");
    let (i, n) = s.split_once('/').ok_or_else(bad)?;
    let (i, n): (usize, usize) = (i.trim().parse().map_err(|_| bad())?, n.trim().parse().map_err(|_| bad())?);
    if i == 0 || n == 0 || i > n {
        return Err(bad());
    }
    Ok((i, n))
}

/// The cells of shard `i` of `n`: numbers congruent to `i` modulo `n`.
pub fn shard(cells: &[Cell], (i, n): (usize, usize)) -> Vec<Cell> {
    cells.iter().filter(|c| (c.index - 1) % n == i - 1).cloned().collect()
}

/// Run `cells` one after the other with `opts` (its kernel and profile set per cell),
/// writing `out/CELL.json`; returns the files.
pub fn run_cells(root: &Path, cells: &[Cell], out: &Path, opts: &RunOptions) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(out).with_context(|| format!("--out {}", out.display()))?;
    let mut files = Vec::new();
    for c in cells {
        eprintln!("matrix: cell {}/{}: {}", c.index, c.total, c.name());
        let o = RunOptions {
            kernel: Some(c.kernel.clone()),
            profile: Some(c.profile.clone()),
            logdir: Some(out.join("logs").join(c.name())),
            ..opts.clone()
        };
        let report =
            run_scenario(&scenario_path(root, &c.scenario), &o).with_context(|| format!("cell {}", c.name()))?;
        let file = out.join(format!("{}.json", c.name()));
        std::fs::write(&file, report.to_json_pretty()).with_context(|| format!("writing {}", file.display()))?;
        files.push(file);
        if report.interrupted.is_some() {
            break;
        }
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_partition_the_cells() {
        let m = Matrix {
            kernels: vec!["debian-6.12".into(), "debian-7.3".into()],
            scenarios: vec!["llc-within".into(), "llc-across".into(), "smoke".into()],
            profiles: vec!["mlx5-cx6".into()],
        };
        let cells = m.cells();
        assert_eq!(cells.len(), 6);
        assert_eq!(cells[4].name(), "llc-across@debian-7.3@mlx5-cx6");
        let mut seen: Vec<usize> = (1..=4).flat_map(|i| shard(&cells, (i, 4))).map(|c| c.index).collect();
        seen.sort_unstable();
        assert_eq!(seen, (1..=6).collect::<Vec<_>>());
        assert_eq!(shard(&cells, (2, 4)).iter().map(|c| c.index).collect::<Vec<_>>(), [2, 6]);
    }

    #[test]
    fn shard_syntax() {
        assert_eq!(parse_shard("2/4"), Ok((2, 4)));
        for bad in ["0/4", "5/4", "4", "a/b", "1/0", ""] {
            assert!(parse_shard(bad).is_err(), "{bad}");
        }
    }
}
