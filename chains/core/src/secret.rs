//! Credentials from configuration, which nothing but the client that uses them ever reads: a
//! plain [`Secret`] (a password, an API key, a token) and a URL that may carry one.
//!
//! Providers put keys everywhere a URL has room: `user:password@` (a node's RPC), the path
//! (`/v3/<key>` at Infura, `/v2/<key>` at Alchemy), the query (`?api-key=` at Helius,
//! `x_cg_pro_api_key=` at CoinGecko). So a [`SecretUrl`] prints (`Display`, `Debug`) with every
//! one of those hidden, and [`SecretUrl::scrub`] takes them out of any text a library wrote
//! about it (an HTTP client's error names the URL it failed to reach) before that text reaches
//! a log, a stored health row or an API answer.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// What stands in for a hidden part.
const HIDDEN: &str = "***";

/// Parts shorter than this are not searched for in [`SecretUrl::scrub`]: replacing every `1`
/// or `ab` in a message would garble it, and a credential that short guards nothing.
const MIN_SCRUBBED_LEN: usize = 4;

/// A URL whose credentials never print. [`SecretUrl::expose`] is for the one place that
/// connects.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct SecretUrl(String);

impl SecretUrl {
    /// Wraps `raw` as it was configured.
    pub fn new(raw: impl Into<String>) -> SecretUrl {
        SecretUrl(raw.into())
    }

    /// The URL with its credentials, for the client that connects with it and nothing else.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether nothing was configured.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The scheme (`http`, `ws`, `tcp`, …), lowercased; empty when there is none.
    pub fn scheme(&self) -> String {
        self.0
            .split_once("://")
            .map(|(scheme, _)| scheme.to_ascii_lowercase())
            .unwrap_or_default()
    }

    /// The URL as it may be shown: scheme, host and port, the plain words of the path, and the
    /// names of the query's parameters; userinfo, every other path segment, query values and
    /// the fragment become `***`.
    pub fn redacted(&self) -> String {
        let parts = Parts::of(&self.0);
        let mut shown = String::with_capacity(self.0.len());
        if let Some(scheme) = parts.scheme {
            shown.push_str(scheme);
            shown.push_str("://");
        }
        if parts.userinfo.is_some() {
            shown.push_str(HIDDEN);
            shown.push('@');
        }
        shown.push_str(parts.host);
        for segment in parts.path_segments() {
            shown.push('/');
            shown.push_str(if self.is_shown(segment) {
                segment
            } else {
                HIDDEN
            });
        }
        if let Some(query) = parts.query {
            shown.push('?');
            let pairs: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((name, _)) => format!("{name}={HIDDEN}"),
                    None => HIDDEN.to_owned(),
                })
                .collect();
            shown.push_str(&pairs.join("&"));
        }
        if parts.fragment.is_some() {
            shown.push('#');
            shown.push_str(HIDDEN);
        }
        shown
    }

    /// `text` with this URL, and each credential in it, replaced by what [`Self::redacted`]
    /// shows: for error texts that libraries wrote with the URL in them, in whatever form
    /// (normalised, percent-decoded parts, a path alone).
    pub fn scrub(&self, text: &str) -> String {
        let mut clean = text.replace(&self.0, &self.redacted());
        for secret in self.secrets() {
            if secret.len() >= MIN_SCRUBBED_LEN {
                clean = clean.replace(secret, HIDDEN);
            }
        }
        clean
    }

    /// Whether a path segment is shown: a database file's path is no credential, any other
    /// segment only when it is plain.
    fn is_shown(&self, segment: &str) -> bool {
        self.0.starts_with("sqlite:") || is_plain_segment(segment)
    }

    /// The parts [`Self::redacted`] hides, longest first (so a part that contains another is
    /// replaced whole).
    fn secrets(&self) -> Vec<&str> {
        let parts = Parts::of(&self.0);
        let mut secrets = Vec::new();
        if let Some(userinfo) = parts.userinfo {
            secrets.push(userinfo);
            secrets.extend(userinfo.split(':'));
        }
        secrets.extend(parts.path_segments().filter(|s| !self.is_shown(s)));
        if let Some(query) = parts.query {
            secrets.push(query);
            secrets.extend(
                query
                    .split('&')
                    .map(|pair| pair.split_once('=').map_or(pair, |(_, value)| value)),
            );
        }
        secrets.extend(parts.fragment);
        secrets.retain(|s| !s.is_empty());
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        secrets
    }
}

/// A path segment shown as it is: a lowercase word (`rpc`, `jsonrpc`, `ext`), an API version
/// (`v1`, `v3`) or a short number. Anything else (mixed case, digits and letters, long) may be
/// a key.
fn is_plain_segment(segment: &str) -> bool {
    let word = (1..=24).contains(&segment.len())
        && segment.starts_with(|c: char| c.is_ascii_lowercase())
        && segment
            .chars()
            .all(|c| c.is_ascii_lowercase() || matches!(c, '-' | '_' | '.'));
    let version = segment.len() <= 3
        && segment.starts_with('v')
        && segment.len() > 1
        && segment[1..].chars().all(|c| c.is_ascii_digit());
    let number = (1..=6).contains(&segment.len()) && segment.chars().all(|c| c.is_ascii_digit());
    word || version || number
}

/// A URL cut at its delimiters, without checking it further: what is shown must never depend
/// on the URL being valid.
struct Parts<'a> {
    scheme: Option<&'a str>,
    userinfo: Option<&'a str>,
    host: &'a str,
    path: &'a str,
    query: Option<&'a str>,
    fragment: Option<&'a str>,
}

