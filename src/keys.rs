//! The account keys a network derives its addresses from, as the merchant's wallet sees them.
//!
//! A key that handed out an address is never forgotten: when the configured key changes, the
//! old one is retired, and its open intents, funded addresses and look-ahead window stay
//! watched and exported. Each key has its own counter, and each is watched `lookahead`
//! addresses past it (BIP44's gap limit), so money paid to an address that a database since
//! restored from a backup had handed out is found, and that address is never handed out again.

use std::collections::BTreeMap;
use std::sync::Arc;

use payrecon_chain_bitcoin::{KeyOrigin, UtxoNetwork, WalletDescriptors, descriptors, origin_text};
use payrecon_chain_core::{AccountXpub, AddressDeriver, DeriveError, Network};
use serde::Serialize;

use crate::config::MAX_LOOKAHEAD;

/// A Bitcoin or Litecoin account as the merchant's wallet must see it.
#[derive(Clone, Debug)]
pub struct UtxoWallet {
    /// The account key payrecon derives from.
    pub account: AccountXpub,
    /// Mainnet, testnet or regtest: decides how the key is written.
    pub network: UtxoNetwork,
    /// Where the key sits below the wallet's master key, when configured.
    pub origin: Option<KeyOrigin>,
    /// The stuck view warns when the needed gap limit passes this.
    pub gap_limit_warning: u32,
}

impl UtxoWallet {
    /// The account's receive and change descriptors; an origin that cannot be this key's is
    /// refused.
    pub fn descriptors(&self) -> Result<WalletDescriptors, DeriveError> {
        descriptors(&self.account, self.network, self.origin.as_ref())
    }

    /// The path of receive address `index`, for people: the origin's path when configured,
    /// else the account written as the key itself.
    pub fn receive_path(&self, index: i64) -> String {
        match &self.origin {
            Some(origin) => format!("{}/0/{index}", origin_text(origin)),
            None => format!("[account]/0/{index}"),
        }
    }
}

/// The Bitcoin-family wallets of the configured networks.
pub type UtxoWallets = BTreeMap<Network, UtxoWallet>;

/// One account key of a derived-key network (Bitcoin, Litecoin, Ethereum, Tron).
#[derive(Clone, Debug)]
pub struct AccountKey {
    /// Names the key and its counter: `<chain>:<fingerprint>`.
    pub key_id: String,
    /// The extended public key, as configured.
    pub account_key: String,
    /// `[fingerprint/path]` of a Bitcoin-family key, when configured.
    pub key_origin: Option<String>,
    /// Derives its addresses.
    pub deriver: Arc<dyn AddressDeriver>,
    /// Bitcoin and Litecoin: the account as a wallet imports it.
    pub wallet: Option<UtxoWallet>,
}

/// A derived-key network's keys and how far ahead of each counter its watcher looks.
#[derive(Clone, Debug)]
pub struct NetworkKeys {
    /// Addresses watched past each key's counter.
    pub lookahead: u32,
    /// The configured key: new intents take their addresses from it.
    pub current: AccountKey,
    /// Keys configured before: watched and exported, never handing out again.
    pub retired: Vec<AccountKey>,
}

impl NetworkKeys {
    /// The current key, then the retired ones.
    pub fn all(&self) -> impl Iterator<Item = &AccountKey> {
        std::iter::once(&self.current).chain(&self.retired)
    }

    /// The key named `key_id`.
    pub fn get(&self, key_id: &str) -> Option<&AccountKey> {
        self.all().find(|key| key.key_id == key_id)
    }
}

/// Whether a key hands out new addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyState {
    /// The configured key.
    Current,
    /// Replaced by another; its addresses stay watched.
    Retired,
}

impl KeyState {
    /// `current` or `retired`, as the JSON says it.
    pub fn as_str(self) -> &'static str {
        match self {
            KeyState::Current => "current",
            KeyState::Retired => "retired",
        }
    }
}

/// A key's counter as a restore moved it: the indexes from `counter_before` up to
/// `counter_after` are never handed out, and stay watched for a monitoring window.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CounterMoved {
    /// The account key (`<chain>:<fingerprint>`).
    pub key_id: String,
    /// The next index the restored database would have handed out.
    pub counter_before: u32,
    /// The next index it hands out now.
    pub counter_after: u32,
}

/// Refuses a look-ahead no watcher could follow.
pub(crate) fn check_lookahead(network: Network, lookahead: u32) -> Result<(), crate::Error> {
    if lookahead > MAX_LOOKAHEAD {
        return Err(crate::Error::Config(format!(
            "networks.{network}.lookahead = {lookahead}: at most {MAX_LOOKAHEAD} addresses are watched ahead of a key"
        )));
    }
    Ok(())
}

/// How long a new intent waits for its network's watcher to look ahead after a start, before
/// it is refused as [`crate::Error::CatchingUp`].
pub(crate) const HANDOUT_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Holds back new addresses of a network from its watcher's start until a round of it found
/// nothing ahead of the counters and was caught up with the chain: an address a database since
/// restored from a backup handed out, and that was paid, is then known before the counter could
/// hand it out again.
#[derive(Debug, Default)]
pub(crate) struct HandoutGate {
    closed: std::sync::Mutex<std::collections::BTreeSet<Network>>,
    opened: tokio::sync::Notify,
}

impl HandoutGate {
    /// New addresses of `network` wait from now on.
    pub(crate) fn close(&self, network: Network) {
        self.closed.lock().expect("never poisoned").insert(network);
    }

    /// New addresses of `network` are handed out again.
    pub(crate) fn open(&self, network: Network) {
        if self.closed.lock().expect("never poisoned").remove(&network) {
            self.opened.notify_waiters();
        }
    }

    /// Waits until `network` is open, at most `limit`.
    pub(crate) async fn wait(
        &self,
        network: Network,
        limit: std::time::Duration,
    ) -> Result<(), crate::Error> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            // Registered before the check, so an opening in between is not missed.
            let opened = self.opened.notified();
            if !self
                .closed
                .lock()
                .expect("never poisoned")
                .contains(&network)
            {
                return Ok(());
            }
            if tokio::time::timeout_at(deadline, opened).await.is_err() {
                return Err(crate::Error::CatchingUp(network));
            }
        }
    }
}
