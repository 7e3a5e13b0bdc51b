//! The `payrecon` commands the guides show, for the tests that check each one against the
//! parser that reads it: this binary's for every command, the bench's for what follows
//! `payrecon bench` (that crate includes this file, so both read the guides one way).

use std::path::{Path, PathBuf};
use std::sync::LazyLock;

use regex::Regex;

/// One command a guide shows.
#[derive(Debug)]
pub struct DocumentedCommand {
    /// `docs/shop.md:81`, for the failure message.
    pub place: String,
    /// The arguments after the command word, as a shell would split them.
    pub args: Vec<String>,
    /// Written in a fenced block, to be run as it stands; otherwise mentioned in a sentence
    /// (`payrecon refund sent`, `payrecon bench ledger [--entries N]`), where the
    /// subcommands and options it names must exist and an option that takes a value shows one.
    pub runnable: bool,
}

/// Every command in a fenced block (of any language) of README.md and of each Markdown file
/// under `root`'s docs/: run directly, through a path (`target/release/payrecon`), through
/// `sudo -u payrecon` or through `cargo run … --`. Placeholders (`<intent id>`) and command
/// substitutions become a plain word; pipes, redirections, `&` and comments end the command.
pub fn documented_commands(root: &Path) -> Vec<DocumentedCommand> {
    let mut docs = vec![root.join("README.md")];
    docs.extend(markdown_under(&root.join("docs")));
    let mut found = Vec::new();
    for doc in docs {
        let text = std::fs::read_to_string(&doc).expect("a guide is readable");
        let name = doc.strip_prefix(root).unwrap_or(&doc).display().to_string();
        for (line_number, line) in fenced_lines(&text) {
            for args in commands_in(&line) {
                let args = shlex::split(&args)
                    .unwrap_or_else(|| panic!("{name}:{line_number}: unbalanced quotes: {line}"));
                found.push(DocumentedCommand {
                    place: format!("{name}:{line_number}"),
                    args,
                    runnable: true,
                });
            }
        }
        for (line_number, span) in mentions(&text) {
            found.push(DocumentedCommand {
                place: format!("{name}:{line_number}"),
                args: synopsis_words(&span),
                runnable: false,
            });
        }
    }
    found
}

/// The Markdown files in `dir` and its folders, in order.
fn markdown_under(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).expect("the folder is readable") {
        let path = entry.expect("the folder lists").path();
        if path.is_dir() {
            found.extend(markdown_under(&path));
        } else if path.extension().is_some_and(|ext| ext == "md") {
            found.push(path);
        }
    }
    found.sort();
    found
}

/// The code spans outside fenced blocks that start with `payrecon `, with their line numbers.
fn mentions(text: &str) -> Vec<(usize, String)> {
    static SPAN: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r"`payrecon\s([^`]*)`").expect("the pattern compiles"));
    // The prose, each line of a fenced block (and each fence) blanked, so that a span may run
    // over a line break and still be numbered by its first line.
    let prose: String = parts(text)
        .map(|(_, line, part)| match part {
            Part::Prose => format!("{line}\n"),
            Part::Fence | Part::Code => "\n".to_owned(),
        })
        .collect();
    SPAN.captures_iter(&prose)
        .map(|found| {
            let line_number = prose[..found.get(0).expect("matched").start()]
                .lines()
                .count()
                .max(1);
            (line_number, found[1].replace('\n', " "))
        })
        .collect()
}

/// A sentence's synopsis as words: `[--entries N]` as `--entries N`, `shop|finance` as `shop`,
/// `<workload>` and `…` kept: where a subcommand goes they stand for any.
fn synopsis_words(span: &str) -> Vec<String> {
    span.replace(['[', ']'], " ")
        .split_whitespace()
        .map(|word| word.split('|').next().unwrap_or(word).to_owned())
        .collect()
}

/// What is wrong with a mention of `words` to `command` (built, so that its global options
/// are on each subcommand): a subcommand or option it does not have, an option that takes a
/// value shown without one, or, when it shows options at all (a synopsis), a required option
/// it leaves out. Stops at a subcommand whose arguments go to another program, or at a
/// `<placeholder>` or `…` where a subcommand goes.
fn mention_error(command: &clap::Command, words: &[String]) -> Option<String> {
    let mut current = command;
    let mut shown: Vec<clap::Id> = Vec::new();
    let mut words = words.iter().peekable();
    while let Some(word) = words.next() {
        if current
            .get_arguments()
            .any(clap::Arg::is_trailing_var_arg_set)
        {
            return None;
        }
        if let Some(long) = word.strip_prefix("--") {
            let (name, value) = match long.split_once('=') {
                Some((name, value)) => (name, Some(value)),
                None => (long, None),
            };
            let Some(arg) = current
                .get_arguments()
                .find(|arg| arg.get_long() == Some(name))
            else {
                return Some(format!("`{}` has no option `--{name}`", current.get_name()));
            };
            shown.push(arg.get_id().clone());
            if arg.get_action().takes_values() && value.is_none() {
                match words.peek() {
                    Some(next) if !next.starts_with("--") => {
                        words.next();
                    }
                    _ => return Some(format!("`--{name}` takes a value and is shown without one")),
                }
            }
        } else if current.has_subcommands() {
            if word.starts_with('<') || word == "…" {
                return None;
            }
            match current.find_subcommand(word) {
                Some(sub) => current = sub,
                None => {
                    return Some(format!(
                        "`{}` has no subcommand `{word}`",
                        current.get_name()
                    ));
                }
            }
        }
    }
    let left_out = current
        .get_arguments()
        .filter(|arg| arg.is_required_set() && arg.get_long().is_some())
        .find(|arg| !shown.contains(arg.get_id()));
    match left_out {
        Some(arg) if !shown.is_empty() => Some(format!(
            "`--{}` is required and the synopsis leaves it out",
            arg.get_long().unwrap_or_default()
        )),
        _ => None,
    }
}

