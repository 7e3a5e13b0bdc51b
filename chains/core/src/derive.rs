//! Watch-only address derivation, shared by the chain crates.
//!
//! payrecon never holds a private key: every secp256k1 chain derives receive addresses from
//! an account-level extended public key (BIP32), non-hardened child `0/<index>`.

use std::str::FromStr;

use bitcoin::bip32::{ChildNumber, Xpub};
use bitcoin::secp256k1::{PublicKey, Secp256k1, VerifyOnly};

use crate::Network;

/// The version bytes of a mainnet `xpub`, which rust-bitcoin parses.
const XPUB_VERSION: [u8; 4] = [0x04, 0x88, 0xB2, 0x1E];
/// The version bytes of a testnet `tpub`.
const TPUB_VERSION: [u8; 4] = [0x04, 0x35, 0x87, 0xCF];

/// SLIP-132 and Litecoin prefixes that carry the same key material as `xpub` / `tpub`.
const MAINNET_ALIASES: [[u8; 4]; 4] = [
    [0x04, 0xB2, 0x47, 0x46], // zpub (BIP84)
    [0x04, 0x9D, 0x7C, 0xB2], // ypub (BIP49)
    [0x01, 0x9D, 0xA4, 0x62], // Ltub (Litecoin)
    [0x04, 0xB2, 0x43, 0x0C], // Zpub
];
const TESTNET_ALIASES: [[u8; 4]; 3] = [
    [0x04, 0x5F, 0x1C, 0xF6], // vpub (BIP84 testnet)
    [0x04, 0x4A, 0x52, 0x62], // upub (BIP49 testnet)
    [0x04, 0x36, 0xF6, 0xE1], // ttub (Litecoin testnet)
];

/// An account-level extended public key: the only key material payrecon is given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccountXpub {
    xpub: Xpub,
    /// The receive chain `…/0`, derived once: each address then costs one child derivation.
    receive_chain: Xpub,
    secp: Secp256k1<VerifyOnly>,
}

impl AccountXpub {
    /// The receive-chain public key at `index` (path `…/0/<index>` below the account).
    pub fn receive_key(&self, index: u32) -> Result<PublicKey, DeriveError> {
        let child = ChildNumber::from_normal_idx(index).map_err(|_| DeriveError::Index(index))?;
        self.receive_chain
            .ckd_pub(&self.secp, child)
            .map(|child| child.public_key)
            .map_err(|e| DeriveError::Derivation(e.to_string()))
    }

    /// The account key itself, for what hands it on (a wallet's output descriptors).
    pub fn xpub(&self) -> &Xpub {
        &self.xpub
    }

    /// A short, stable name for the key, so each key has its own derivation counter.
    pub fn fingerprint(&self) -> String {
        format!("{}", self.xpub.fingerprint())
    }
}

impl FromStr for AccountXpub {
    type Err = DeriveError;

    /// Accepts `xpub`/`tpub` and their SLIP-132 and Litecoin spellings (`zpub`, `vpub`,
    /// `Ltub`, …): rust-bitcoin parses only the first two, so the version is swapped first.
    fn from_str(text: &str) -> Result<AccountXpub, DeriveError> {
        let mut data = bitcoin::base58::decode_check(text.trim())
            .map_err(|_| DeriveError::InvalidXpub("not a base58check extended key"))?;
        if data.len() != 78 {
            return Err(DeriveError::InvalidXpub("wrong length for an extended key"));
        }
        let version: [u8; 4] = data[..4].try_into().expect("length checked");
        let canonical = if version == XPUB_VERSION || MAINNET_ALIASES.contains(&version) {
            XPUB_VERSION
        } else if version == TPUB_VERSION || TESTNET_ALIASES.contains(&version) {
            TPUB_VERSION
        } else {
            return Err(DeriveError::InvalidXpub(
                "not an extended public key (a private key, or an unknown prefix)",
            ));
        };
        data[..4].copy_from_slice(&canonical);
        let xpub = Xpub::decode(&data)
            .map_err(|_| DeriveError::InvalidXpub("malformed extended public key"))?;
        let secp = Secp256k1::verification_only();
        let receive = ChildNumber::from_normal_idx(0).expect("0 is a normal index");
        let receive_chain = xpub
            .ckd_pub(&secp, receive)
            .map_err(|_| DeriveError::InvalidXpub("its receive chain cannot be derived"))?;
        Ok(AccountXpub {
            xpub,
            receive_chain,
            secp,
        })
    }
}

/// The 20-byte account id Ethereum and Tron both derive from a key: the last 20 bytes of
/// keccak256 of the uncompressed public key without its 0x04 prefix.
pub fn evm_account_bytes(key: &PublicKey) -> [u8; 20] {
    use sha3::{Digest, Keccak256};
    let uncompressed = key.serialize_uncompressed();
    let hash = Keccak256::digest(&uncompressed[1..]);
    hash[12..].try_into().expect("32-byte hash")
}

/// One freshly derived receive address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DerivedAddress {
    /// What the customer pays to; for Solana Pay the merchant recipient.
    pub address: String,
    /// What the watcher looks for: the address itself, or for Solana Pay the reference key.
    pub watch_key: String,
}

/// Turns a derivation index into a receive address for one network, from public keys only.
pub trait AddressDeriver: Send + Sync + std::fmt::Debug {
    /// The network whose addresses it makes.
    fn network(&self) -> Network;
    /// Names the key material, so that a new key starts its own index counter.
    fn key_id(&self) -> String;
    /// The address for `index`. Each index is used once; the engine reserves it.
    fn derive(&self, index: u32) -> Result<DerivedAddress, DeriveError>;
    /// A hint that indexes `from..from + count` come next: a deriver may derive them now,
    /// off the path a caller waits on ([`Lookahead`]).
    fn derive_ahead(&self, from: u32, count: u32) {
        let _ = (from, count);
    }
}