impl<'a> Parts<'a> {
    fn of(raw: &'a str) -> Parts<'a> {
        let (raw, fragment) = match raw.split_once('#') {
            Some((rest, fragment)) => (rest, Some(fragment)),
            None => (raw, None),
        };
        let (raw, query) = match raw.split_once('?') {
            Some((rest, query)) => (rest, Some(query)),
            None => (raw, None),
        };
        let (scheme, rest) = match raw.split_once("://") {
            Some((scheme, rest)) => (Some(scheme), rest),
            None => (None, raw),
        };
        let (authority, path) = match rest.find('/') {
            Some(at) => rest.split_at(at),
            None => (rest, ""),
        };
        let (userinfo, host) = match authority.rsplit_once('@') {
            Some((userinfo, host)) => (Some(userinfo), host),
            None => (None, authority),
        };
        Parts {
            scheme,
            userinfo,
            host,
            path,
            query,
            fragment,
        }
    }

    fn path_segments(&self) -> impl Iterator<Item = &'a str> {
        let path = self.path.strip_prefix('/').unwrap_or(self.path);
        path.split('/').filter(|s| !s.is_empty())
    }
}

/// A credential (a password, an API key, a bearer token): it prints as `***`, whole.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct Secret(String);

impl Secret {
    /// Wraps `raw` as it was configured.
    pub fn new(raw: impl Into<String>) -> Secret {
        Secret(raw.into())
    }

    /// The credential, for the client that sends it and nothing else.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(HIDDEN)
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret({HIDDEN:?})")
    }
}

impl From<&str> for Secret {
    fn from(raw: &str) -> Secret {
        Secret::new(raw)
    }
}

impl From<String> for Secret {
    fn from(raw: String) -> Secret {
        Secret::new(raw)
    }
}

/// Written as configured, like [`SecretUrl`].
impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Secret, D::Error> {
        String::deserialize(deserializer).map(Secret)
    }
}

impl fmt::Display for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl fmt::Debug for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretUrl({:?})", self.redacted())
    }
}

impl From<&str> for SecretUrl {
    fn from(raw: &str) -> SecretUrl {
        SecretUrl::new(raw)
    }
}

impl From<String> for SecretUrl {
    fn from(raw: String) -> SecretUrl {
        SecretUrl::new(raw)
    }
}

/// Written as configured, so a configuration read and written again keeps working; nothing
/// that answers a caller serialises configuration.
impl Serialize for SecretUrl {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for SecretUrl {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<SecretUrl, D::Error> {
        String::deserialize(deserializer).map(SecretUrl)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_place_a_provider_puts_a_key_is_hidden() {
        let cases = [
            (
                "http://127.0.0.1:1/v3/SECRETKEY4711",
                "http://127.0.0.1:1/v3/***",
            ),
            (
                "https://eth-mainnet.g.alchemy.com/v2/aB3dEf9hIjKlMnOp",
                "https://eth-mainnet.g.alchemy.com/v2/***",
            ),
            (
                "https://mainnet.helius-rpc.com/?api-key=0123-abcd",
                "https://mainnet.helius-rpc.com?api-key=***",
            ),
            (
                "http://rpcuser:hunter22@127.0.0.1:8332",
                "http://***@127.0.0.1:8332",
            ),
            (
                "https://api.avax.network/ext/bc/C/rpc",
                "https://api.avax.network/ext/bc/***/rpc",
            ),
            ("tcp://127.0.0.1:50001", "tcp://127.0.0.1:50001"),
            (
                "postgres://payrecon:pw-4711@db.internal/payrecon?sslmode=require",
                "postgres://***@db.internal/payrecon?sslmode=***",
            ),
            (
                "sqlite:///var/lib/payrecon/Shop2026.db",
                "sqlite:///var/lib/payrecon/Shop2026.db",
            ),
            ("sqlite:payrecon.db", "sqlite:payrecon.db"),
            ("https://api.trongrid.io", "https://api.trongrid.io"),
            (
                "https://x.example/rpc#token=abc",
                "https://x.example/rpc#***",
            ),
        ];
        for (raw, shown) in cases {
            let url = SecretUrl::new(raw);
            assert_eq!(url.to_string(), shown, "{raw}");
            assert_eq!(format!("{url:?}"), format!("SecretUrl({shown:?})"));
        }
    }

    #[test]
    fn scrub_takes_the_url_and_its_parts_out_of_any_text() {
        let url = SecretUrl::new("http://127.0.0.1:1/v3/SECRETKEY4711?key=q9q9q9");
        let error = "error sending request for url (http://127.0.0.1:1/v3/SECRETKEY4711?key=q9q9q9): \
                     connection refused; path /v3/SECRETKEY4711 and q9q9q9 again";
        let clean = url.scrub(error);
        assert!(!clean.contains("SECRETKEY4711"), "{clean}");
        assert!(!clean.contains("q9q9q9"), "{clean}");
        assert!(
            clean.contains("http://127.0.0.1:1/v3/***?key=***"),
            "{clean}"
        );
    }

    #[test]
    fn a_secret_never_prints() {
        let secret = Secret::new("hunter22-api-key");
        assert_eq!(format!("{secret} {secret:?}"), "*** Secret(\"***\")");
        assert_eq!(secret.expose(), "hunter22-api-key");
    }

    #[test]
    fn short_parts_are_not_searched_for() {
        let url = SecretUrl::new("http://u:p@127.0.0.1:1/");
        assert_eq!(url.scrub("height 1, user u"), "height 1, user u");
        assert_eq!(
            url.scrub("at http://u:p@127.0.0.1:1/"),
            "at http://***@127.0.0.1:1"
        );
    }
}
