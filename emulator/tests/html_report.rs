//! The HTML report in a real browser: `arfsnic results docs/results/demo-7.3/*.json --html
//! OUT` writes the page, a headless Chromium from Debian (`chromium`, or
//! `chromium-headless-shell`) loads it and `--dump-dom` shows what the page's own check
//! script wrote on `<body>` after layout: how many `<svg>` the browser drew with a
//! non-empty bounding box, and the steer-rate table's rows. Needs a browser, so it is
//! ignored by plain `cargo test`; guest-tests/run-tests.sh runs it with `--ignored`.
//! Without a browser it says SKIPPED and passes. With only firefox-esr it can take a
//! screenshot, not read the DOM: it checks the screenshot exists and says so.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The committed reports the page is made of (docs/results/demo-7.3/*.json).
fn reports() -> Vec<PathBuf> {
    let dir = root().join("docs/results/demo-7.3");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    v.sort();
    assert!(!v.is_empty(), "no reports in {}", dir.display());
    v
}

/// `name` on PATH (or at one of `extra` paths).
fn find(name: &str, extra: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).map(|d| d.join(name)).chain(extra.iter().map(PathBuf::from)).find(|p| p.is_file())
}

/// Run `cmd`, killed after `limit`; its output.
fn run_with_limit(cmd: &mut Command, limit: Duration) -> Output {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("starting the browser");
    let t0 = Instant::now();
    // Read stdout in a thread: --dump-dom can exceed a pipe's buffer.
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        std::io::Read::read_to_end(&mut out, &mut s).ok();
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        std::io::Read::read_to_end(&mut err, &mut s).ok();
        s
    });
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t0.elapsed() > limit {
            child.kill().ok();
            panic!("the browser did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    Output { status, stdout: reader.join().unwrap(), stderr: err_reader.join().unwrap() }
}

/// The value of attribute `name` in the `<body …>` tag of `dom`.
fn body_attr(dom: &str, name: &str) -> Option<String> {
    let start = dom.find("<body")?;
    let tag = &dom[start..start + dom[start..].find('>')?];
    let key = format!(" {name}=\"");
    let i = tag.find(&key)? + key.len();
    Some(tag[i..i + tag[i..].find('"')?].to_string())
}

fn write_page(out: &Path) -> (usize, usize) {
    let files = reports();
    let mut args: Vec<String> = vec!["results".into()];
    args.extend(files.iter().map(|p| p.display().to_string()));
    args.extend(["--html".into(), out.display().to_string()]);
    let o = Command::new(env!("CARGO_BIN_EXE_arfsnic")).args(&args).current_dir(root()).output().unwrap();
    assert!(o.status.success(), "arfsnic {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    let page = std::fs::read_to_string(out).unwrap();
    let svgs = page.matches("<svg").count();
    let runs: usize = files.iter().map(|p| arfsnic::report::Report::load(p, "report").unwrap().runs.len()).sum();
    assert!(svgs > 0 && runs > 0, "{svgs} plots, {runs} runs");
    (svgs, runs)
}

#[test]
#[ignore = "needs chromium: run through guest-tests/run-tests.sh"]
fn a_headless_browser_draws_the_table_and_every_plot() {
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("index.html");
    let (svgs, runs) = write_page(&page);
    let url = format!("file://{}", page.display());
    let chromium = find("chromium-headless-shell", &["/usr/lib/chromium/chromium-headless-shell"])
        .or_else(|| find("chromium", &[]));
    if let Some(browser) = chromium {
        let profile = dir.path().join("profile");
        let o = run_with_limit(
            Command::new(&browser).args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                &format!("--user-data-dir={}", profile.display()),
                "--dump-dom",
                &url,
            ]),
            Duration::from_secs(120),
        );
        let dom = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success(),
            "{} failed ({}): {}",
            browser.display(),
            o.status,
            String::from_utf8_lossy(&o.stderr)
        );
        let attr =
            |n: &str| body_attr(&dom, n).unwrap_or_else(|| panic!("<body> has no {n}: {}", &dom[..dom.len().min(400)]));
        assert_eq!(attr("data-check"), "done", "the page's check script did not run");
        let (seen, rendered, rows) = (attr("data-svgs"), attr("data-svgs-rendered"), attr("data-table-rows"));
        eprintln!(
            "{}: {rendered} of {seen} SVG plots rendered (the page holds {svgs}), {rows} table rows ({runs} runs)",
            browser.display()
        );
        assert_eq!(seen, svgs.to_string(), "the browser found another number of <svg> than the file holds");
        assert_eq!(rendered, svgs.to_string(), "not every plot was laid out with a non-empty bounding box");
        assert_eq!(rows, runs.to_string(), "the steer-rate table lacks rows");
        return;
    }
    if let Some(firefox) = find("firefox-esr", &[]).or_else(|| find("firefox", &[])) {
        // Firefox has no --dump-dom: a screenshot shows the page loaded, not that the
        // plots were drawn.
        let shot = dir.path().join("shot.png");
        let o = run_with_limit(
            Command::new(&firefox)
                .env("HOME", dir.path())
                .args(["--headless", "--window-size=1400,2400", "--screenshot"])
                .arg(&shot)
                .arg(&url),
            Duration::from_secs(180),
        );
        let len = std::fs::metadata(&shot).map(|m| m.len()).unwrap_or(0);
        assert!(
            len > 0,
            "{} wrote no screenshot ({}): {}",
            firefox.display(),
            o.status,
            String::from_utf8_lossy(&o.stderr)
        );
        eprintln!(
            "PARTIAL: {} took a {len}-byte screenshot of the page; checking that its {svgs} plots render needs chromium (apt install chromium)",
            firefox.display()
        );
        return;
    }
    eprintln!("SKIPPED: needs chromium (apt install chromium)");
}

/// The page itself, without a browser: what the browser test relies on.
#[test]
fn results_html_writes_a_self_contained_page() {
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("out/index.html");
    let (svgs, runs) = write_page(&page);
    let text = std::fs::read_to_string(&page).unwrap();
    assert_eq!(svgs, 3, "steer-rate chart plus one per-second chart per scenario");
    assert_eq!(text.matches("</svg>").count(), svgs);
    let table = &text[text.find("id=\"steer-rate\"").unwrap()..];
    let table = &table[..table.find("</table>").unwrap()];
    assert_eq!(table.matches("<tr class=").count(), runs);
    for s in ["src=", "<link", "href=\"http", "url(", "@import"] {
        assert!(!text.contains(s), "the page loads something: {s}");
    }
    assert!(text.contains("data-svgs-rendered"));
}
