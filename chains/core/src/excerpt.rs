//! Error texts that quote what could not be read stay small: a node's 400 KiB block, a rate
//! source's HTML page or a webhook receiver's answer would otherwise reach the log, the watcher
//! health, the operators' stuck view and `/metrics` whole, on every retry.

use std::borrow::Cow;

/// The most of a quoted text an error carries.
pub const MAX_EXCERPT_BYTES: usize = 300;

/// The most of its own text a whole error carries, quotes and all: what a watcher logs,
/// stores in its health and shows operators.
pub const MAX_ERROR_BYTES: usize = 1024;

/// `text` when it is short; else its first [`MAX_EXCERPT_BYTES`] (cut at a character
/// boundary) followed by `… (N bytes in all)`. Every error that quotes an answer from outside
/// goes through here.
pub fn excerpt(text: &str) -> Cow<'_, str> {
    excerpt_within(text, MAX_EXCERPT_BYTES)
}

/// [`excerpt`] with another bound: the watcher passes its whole error text through it with
/// [`MAX_ERROR_BYTES`], whatever a scanner built.
pub fn excerpt_within(text: &str, max: usize) -> Cow<'_, str> {
    if text.len() <= max {
        return Cow::Borrowed(text);
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!("{}… ({} bytes in all)", &text[..end], text.len()))
}

/// What an error says of an answer that does not decode: `<who> answered a malformed body
/// (<why>): <the answer>`, both the decoder's complaint (serde quotes a wrong string whole) and
/// the answer cut to excerpts.
pub fn malformed(who: &str, why: &dyn std::fmt::Display, answer: &str) -> String {
    format!(
        "{who} answered a malformed body ({}): {}",
        excerpt(&why.to_string()),
        excerpt(answer)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_texts_pass_and_long_ones_are_cut_with_their_length() {
        assert_eq!(excerpt("missing field `value`"), "missing field `value`");
        let long = "é".repeat(1 << 19);
        let cut = excerpt(&long);
        assert!(cut.len() <= MAX_EXCERPT_BYTES + 40, "{}", cut.len());
        assert!(cut.ends_with(&format!("… ({} bytes in all)", 1 << 20)));
    }
}
