//! Every shipped profile, scenario and CI matrix loads, and every scenario's profiles resolve.

use arfsnic::model::profile::Profile;
use arfsnic::runner::resolve_profile;
use arfsnic::runner::scenario::Scenario;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn tomls(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    v.sort();
    v
}

#[test]
fn shipped_profiles_load() {
    let files = tomls(&root().join("configs"));
    assert!(files.len() >= 7, "{files:?}");
    for f in files {
        let p = Profile::load(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        assert_eq!(Some(p.name.as_str()), f.file_stem().and_then(|s| s.to_str()), "profile name = file name");
    }
}

#[test]
fn shipped_scenarios_load_and_name_existing_profiles() {
    let dir = root().join("configs/scenarios");
    let files = tomls(&dir);
    assert!(files.len() >= 10, "{files:?}");
    for f in files {
        let s = Scenario::load(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        assert_eq!(Some(s.name.as_str()), f.file_stem().and_then(|s| s.to_str()), "scenario name = file name");
        let mut profiles = vec![s.profile.clone()];
        profiles.extend(s.runs().iter().filter_map(|r| r.profile.clone()));
        for p in profiles {
            let path = resolve_profile(&p, &root(), &dir).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            Profile::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        }
    }
}

/// The reports README and docs/results.md are generated from load as typed reports of
/// this build's schema (a schema change must regenerate them), and each has runs.
#[test]
fn every_committed_report_loads() {
    let mut n = 0;
    let mut matrix = 0;
    for sub in ["demo", "demo-full-7.3", "other", "matrix"] {
        let dir = root().join("docs/results").join(sub);
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "json"))
            .collect();
        files.sort();
        for f in files {
            let r = arfsnic::report::Report::load(&f, "committed report").unwrap_or_else(|e| panic!("{e}"));
            assert!(!r.runs.is_empty(), "{}", f.display());
            if sub == "matrix" {
                // Reports made after the run-health verdict existed carry it on every run.
                assert!(r.runs.iter().all(|x| x.health.is_some()), "{}: a run without health", f.display());
                matrix += 1;
            } else {
                n += 1;
            }
        }
    }
    assert_eq!(n, 12, "two demo reports, the two pods of demo --full and eight of the other scenarios");
    assert_eq!(matrix, 9, "the topology matrix: 5 topologies, hop-within in each, hop-across in the 4 with 2+ LLCs");
}

#[test]
fn shipped_matrices_load() {
    let files = tomls(&root().join("configs/matrices"));
    assert!(!files.is_empty());
    for f in files {
        let m = arfsnic::runner::matrix::Matrix::load(&f, &root()).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        assert!(!m.cells().is_empty(), "{}", f.display());
    }
}
