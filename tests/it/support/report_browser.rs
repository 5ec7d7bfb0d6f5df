//! Headless Chromium for the report tests: the page's DOM after load, and the marker its inline
//! check writes. Without Chromium a check prints `SKIP: chromium not installed`, unless
//! `KVBENCH_REQUIRE_CHROMIUM=1` (CI), where it fails.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The viewport the pages are judged in: a laptop screen's first screen.
pub const SCREEN: (u32, u32) = (1280, 800);

fn chromium() -> Option<PathBuf> {
    let found = ["chromium", "chromium-browser"].iter().find_map(|name| {
        Command::new(name)
            .arg("--version")
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|_| PathBuf::from(name))
    });
    if found.is_none() {
        assert!(
            std::env::var("KVBENCH_REQUIRE_CHROMIUM").as_deref() != Ok("1"),
            "KVBENCH_REQUIRE_CHROMIUM=1 but chromium is not installed"
        );
        println!("SKIP: chromium not installed");
    }
    found
}

fn headless(page: &Path, what: &[String]) -> Option<std::process::Output> {
    let bin = chromium()?;
    let profile = tempfile::tempdir().expect("profile dir");
    let url = format!(
        "file://{}",
        page.canonicalize().expect("page path").display()
    );
    let out = Command::new(bin)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--virtual-time-budget=5000",
        ])
        .arg(format!("--window-size={},{}", SCREEN.0, SCREEN.1))
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(what)
        .arg(&url)
        .output()
        .expect("run chromium");
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(out)
}

/// The DOM after load; `None` (with a SKIP line) without Chromium.
pub fn render(page: &Path) -> Option<String> {
    let out = headless(page, &["--dump-dom".to_string()])?;
    Some(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A PNG of the first screen at `png` (for a reader to look at); false without Chromium.
pub fn screenshot(page: &Path, png: &Path) -> bool {
    headless(page, &[format!("--screenshot={}", png.display())]).is_some()
}

pub fn check_marker(dom: &str) -> String {
    let start = dom
        .find("<div id=\"kvbench-check\"")
        .unwrap_or_else(|| panic!("no check marker in the rendered page:\n{dom}"));
    let end = dom[start..].find("</div>").map_or(dom.len(), |e| start + e);
    dom[start..end].to_string()
}

/// The integer value of attribute `name` on the marker.
pub fn marker_number(marker: &str, name: &str) -> Option<i64> {
    let at = marker.find(&format!("{name}=\""))? + name.len() + 2;
    marker[at..].split('"').next()?.parse().ok()
}

fn svg_count(html: &str) -> usize {
    html.matches("<svg ").count()
}

/// In headless Chromium every `<svg>` of the page drew and nothing failed to load.
pub fn browser_check(page: &Path) {
    let Some(dom) = render(page) else { return };
    let marker = check_marker(&dom);
    let html = std::fs::read_to_string(page).expect("page");
    let plots = svg_count(&html);
    assert!(
        marker.contains("data-status=\"ok\""),
        "{}: {marker}",
        page.display()
    );
    assert!(
        marker.contains(&format!("data-plots=\"{plots}\"")),
        "{}: expected {plots} drawn plots: {marker}",
        page.display()
    );
}