/// Each of `commands` that `P` (the program `name`) refuses, as its guide shows it with the
/// reason: a command to run must parse; a mention must name what exists ([`mention_error`]).
pub fn refusals<P: clap::Parser>(name: &str, commands: &[DocumentedCommand]) -> Vec<String> {
    let mut parser = P::command();
    parser.build();
    commands
        .iter()
        .filter_map(|command| {
            let reason = if command.runnable {
                let words = std::iter::once(name).chain(command.args.iter().map(String::as_str));
                let refused = P::try_parse_from(words).err()?.render().to_string();
                refused.lines().next().unwrap_or_default().to_owned()
            } else {
                mention_error(&parser, &command.args)?
            };
            Some(format!(
                "{}: `{name} {}`: {reason}",
                command.place,
                command.args.join(" ")
            ))
        })
        .collect()
}

/// What a line of Markdown is, for the two readings of a guide.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Part {
    Prose,
    /// A line that opens or closes a fenced block.
    Fence,
    /// A line inside a fenced block.
    Code,
}

/// Each line of `text` with its number (from 1) and what it is.
fn parts(text: &str) -> impl Iterator<Item = (usize, &str, Part)> {
    let mut fence: Option<&str> = None;
    text.lines().enumerate().map(move |(index, line)| {
        let trimmed = line.trim_start();
        let part = match fence {
            None if trimmed.starts_with("```") || trimmed.starts_with("~~~") => {
                fence = Some(&trimmed[..3]);
                Part::Fence
            }
            None => Part::Prose,
            Some(marker) if trimmed.starts_with(marker) => {
                fence = None;
                Part::Fence
            }
            Some(_) => Part::Code,
        };
        (index + 1, line, part)
    })
}

/// The lines inside fenced blocks with their line numbers, a line continued by `\` joined to
/// the next.
fn fenced_lines(text: &str) -> Vec<(usize, String)> {
    let mut lines = Vec::new();
    let mut pending: Option<(usize, String)> = None;
    for (number, line, _) in parts(text).filter(|(_, _, part)| *part == Part::Code) {
        let (number, mut joined) = pending.take().unwrap_or((number, String::new()));
        match line.strip_suffix('\\') {
            Some(start) => {
                joined.push_str(start);
                pending = Some((number, joined));
            }
            None => {
                joined.push_str(line);
                lines.push((number, joined));
            }
        }
    }
    lines
}

/// The argument text of each payrecon command on one shell line: the command word where a
/// shell reads a command (a line's start, after `$ `, `$(`, a pipe, `;`, `&&`, `# or:`,
/// variable assignments or `sudo -u <user>`), not `journalctl -u payrecon` or prose.
fn commands_in(line: &str) -> Vec<String> {
    static COMMAND: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(
            r"(?:^|[\s(])((?:\S*/)?payrecon|cargo run(?: -q)?(?: --release)?(?: -p payrecon)? --)\s+(--|[a-z])",
        )
        .expect("the pattern compiles")
    });
    static COMMAND_POSITION: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r"(?:^|[(|;&:$])\s*(?:[A-Z_]+=\S*\s+)*(?:sudo(?:\s+-u\s+\S+)?\s+)?$")
            .expect("the pattern compiles")
    });
    static PLACEHOLDER: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r"<[^<>]*>").expect("the pattern compiles"));
    static SUBSTITUTION: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r"\$\([^()]*\)").expect("the pattern compiles"));
    let line = PLACEHOLDER.replace_all(line, "1");
    let mut commands = Vec::new();
    let mut from = 0;
    while let Some(found) = COMMAND.captures_at(&line, from) {
        let (word, args) = (&found[1], found.get(2).expect("always captured"));
        let before = &line[..found.get(1).expect("always captured").start()];
        from = args.start();
        if word.ends_with("payrecon") && !COMMAND_POSITION.is_match(before) {
            continue;
        }
        let words = shell_words_end(&line[args.start()..]);
        from += words.len();
        commands.push(SUBSTITUTION.replace_all(words, "1").into_owned());
    }
    commands
}

/// The text up to the first unquoted pipe, redirection, `&`, `;`, `)` or comment outside a
/// command substitution.
fn shell_words_end(text: &str) -> &str {
    let mut quote = None;
    let (mut previous, mut substitutions) = (' ', 0);
    for (at, c) in text.char_indices() {
        match (quote, c) {
            (None, '"' | '\'') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            (None, '(') if previous == '$' => substitutions += 1,
            (None, ')') if substitutions > 0 => substitutions -= 1,
            (None, _) if substitutions > 0 => {}
            (None, '|' | '>' | '&' | ';' | ')') => return &text[..at],
            (None, '#') if previous.is_whitespace() => return &text[..at],
            _ => {}
        }
        previous = c;
    }
    text
}
