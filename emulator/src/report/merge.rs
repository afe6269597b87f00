//! `arfsnic compare --merge FILE…`: the reports of a matrix's shards (one file per cell,
//! `SCENARIO@KERNEL@PROFILE.json`, docs/ci.md "Matrices") joined into one steer-rate
//! table, CSV and SVG across kernels. Refused with the file and field named: a file that
//! is not a report of this schema version, the same cell twice, or two cells of one
//! scenario that cannot be compared (other VM, queues, runs, duration or flows) — never a
//! table that mixes incomparable runs.

use super::schema::Report;
use anyhow::bail;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// `(field, value)` pairs that must be equal for two cells of one scenario.
type Shape = Vec<(&'static str, String)>;

/// What must be equal for two cells of one scenario to share a table.
fn shape(r: &Report) -> Shape {
    let labels: Vec<&str> = r.runs.iter().map(|x| x.label.as_str()).collect();
    let durations: Vec<String> = r.runs.iter().map(|x| format!("{:?}", x.duration_s)).collect();
    vec![
        ("vcpus", r.vcpus.to_string()),
        ("queues", r.queues.to_string()),
        ("topology", r.topology.clone()),
        ("runs[].label", labels.join(", ")),
        ("runs[].duration_s", durations.join(", ")),
        ("runs[].link.flows", r.runs.first().map_or_else(String::new, |x| x.link.flows.to_string())),
    ]
}

fn profiles(r: &Report) -> String {
    let mut p: Vec<&str> = r.runs.iter().map(|x| x.profile.as_str()).collect();
    p.dedup();
    p.join("+")
}

/// The reports, each renamed `SCENARIO@KERNEL@PROFILE` (the table's scenario column), in
/// the order given.
pub fn merge(files: &[PathBuf]) -> anyhow::Result<Vec<Report>> {
    if files.is_empty() {
        bail!("--merge: no report files");
    }
    let mut out: Vec<Report> = Vec::new();
    let mut cells: BTreeMap<(String, String, String), PathBuf> = BTreeMap::new();
    let mut first_of: BTreeMap<String, (PathBuf, Shape)> = BTreeMap::new();
    for f in files {
        let r = Report::load(f, "--merge")?;
        let key = (r.scenario.clone(), r.kernel.clone(), profiles(&r));
        if let Some(other) = cells.get(&key) {
            bail!(
                "--merge: {} and {} are the same cell (scenario {}, kernel {}, profile {})",
                other.display(),
                f.display(),
                key.0,
                key.1,
                key.2
            );
        }
        cells.insert(key.clone(), f.clone());
        let s = shape(&r);
        match first_of.get(&r.scenario) {
            Some((p, s0)) => {
                if let Some(((field, a), (_, b))) = s0.iter().zip(&s).find(|(x, y)| x.1 != y.1) {
                    bail!(
                        "--merge: {}: scenario {} has {field} {b:?} but {} has {a:?}: incomparable runs",
                        f.display(),
                        r.scenario,
                        p.display()
                    );
                }
            }
            None => {
                first_of.insert(r.scenario.clone(), (f.clone(), s));
            }
        }
        let mut r = r;
        r.scenario = format!("{}@{}@{}", key.0, key.1, key.2);
        out.push(r);
    }
    Ok(out)
}

/// Every `*.json` directly in `dir`, sorted (for `--merge DIR`).
pub fn reports_in(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| anyhow::anyhow!("--merge {}: {e}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    v.sort();
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::schema::RunReport;

    fn report(scenario: &str, kernel: &str, vcpus: u32) -> Report {
        Report {
            scenario: scenario.into(),
            kernel: kernel.into(),
            vcpus,
            queues: 4,
            complete: true,
            schema_version: crate::report::SCHEMA_VERSION,
            runs: vec![RunReport { label: "sysctl=0".into(), profile: "mlx5-cx6".into(), ..Default::default() }],
            ..Default::default()
        }
    }

    fn write(dir: &Path, name: &str, r: &Report) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, r.to_json_pretty()).unwrap();
        p
    }

    #[test]
    fn cells_join_and_bad_sets_are_refused_by_file_and_field() {
        let d = tempfile::tempdir().unwrap();
        let a = write(d.path(), "a.json", &report("llc-within", "debian-6.12", 4));
        let b = write(d.path(), "b.json", &report("llc-within", "debian-7.3", 4));
        let m = merge(&[a.clone(), b.clone()]).unwrap();
        let names: Vec<&str> = m.iter().map(|r| r.scenario.as_str()).collect();
        assert_eq!(names, ["llc-within@debian-6.12@mlx5-cx6", "llc-within@debian-7.3@mlx5-cx6"]);

        let e = merge(&[a.clone(), a.clone()]).unwrap_err().to_string();
        assert!(e.contains("are the same cell") && e.contains("kernel debian-6.12"), "{e}");
        let c = write(d.path(), "c.json", &report("llc-within", "debian-7.3-rc", 6));
        let e = merge(&[a.clone(), c]).unwrap_err().to_string();
        assert!(e.contains("c.json: scenario llc-within has vcpus \"6\"") && e.contains("incomparable"), "{e}");
        let junk = d.path().join("junk.json");
        std::fs::write(&junk, "{\"schema_version\": 1}").unwrap();
        assert!(merge(&[a, junk]).unwrap_err().to_string().contains("junk.json"));
    }
}
