//! Bearer tokens of the HTTP API. A token is shown once, when it is made; the database keeps
//! only its SHA-256, so a copy of the database opens nothing.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::Error;

/// Who a token speaks for; each role reaches only its own endpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The shop backend: orders, top-ups, payment instructions, balances.
    Shop,
    /// Finance staff: reconciliation reports and the trial balance.
    Finance,
    /// Operators: stuck payments, exceptions and their resolution, webhook replays.
    Operator,
}

impl Role {
    /// Every role's name, as the CLI takes it.
    pub const NAMES: [&'static str; 3] = ["shop", "finance", "operator"];

    /// As stored.
    pub const fn as_str(self) -> &'static str {
        match self {
            Role::Shop => "shop",
            Role::Finance => "finance",
            Role::Operator => "operator",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = Error;
    fn from_str(s: &str) -> Result<Role, Error> {
        [Role::Shop, Role::Finance, Role::Operator]
            .into_iter()
            .find(|role| role.as_str() == s)
            .ok_or_else(|| Error::InvalidInput(format!("unknown role {s:?}")))
    }
}

/// The caller a valid token identifies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    /// The token's name: who acted, in the audit log.
    pub name: String,
    /// What it may do.
    pub role: Role,
}

/// A new token: `prt_` and 64 hex digits (256 random bits).
pub(crate) fn fresh_token() -> String {
    format!(
        "prt_{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

pub(crate) fn digest(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}
