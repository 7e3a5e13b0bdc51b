//! The guides tell the truth: every link and repository path they name exists, every
//! `payrecon::…` path compiles, and the layers the architecture describes hold. Each command
//! a guide shows is parsed by the CLI's own test (src/cli/doc_commands.rs), the configuration
//! reference is checked by src/config/reference.rs, and the walkthroughs run in tours.rs.

use crate::common::repo_root as root;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

/// README, CHANGELOG and every page under docs/ (the architecture's included).
fn guides() -> Vec<PathBuf> {
    let mut guides = vec![root().join("README.md"), root().join("CHANGELOG.md")];
    let mut folders = vec![root().join("docs")];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(folder).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                folders.push(path);
            } else if path.extension().is_some_and(|ext| ext == "md") {
                guides.push(path);
            }
        }
    }
    guides
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The text outside fenced blocks, and that text without its code spans.
fn prose(text: &str) -> (String, String) {
    let fence = regex::Regex::new(r"(?ms)^\s*```.*?^\s*```").unwrap();
    let outside = fence.replace_all(text, "").into_owned();
    let spans = regex::Regex::new(r"`[^`]*`").unwrap();
    let bare = spans.replace_all(&outside, "").into_owned();
    (outside, bare)
}

/// GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    let (outside, _) = prose(text);
    let heading = regex::Regex::new(r"(?m)^#+ (.*)$").unwrap();
    heading
        .captures_iter(&outside)
        .map(|c| anchor(&c[1]))
        .collect()
}

#[test]
fn every_link_and_path_a_guide_names_exists() {
    let link = regex::Regex::new(r"\]\(([^)#:\s]*)(?:#([^)\s]*))?\)").unwrap();
    let path = regex::Regex::new(
        r"(?:^|[^\w/.-])((?:src|tests|scripts|deploy|docs|fixtures|chains|bench|examples|migrations|locales)/[\w./-]*\w)",
    )
    .unwrap();
    // The headings of each page linked to with an anchor, read once however often it is.
    let mut headings: BTreeMap<PathBuf, BTreeSet<String>> = BTreeMap::new();
    let mut wrong = Vec::new();
    for guide in guides() {
        let text = read(&guide);
        let (outside, bare) = prose(&text);
        let name = guide.strip_prefix(root()).unwrap().display().to_string();
        for found in link.captures_iter(&bare) {
            let target = match &found[1] {
                "" => guide.clone(),
                relative => guide.parent().unwrap().join(relative),
            };
            if !target.exists() {
                wrong.push(format!(
                    "{name}: links to {}, which does not exist",
                    &found[1]
                ));
            } else if let Some(fragment) = found.get(2)
                && !headings
                    .entry(target.clone())
                    .or_insert_with(|| anchors(&read(&target)))
                    .contains(fragment.as_str())
            {
                wrong.push(format!(
                    "{name}: links to #{} in {}, which has no such heading",
                    fragment.as_str(),
                    &found[1]
                ));
            }
        }
        for found in path.captures_iter(&outside) {
            let named = &found[1];
            if !root().join(named).exists() {
                wrong.push(format!("{name}: names {named}, which does not exist"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "the guides name what is not there:\n{}",
        wrong.join("\n")
    );
}

/// Every `payrecon::…` path a guide names is imported by the doctest in src/lib.rs
/// (`GuidePaths`), which `cargo test` compiles: a path that moves or goes private fails there.
#[test]
fn every_rust_path_a_guide_names_is_compiled() {
    let named = regex::Regex::new(r"\bpayrecon::[A-Za-z_][\w:]*\w").unwrap();
    let lib = read(&root().join("src/lib.rs"));
    let compiled: BTreeSet<&str> = lib
        .lines()
        .filter_map(|line| line.trim().strip_prefix("/// use "))
        .map(|path| path.trim_end_matches(';'))
        .collect();
    let mut missing = BTreeSet::new();
    for guide in guides() {
        for path in named.find_iter(&read(&guide)) {
            if !compiled.contains(path.as_str()) {
                missing.insert(path.as_str().to_owned());
            }
        }
    }
    assert!(
        missing.is_empty(),
        "add a `use` of each to GuidePaths in src/lib.rs: {missing:?}"
    );
}

/// The layers ARCHITECTURE.md describes hold (scripts/layers.py reads its list): each module
/// sits in a layer and names none above its own, no circle between modules, and `config`
/// names only the vocabulary it is written in.
#[test]
fn the_modules_form_no_circle() {
    let output = Command::new("python3")
        .arg(root().join("scripts/layers.py"))
        .output()
        .expect("python3 runs scripts/layers.py");
    assert!(
        output.status.success(),
        "scripts/layers.py: {}",
        String::from_utf8_lossy(&output.stdout)
    );
}