/// Addresses a [`Lookahead`] keeps derived ahead at most.
pub const MAX_DERIVED_AHEAD: usize = 4096;

/// A deriver that derives ahead. While one group of intents commits (the disk syncing), the
/// addresses the next group will take are derived on another thread, so the elliptic-curve
/// work leaves the path an intent waits on. An address is handed out once and then forgotten;
/// an index asked for again (its first intent was refused) is derived again.
#[derive(Debug)]
pub struct Lookahead {
    inner: std::sync::Arc<dyn AddressDeriver>,
    ready: std::sync::Mutex<std::collections::BTreeMap<u32, DerivedAddress>>,
}

impl Lookahead {
    /// Derives ahead for `inner`.
    pub fn new(inner: std::sync::Arc<dyn AddressDeriver>) -> Lookahead {
        Lookahead {
            inner,
            ready: Default::default(),
        }
    }
}

impl AddressDeriver for Lookahead {
    fn network(&self) -> Network {
        self.inner.network()
    }

    fn key_id(&self) -> String {
        self.inner.key_id()
    }

    fn derive(&self, index: u32) -> Result<DerivedAddress, DeriveError> {
        let ready = self.ready.lock().expect("never poisoned").remove(&index);
        match ready {
            Some(address) => Ok(address),
            None => self.inner.derive(index),
        }
    }

    fn derive_ahead(&self, from: u32, count: u32) {
        let until = from.saturating_add(count.min(MAX_DERIVED_AHEAD as u32));
        for index in from..until {
            if self
                .ready
                .lock()
                .expect("never poisoned")
                .contains_key(&index)
            {
                continue;
            }
            // A failure is not an answer to anyone: derive() meets it again when asked.
            let Ok(address) = self.inner.derive(index) else {
                return;
            };
            let mut ready = self.ready.lock().expect("never poisoned");
            ready.insert(index, address);
            // Indexes below `from` were handed out already; keep the newest within bounds.
            *ready = ready.split_off(&from);
            while ready.len() > MAX_DERIVED_AHEAD {
                ready.pop_last();
            }
        }
    }
}

/// Why an address could not be derived.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeriveError {
    /// The configured key is not a usable extended public key.
    #[error("invalid extended public key: {0}")]
    InvalidXpub(&'static str),
    /// A hardened or out-of-range index.
    #[error("derivation index {0} is out of range")]
    Index(u32),
    /// The key library refused.
    #[error("derivation failed: {0}")]
    Derivation(String),
    /// Other configuration (recipient, network parameters) is invalid.
    #[error("invalid configuration: {0}")]
    Config(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hands out the index itself as the address, and counts its derivations.
    #[derive(Debug, Default)]
    struct Counting(std::sync::atomic::AtomicUsize);

    impl AddressDeriver for Counting {
        fn network(&self) -> Network {
            Network::Bitcoin
        }
        fn key_id(&self) -> String {
            "counting".into()
        }
        fn derive(&self, index: u32) -> Result<DerivedAddress, DeriveError> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(DerivedAddress {
                address: index.to_string(),
                watch_key: index.to_string(),
            })
        }
    }

    #[test]
    fn a_lookahead_hands_out_what_its_deriver_would() {
        let counting = std::sync::Arc::new(Counting::default());
        let lookahead = Lookahead::new(counting.clone());
        lookahead.derive_ahead(10, 5);
        assert_eq!(counting.0.load(std::sync::atomic::Ordering::SeqCst), 5);
        for index in 8..16 {
            assert_eq!(lookahead.derive(index).unwrap().address, index.to_string());
        }
        // 8, 9 and 15 were not ready; an index asked for again is derived again.
        assert_eq!(counting.0.load(std::sync::atomic::Ordering::SeqCst), 8);
        assert_eq!(lookahead.derive(12).unwrap().address, "12");
        assert_eq!(counting.0.load(std::sync::atomic::Ordering::SeqCst), 9);
    }

    proptest::proptest! {
        #[test]
        fn any_text_is_an_xpub_or_refused(text in ".{0,120}|[1-9A-HJ-NP-Za-km-z]{100,120}") {
            let _ = text.parse::<AccountXpub>();
        }

        /// A mistyped key (one character changed) never parses as some other key.
        #[test]
        fn a_changed_character_is_refused(at in 0..111usize, to in "[1-9A-HJ-NP-Za-km-z]") {
            let key = crate::test_vectors::BIP84_ZPUB;
            let mut changed = key.to_owned();
            changed.replace_range(at..at + 1, &to);
            proptest::prop_assume!(changed != key);
            proptest::prop_assert!(changed.parse::<AccountXpub>().is_err());
        }
    }

    #[test]
    fn refuses_what_is_not_an_account_xpub() {
        assert!(matches!(
            "zpub-not-base58".parse::<AccountXpub>(),
            Err(DeriveError::InvalidXpub(_))
        ));
        // BIP32 test vector 1's master private key: a private key is refused, not used.
        let xprv = "xprv9s21ZrQH143K3QTDL4LXw2F7HEK3wJUD2nW2nRk4stbPy6cq3jPPqjiChkVvvNKmPGJxWUtg6LnF5kejMRNNU3TGtRBeJgk33yuGBxrMPHi";
        assert!(matches!(
            xprv.parse::<AccountXpub>(),
            Err(DeriveError::InvalidXpub(_))
        ));
    }
}
