//! Bearer tokens of the HTTP API. A token is shown once, when it is made; the database keeps
//! only its SHA-256, so a copy of the database opens nothing.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::engine::Engine;
use crate::error::Error;
use crate::store::operations;

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
fn fresh_token() -> String {
    format!(
        "prt_{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

fn digest(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

impl Engine {
    /// Makes a token for `name` with `role` and returns it: the only time it is visible.
    pub async fn create_api_token(&self, name: &str, role: Role) -> Result<String, Error> {
        if name.is_empty()
            || name.len() > 64
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.@".contains(c))
        {
            return Err(Error::InvalidInput(
                "token name must be 1 to 64 of A-Z a-z 0-9 - _ . @".into(),
            ));
        }
        let token = fresh_token();
        let mut tx = self.db().begin_write().await?;
        if !operations::insert_token(
            tx.conn(),
            &digest(&token),
            name,
            role.as_str(),
            self.clock().now(),
        )
        .await?
        {
            return Err(Error::InvalidInput(format!("a token named {name} exists")));
        }
        tx.commit().await?;
        Ok(token)
    }

    /// Revokes the token named `name`; false if there was none live.
    pub async fn revoke_api_token(&self, name: &str) -> Result<bool, Error> {
        let mut tx = self.db().begin_write().await?;
        let revoked = operations::revoke_token(tx.conn(), name, self.clock().now()).await?;
        tx.commit().await?;
        Ok(revoked)
    }

    /// The caller `token` identifies, if it is live.
    pub async fn authenticate(&self, token: &str) -> Result<Option<Caller>, Error> {
        if !token.starts_with("prt_") || token.len() != 68 {
            return Ok(None);
        }
        let mut conn = self.db().pool().acquire().await?;
        let Some((name, role)) = operations::token_by_hash(&mut conn, &digest(token)).await? else {
            return Ok(None);
        };
        Ok(Some(Caller {
            name,
            role: role.parse()?,
        }))
    }
}
