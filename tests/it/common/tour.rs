//! The guides' walkthroughs run as a reader runs them: each fenced `sh` block a guide marks
//! with `<!-- tour: <name> -->` on the line before it, line by line as written, in one bash
//! session (variables, `cd` and background jobs carry over), `cargo run [-q] --release --`
//! and a leading `payrecon` being this build's binary. A `<placeholder>` is filled from the
//! newest earlier answer that has that key, as the reader copies it; a comment that shows
//! `"key": "value"` is checked against the step's answer (anywhere in it), and the step is
//! asked again until it holds (a reader asks again while a payment confirms), within a bound.

use std::ffi::OsStr;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// How long a step whose shown answer has not come yet is asked again.
const ANSWER_BOUND: Duration = Duration::from_secs(120);

/// The lines of the blocks of `guide` marked as the tour `name`, in order, a line continued
/// by `\` joined to the next.
pub fn tour_lines(guide: &str, name: &str) -> Vec<String> {
    let text = std::fs::read_to_string(super::repo_root().join(guide)).unwrap();
    let pattern = format!(
        r"(?ms)^<!-- tour: {} -->\n```sh\n(.*?)^```",
        regex::escape(name)
    );
    let block = regex::Regex::new(&pattern).unwrap();
    let lines: Vec<String> = block
        .captures_iter(&text)
        .flat_map(|c| {
            c[1].replace("\\\n", " ")
                .lines()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .filter(|line| !line.trim().is_empty())
        .collect();
    assert!(!lines.is_empty(), "{guide} marks blocks as the tour {name}");
    lines
}

/// One bash session running a walkthrough; its background jobs are stopped when it ends.
pub struct Tour {
    bash: Child,
    stdin: ChildStdin,
    dir: tempfile::TempDir,
    answers: Vec<Value>,
    steps: usize,
    /// Text the guide writes that this run replaces (a port of its own).
    replace: Vec<(String, String)>,
}

impl Tour {
    pub fn start<K: AsRef<OsStr>, V: AsRef<OsStr>>(
        cwd: &Path,
        env: &[(K, V)],
        replace: &[(&str, &str)],
    ) -> Tour {
        let mut bash = Command::new("bash");
        bash.args(["--noprofile", "--norc"])
            .current_dir(cwd)
            .env("PAYRECON_BIN", env!("CARGO_BIN_EXE_payrecon"))
            .env_remove("PAYRECON_CONFIG")
            .env_remove("PAYRECON_DATABASE_URL")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        for (name, value) in env {
            bash.env(name, value);
        }
        let mut bash = bash.spawn().unwrap();
        let stdin = bash.stdin.take().unwrap();
        Tour {
            bash,
            stdin,
            dir: tempfile::tempdir().unwrap(),
            answers: Vec::new(),
            steps: 0,
            replace: replace
                .iter()
                .map(|(from, to)| (from.to_string(), to.to_string()))
                .collect(),
        }
    }

    /// Runs `line` as written (its placeholders filled); checks what its comment shows.
    pub fn step(&mut self, line: &str) {
        let mut command = line
            .replace("cargo run -q --release -- ", "\"$PAYRECON_BIN\" ")
            .replace("cargo run --release -- ", "\"$PAYRECON_BIN\" ");
        if let Some(rest) = command.strip_prefix("payrecon ") {
            command = format!("\"$PAYRECON_BIN\" {rest}");
        }
        for (from, to) in &self.replace {
            command = command.replace(from, to);
        }
        let placeholder = regex::Regex::new(r"<(\w+)>|<intent id>").unwrap();
        let command = placeholder
            .replace_all(&command, |c: &regex::Captures| {
                let key = c.get(1).map_or("id", |key| key.as_str());
                self.answers
                    .iter()
                    .rev()
                    .find_map(|answer| answer.get(key).and_then(Value::as_str))
                    .unwrap_or_else(|| panic!("`{line}`: no earlier answer has {key}"))
                    .to_owned()
            })
            .into_owned();
        let comment = line.split_once(" #").map_or("", |(_, comment)| comment);
        let shown = regex::Regex::new(r#""(\w+)": "([^"]*)""#).unwrap();
        let expected: Vec<(String, String)> = shown
            .captures_iter(comment)
            .map(|c| (c[1].to_owned(), c[2].to_owned()))
            .collect();
        let started = Instant::now();
        loop {
            let (status, out, err) = self.run(&command);
            assert_eq!(status, 0, "`{line}` failed: {err}{out}");
            let answer: Option<Value> = serde_json::from_str(&out).ok();
            let holds = expected
                .iter()
                .all(|(key, value)| answer.as_ref().is_some_and(|a| holds(a, key, value)));
            if holds {
                self.answers.extend(answer);
                return;
            }
            assert!(
                started.elapsed() < ANSWER_BOUND,
                "`{line}` never answered {expected:?}: {out}"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// One command in the session: its exit status, standard output and error.
    fn run(&mut self, command: &str) -> (i32, String, String) {
        self.steps += 1;
        let file = |kind: &str| self.dir.path().join(format!("{}.{kind}", self.steps));
        let (out, err, status) = (file("out"), file("err"), file("status"));
        writeln!(
            self.stdin,
            "{{\n{command}\n}} > {out} 2> {err}; echo $? > {status}.tmp && mv {status}.tmp {status}",
            out = out.display(),
            err = err.display(),
            status = status.display()
        )
        .unwrap();
        self.stdin.flush().unwrap();
        let started = Instant::now();
        while !status.exists() {
            assert!(
                started.elapsed() < ANSWER_BOUND,
                "`{command}` did not finish"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let read = |path: PathBuf| std::fs::read_to_string(path).unwrap_or_default();
        (read(status).trim().parse().unwrap(), read(out), read(err))
    }
}

/// Whether `answer` has `key` with the text `value` anywhere in it (a list of exceptions, an
/// error under `error`).
fn holds(answer: &Value, key: &str, value: &str) -> bool {
    match answer {
        Value::Object(fields) => {
            fields.get(key).and_then(Value::as_str) == Some(value)
                || fields.values().any(|field| holds(field, key, value))
        }
        Value::Array(items) => items.iter().any(|item| holds(item, key, value)),
        _ => false,
    }
}

impl Drop for Tour {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "kill $(jobs -p) 2>/dev/null; wait; exit");
        let _ = self.stdin.flush();
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(30) {
            if self.bash.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.bash.kill();
    }
}
